"""Model aliases: a requested model name (or a pattern of names) maps to a target.

Claude Code and the Codex CLI ask for their own default model names (``claude-opus-5-5``,
``gpt-6.2-sol``), which move with every release, and a team's connections rarely list them. An
alias sends every name that matches its pattern to a target a connection or combo serves:
``claude-*`` → ``claude-sonnet-4`` (or ``anthropic/claude-sonnet-4``, or a combo's name),
``gpt-5*`` → the Codex pool's model. So a team's clients work with their defaults.

Resolution is its own step, before the usual one (combo, ``provider/model``, the connections
listing the name): a name any connection or combo serves under its own name is never
aliased, an exact pattern wins over wildcards, and wildcards are tried in the order listed (first
match wins). ``*`` matches any run of characters (none included); no other character is special.
One level: the target is not aliased again. Pure and O(1) for an exact name, O(wildcards)
otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["ModelAlias", "ModelAliases", "parse_aliases"]


@dataclass(frozen=True, slots=True)
class ModelAlias:
    """One alias: the requested names it catches and the model it sends them to."""

    pattern: str
    target: str


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if part == "*" else re.escape(part) for part in _split(pattern)))


def _split(pattern: str) -> list[str]:
    return [p for p in re.split(r"(\*)", pattern) if p]


@dataclass(frozen=True)
class ModelAliases:
    """The aliases in force (part of the registry snapshot)."""

    aliases: tuple[ModelAlias, ...] = ()
    _exact: Mapping[str, str] = field(default_factory=dict, repr=False)
    _wild: tuple[tuple[re.Pattern[str], str], ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, aliases: Iterable[ModelAlias]) -> ModelAliases:
        listed = tuple(aliases)
        exact: dict[str, str] = {}
        wild: list[tuple[re.Pattern[str], str]] = []
        for a in listed:
            if "*" in a.pattern:
                wild.append((_regex(a.pattern), a.target))
            else:
                exact.setdefault(a.pattern, a.target)
        return cls(listed, exact, tuple(wild))

    def resolve(self, model: str) -> str | None:
        """The target of the first alias catching ``model``, or None."""
        found = self._exact.get(model)
        if found is not None:
            return found
        for rx, target in self._wild:
            if rx.fullmatch(model):
                return target
        return None


def parse_aliases(raw: object) -> tuple[ModelAlias, ...]:
    """Aliases from their stored JSON form (a list of ``{"pattern", "target"}``); raises
    ``ValueError`` naming the entry that is not one."""
    if not isinstance(raw, list):
        raise ValueError("model aliases must be a list of {pattern, target}")
    out: list[ModelAlias] = []
    for n, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise ValueError(f"[{n}] must be an object with pattern and target")
        pattern, target = entry.get("pattern"), entry.get("target")
        for name, value in (("pattern", pattern), ("target", target)):
            if (
                not isinstance(value, str)
                or not value
                or value != value.strip()
                or len(value) > 200
            ):
                raise ValueError(f"[{n}].{name} must be a model name (1-200 characters, no spaces)")
            if any(c.isspace() for c in value):
                raise ValueError(f"[{n}].{name} must not contain spaces")
        if isinstance(target, str) and "*" in target:
            raise ValueError(f"[{n}].target must be a model name, not a pattern")
        out.append(ModelAlias(str(pattern), str(target)))
    return tuple(out)
