"""A combo: a named virtual model, a strategy over targets with a config (SPEC §8).

Its own module because building one checks the strategy name and its options against the
strategy registry, which itself builds on the targets of :mod:`fairgate.routing.model`:
model ← registry ← combo, one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fairgate.routing.model import (
    QTSD_PREFIX,
    ComboConfig,
    Target,
    _as_mapping,
    _as_str,
    _target_of,
    normalize_key,
)
from fairgate.routing.registry import resolve_strategy, validate_options

__all__ = ["Combo"]


@dataclass(frozen=True, slots=True)
class Combo:
    """A named virtual model: ``strategy`` over ``targets`` with ``config``.

    ``internal`` combos are minted by the system (``qtSd/<pool>/<model>`` for quota-share) and
    are the only ones allowed the ``quota-share`` strategy and the ``qtSd/`` prefix. Strategy
    aliases are resolved here (``weighted-sticky`` → ``weighted`` + ``sticky: true``), so
    ``strategy`` is always a canonical registry name afterwards.
    """

    name: str
    strategy: str
    targets: tuple[Target, ...]
    config: ComboConfig = field(default_factory=ComboConfig)
    internal: bool = False

    def __post_init__(self) -> None:
        name = self.name.strip() if isinstance(self.name, str) else ""
        if not name:
            raise ValueError("combo name must not be empty")
        if name.startswith(QTSD_PREFIX) and not self.internal:
            raise ValueError(
                f"combo name {name!r}: the {QTSD_PREFIX!r} prefix is reserved for the "
                "quota-share combos fairgate mints itself"
            )
        object.__setattr__(self, "name", name)
        targets = tuple(self.targets)
        if not targets:
            raise ValueError(f"combo {name!r} has no targets")
        seen: set[str] = set()
        for t in targets:
            if t.key in seen:
                raise ValueError(f"combo {name!r} lists target {t.key!r} twice")
            seen.add(t.key)
        object.__setattr__(self, "targets", targets)
        canonical, implied = resolve_strategy(self.strategy, internal=self.internal)
        object.__setattr__(self, "strategy", canonical)
        config = self.config
        if implied:
            config = dataclasses.replace(config, options={**implied, **config.options})
            object.__setattr__(self, "config", config)
        validate_options(canonical, config.options, n_targets=len(targets))

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *layers: Mapping[str, object]) -> Combo:
        """From ``{"name", "strategy", "targets"|"models", "config"}``; ``layers`` are the
        config layers below the combo's own (defaults, global, per provider)."""
        raw = {normalize_key(k): v for k, v in _as_mapping("combo", data).items()}
        unknown = set(raw) - {"name", "strategy", "targets", "models", "config"}
        if unknown:
            raise ValueError(f"unknown combo field(s) {sorted(unknown)}")
        targets_raw = raw.get("targets", raw.get("models", ()))
        if isinstance(targets_raw, str | Mapping) or not isinstance(targets_raw, Iterable):
            raise ValueError("combo targets must be a list")
        config_raw = raw.get("config")
        own = None if config_raw is None else _as_mapping("config", config_raw)
        return cls(
            name=_as_str("combo name", raw.get("name")),
            strategy=_as_str("combo strategy", raw.get("strategy", "priority")),
            targets=tuple(_target_of(t) for t in targets_raw),
            config=ComboConfig.from_layers(*layers, own),
        )
