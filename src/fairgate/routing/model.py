"""Combos and their targets: validated, immutable data (SPEC §8).

A *combo* is a named virtual model. A client sends ``model: "<combo>"`` and the gateway routes
the request over the combo's *targets* — concrete (provider, model, connection) triples — in the
order its *strategy* gives, falling through on failure.

Everything here is checked when the combo is built (from the config file or the admin API), not
when a request arrives: an unknown strategy name is a ``ValueError`` that names it and lists the
valid ones (never a silent fallback to priority), the internal ``quota-share`` strategy and the
``qtSd/`` name prefix are refused for user combos, and numeric settings are range-checked.

Wildcards: a target whose ``connection_id`` is ``"*"`` means "this model on every connection of
the provider"; a target whose model is ``"*"`` (written ``provider/*``) means "every model each
connection of the provider lists". :func:`expand_targets` turns them into concrete targets at
request time, against the live connection snapshot, so a new connection joins the combo without
editing it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

__all__ = [
    "QTSD_PREFIX",
    "WILDCARD",
    "ComboConfig",
    "ConnectionLike",
    "ContextCompression",
    "ReasoningBuffer",
    "ResponseValidation",
    "ShadowConfig",
    "Target",
    "expand_targets",
    "normalize_key",
]

WILDCARD = "*"
#: Name prefix of the hidden quota-share combos (``qtSd/<pool>/<model>``).
QTSD_PREFIX = "qtSd/"
#: Hard ceiling on attempts per request whatever the config says: a combo of 50 targets with
#: ``maxRetries: 5`` must not turn one request into 300 upstream calls.
GLOBAL_MAX_ATTEMPTS = 20
#: Built-in default of ``maxWaitMs``: how long a request may wait for a cooling target.
DEFAULT_MAX_WAIT_MS = 5_000
#: Built-in default of ``queueTimeoutMs``: how long a request may queue for a concurrency slot.
DEFAULT_QUEUE_TIMEOUT_MS = 2_000

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def normalize_key(key: str) -> str:
    """``retryDelayMs`` / ``retry-delay-ms`` / ``retry_delay_ms`` → ``retry_delay_ms``."""
    return _CAMEL.sub("_", key.strip()).replace("-", "_").lower()


# -- small typed readers for config mappings ----------------------------------------------------


def _as_int(name: str, value: object, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    out = int(value)
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {out}")
    return out


def _as_opt_int(name: str, value: object, *, minimum: int | None = None) -> int | None:
    return None if value is None else _as_int(name, value, minimum=minimum)


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def _as_opt_float(name: str, value: object) -> float | None:
    return None if value is None else _as_float(name, value)


def _as_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _as_str(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value.strip()


def _as_mapping(name: str, value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a mapping, got {type(value).__name__}")
    return value


def _known_fields(name: str, value: object, fields: set[str]) -> dict[str, object]:
    """A mapping's entries with snake_case keys, refusing any key outside ``fields``: the one
    rule every option object of a combo follows (a typo must not be silently ignored)."""
    raw = {normalize_key(k): v for k, v in _as_mapping(name, value).items()}
    unknown = set(raw) - fields
    if unknown:
        raise ValueError(f"unknown {name} field(s) {sorted(unknown)}")
    return raw


# -- targets ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One concrete place a combo may send a request.

    ``key`` is the stable execution key (``provider/model`` or ``provider/model@connection``):
    metrics, in-flight counts, DRR deficits and every per-target view are keyed by it.
    Prices are USD per million tokens. ``tier``: lower is preferred (0 = primary). ``tags`` are
    capability tags (``code``, ``vision``, ``tools``, …) that auto's task-fit factor reads.
    """

    provider: str
    model: str
    connection_id: str | None = None
    weight: float = 1.0
    price_in: float | None = None
    price_out: float | None = None
    tier: int = 0
    context_window: int | None = None
    tags: frozenset[str] = frozenset()
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.provider or "/" in self.provider or "@" in self.provider:
            raise ValueError(f"target provider must be a plain name, got {self.provider!r}")
        if not self.model:
            raise ValueError("target model must not be empty")
        if self.connection_id is not None and not self.connection_id:
            raise ValueError("target connection_id must be None or non-empty")
        if not math.isfinite(self.weight):
            raise ValueError(f"target weight must be finite, got {self.weight!r}")
        for name, price in (("price_in", self.price_in), ("price_out", self.price_out)):
            if price is not None and (not math.isfinite(price) or price < 0):
                raise ValueError(f"target {name} must be ≥ 0, got {price!r}")
        if self.context_window is not None and self.context_window <= 0:
            raise ValueError(f"target context_window must be > 0, got {self.context_window}")
        object.__setattr__(self, "tags", frozenset(self.tags))  # a set or list passed in
        base = f"{self.provider}/{self.model}"
        key = base if self.connection_id is None else f"{base}@{self.connection_id}"
        object.__setattr__(self, "key", key)

    @property
    def is_wildcard(self) -> bool:
        return WILDCARD in (self.model, self.connection_id)

    @property
    def load_key(self) -> str:
        """What in-flight counts and concurrency caps are keyed by: the connection (an
        account's load is shared by every model on it), else the target itself."""
        return self.connection_id if self.connection_id is not None else self.key

    @classmethod
    def parse(cls, ref: str, **fields: object) -> Target:
        """``"provider/model"`` (model may itself contain ``/``; ``provider/*`` is a model
        wildcard) plus keyword fields: ``Target.parse("openai/gpt-4o", connection_id="c1")``."""
        provider, sep, model = ref.strip().partition("/")
        if not sep or not provider or not model:
            raise ValueError(f"target must be written provider/model, got {ref!r}")
        return cls.from_mapping({"provider": provider, "model": model, **fields})

    @classmethod
    def from_mapping(cls, data: Mapping[str, object] | str) -> Target:
        """From a config/admin-API mapping; keys in snake_case or camelCase. A bare string is
        :meth:`parse`\\ d. Unknown keys are an error (a typo must not be silently ignored)."""
        if isinstance(data, str):
            return cls.parse(data)
        raw = {normalize_key(k): v for k, v in _as_mapping("target", data).items()}
        aliases = {"connection": "connection_id", "input_price": "price_in"}
        aliases |= {"output_price": "price_out", "context": "context_window"}
        raw = {aliases.get(k, k): v for k, v in raw.items()}
        unknown = set(raw) - _TARGET_KEYS
        if unknown:
            raise ValueError(
                f"unknown target field(s) {sorted(unknown)}; valid: {sorted(_TARGET_KEYS)}"
            )
        model = _as_str("target model", raw.get("model"))
        provider_raw = raw.get("provider")
        if provider_raw is None:
            provider, sep, rest = model.partition("/")
            if not sep or not rest:
                raise ValueError(f"target needs a provider (or model provider/model): {model!r}")
            model = rest
        else:
            provider = _as_str("target provider", provider_raw)
        conn = raw.get("connection_id")
        tags_raw = raw.get("tags", ())
        if isinstance(tags_raw, str) or not isinstance(tags_raw, Iterable):
            raise ValueError(f"target tags must be a list of strings, got {tags_raw!r}")
        return cls(
            provider=provider,
            model=model,
            connection_id=None if conn is None else _as_str("target connection", conn),
            weight=_as_float("target weight", raw.get("weight", 1.0)),
            price_in=_as_opt_float("target price_in", raw.get("price_in")),
            price_out=_as_opt_float("target price_out", raw.get("price_out")),
            tier=_as_int("target tier", raw.get("tier", 0), minimum=0),
            context_window=_as_opt_int(
                "target context_window", raw.get("context_window"), minimum=1
            ),
            tags=frozenset(_as_str("target tag", t) for t in tags_raw),
        )


_TARGET_KEYS = frozenset(
    {
        "provider",
        "model",
        "connection_id",
        "weight",
        "price_in",
        "price_out",
        "tier",
        "context_window",
        "tags",
    }
)


class ConnectionLike(Protocol):
    """What wildcard expansion reads of a connection
    (``fairgate.domain.connections.Connection``)."""

    @property
    def id(self) -> str: ...

    @property
    def models(self) -> tuple[str, ...]: ...

    @property
    def enabled(self) -> bool: ...

    def serves(self, model: str) -> bool: ...


def expand_targets(
    targets: Iterable[Target], connections_by_provider: Mapping[str, Sequence[ConnectionLike]]
) -> list[Target]:
    """Concrete targets for a combo, wildcards expanded against ``connections_by_provider``
    (``Registry.by_provider``), duplicates (same key) dropped, first occurrence kept.

    - ``connection_id="*"``: one target per enabled connection of the provider that serves the
      model.
    - ``model="*"`` (``provider/*``): one target per (enabled connection, model it lists); with
      a concrete ``connection_id`` only that connection's models. A connection serving ``"*"``
      (any model) cannot be enumerated: it contributes the models it also lists by name.

    Expanded targets inherit weight, prices, tier, context window and tags. A wildcard that
    matches nothing contributes nothing; the pipeline reports the empty pool.
    """
    out: list[Target] = []
    seen: set[str] = set()

    def add(t: Target) -> None:
        if t.key not in seen:
            seen.add(t.key)
            out.append(t)

    for t in targets:
        if not t.is_wildcard:
            add(t)
            continue
        for conn in connections_by_provider.get(t.provider, ()):
            if not conn.enabled:
                continue
            if t.connection_id not in (None, WILDCARD) and conn.id != t.connection_id:
                continue
            if t.model == WILDCARD:
                models: Sequence[str] = [m for m in conn.models if m != WILDCARD]
            else:
                models = (t.model,) if conn.serves(t.model) else ()
            for m in models:
                add(dataclasses.replace(t, model=m, connection_id=conn.id))
    return out


# -- config -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """Shadow routing: after the answer, a sampled copy of the request goes to each shadow
    target (its own metrics; aborted after ``timeout_ms``), never touching the answer."""

    targets: tuple[Target, ...] = ()
    sample_rate: float = 0.0
    timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"shadow sample_rate must be in [0, 1], got {self.sample_rate}")
        if self.timeout_ms <= 0:
            raise ValueError(f"shadow timeout_ms must be > 0, got {self.timeout_ms}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> ShadowConfig:
        raw = _known_fields("shadow", data, {"targets", "sample_rate", "timeout_ms"})
        targets_raw = raw.get("targets", ())
        if isinstance(targets_raw, str | Mapping) or not isinstance(targets_raw, Iterable):
            raise ValueError("shadow targets must be a list")
        return cls(
            targets=tuple(_target_of(t) for t in targets_raw),
            sample_rate=_as_float("shadow sample_rate", raw.get("sample_rate", 0.0)),
            timeout_ms=_as_int("shadow timeout_ms", raw.get("timeout_ms", 30_000), minimum=1),
        )


def _target_of(value: object) -> Target:
    if isinstance(value, Target):
        return value
    if isinstance(value, str | Mapping):
        return Target.from_mapping(value)
    raise ValueError(f"a target must be a mapping or 'provider/model', got {value!r}")


@dataclass(frozen=True, slots=True)
class ReasoningBuffer:
    """Reasoning held back (issue 46): a stream's reasoning/thinking prefix is held, up to
    ``max_bytes`` and ``max_ms``, until the first content or tool token, so that an answer that
    spends its whole budget on reasoning fails over before the client saw a byte. Off by
    default: holding delays what a client that shows reasoning would see."""

    enabled: bool = False
    max_bytes: int = 262_144
    max_ms: int = 60_000

    @classmethod
    def from_value(cls, value: object) -> ReasoningBuffer:
        if isinstance(value, ReasoningBuffer):
            return value
        if isinstance(value, bool):
            return cls(enabled=value)
        raw = _known_fields("reasoningBuffer", value, {"enabled", "max_bytes", "max_ms"})
        return cls(
            enabled=_as_bool("reasoningBuffer.enabled", raw.get("enabled", True)),
            max_bytes=_as_int("reasoningBuffer.maxBytes", raw.get("max_bytes", 262_144), minimum=1),
            max_ms=_as_int("reasoningBuffer.maxMs", raw.get("max_ms", 60_000), minimum=1),
        )


@dataclass(frozen=True, slots=True)
class ContextCompression:
    """The combo's rule for a conversation larger than a target's context window (issue 46):
    keep the system prompt and the last ``keep_last_turns`` messages, drop the middle, never
    split a tool call from its result. Without a rule such a target is skipped."""

    keep_last_turns: int = 8

    @classmethod
    def from_value(cls, value: object) -> ContextCompression:
        if isinstance(value, ContextCompression):
            return value
        raw = _known_fields("contextCompression", value, {"keep_last_turns", "strategy"})
        if raw.get("strategy", "drop-middle") != "drop-middle":
            raise ValueError("contextCompression.strategy must be 'drop-middle'")
        return cls(
            keep_last_turns=_as_int(
                "contextCompression.keepLastTurns", raw.get("keep_last_turns", 8), minimum=1
            )
        )


@dataclass(frozen=True, slots=True)
class ResponseValidation:
    """Checks of an answer beyond the empty/truncated ones (issue 46): regexes the answer's
    text must not match, and the JSON schema the request asked for (``response_format`` /
    ``text.format``). A failed check fails over like a provider error. Off by default: a
    failover costs another upstream call."""

    disallowed_patterns: tuple[re.Pattern[str], ...] = ()
    json_schema: bool = False

    @property
    def active(self) -> bool:
        return bool(self.disallowed_patterns) or self.json_schema

    @classmethod
    def from_value(cls, value: object) -> ResponseValidation:
        if isinstance(value, ResponseValidation):
            return value
        raw = _known_fields("responseValidation", value, {"disallowed_patterns", "json_schema"})
        pats = raw.get("disallowed_patterns", ())
        if isinstance(pats, str) or not isinstance(pats, Iterable):
            raise ValueError("responseValidation.disallowedPatterns must be a list of regexes")
        compiled = []
        for i, p in enumerate(pats):
            if not isinstance(p, str) or not p:
                raise ValueError(f"responseValidation.disallowedPatterns.{i} must be a regex")
            try:
                compiled.append(re.compile(p))
            except re.error as exc:
                raise ValueError(
                    f"responseValidation.disallowedPatterns.{i}: not a regex ({exc})"
                ) from None
        return cls(
            disallowed_patterns=tuple(compiled),
            json_schema=_as_bool("responseValidation.jsonSchema", raw.get("json_schema", False)),
        )


def _predictive_ttft(value: object) -> int | str | None:
    """``predictiveTtftMs``: milliseconds, or ``"p95"`` for the first target's learned p95."""
    if value is None or value == "p95":
        return value
    return _as_int("predictiveTtftMs", value, minimum=1)


_CONFIG_ALIASES = {"strategy_options": "options"}


@dataclass(frozen=True, slots=True)
class ComboConfig:
    """Execution settings of a combo (defaults per SPEC §8).

    ``max_retries``: extra attempts on the same target for transient failures.
    ``retry_delay_ms``: pause before such a retry. ``fallback_delay_ms``: pause before moving
    to the next target. ``timeout_ms``: budget for the whole combo (None = none).
    ``max_attempts``: attempt cap (None = targets × (1 + max_retries)); never above
    ``GLOBAL_MAX_ATTEMPTS``. ``judge``: fusion's judge (default: the first target).
    ``options``: strategy options, keys normalised to snake_case (``sticky``, ``weights``,
    ``exploration``, ``budget_usd``, ``step_prompts``, …). ``max_wait_ms``: when every target
    is cooling down or locked, how long the request may wait for the first to free (0: answer
    429/503 at once). ``queue_timeout_ms``: how long it may queue for a concurrency slot when
    every target is at its ``max_concurrent``.
    """

    max_retries: int = 1
    retry_delay_ms: int = 0
    fallback_delay_ms: int = 0
    timeout_ms: int | None = None
    max_attempts: int | None = None
    quality_validation: bool = True
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    queue_timeout_ms: int = DEFAULT_QUEUE_TIMEOUT_MS
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    judge: Target | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    #: hedged first token: start the next target when the first has not produced its first
    #: token within this many ms (``"p95"``: its learned p95); None: no hedging
    predictive_ttft_ms: int | str | None = None
    #: hedges of this combo in flight at once, process-wide (a hedge over the cap is not sent)
    max_hedges_in_flight: int = 4
    reasoning_buffer: ReasoningBuffer = field(default_factory=ReasoningBuffer)
    context_compression: ContextCompression | None = None
    response_validation: ResponseValidation = field(default_factory=ResponseValidation)

    def __post_init__(self) -> None:
        for name in (
            "max_retries",
            "retry_delay_ms",
            "fallback_delay_ms",
            "max_wait_ms",
            "queue_timeout_ms",
        ):
            _as_int(name, getattr(self, name), minimum=0)
        _as_opt_int("timeout_ms", self.timeout_ms, minimum=1)
        _as_opt_int("max_attempts", self.max_attempts, minimum=1)
        _as_int("max_hedges_in_flight", self.max_hedges_in_flight, minimum=1)
        _predictive_ttft(self.predictive_ttft_ms)
        opts = {normalize_key(k): v for k, v in self.options.items()}
        object.__setattr__(self, "options", MappingProxyType(opts))

    def attempt_cap(self, n_targets: int) -> int:
        """How many upstream attempts one request may make at most."""
        natural = max(1, n_targets) * (1 + self.max_retries)
        cap = natural if self.max_attempts is None else min(natural, self.max_attempts)
        return min(cap, GLOBAL_MAX_ATTEMPTS)

    @classmethod
    def from_layers(cls, *layers: Mapping[str, object] | None) -> ComboConfig:
        """Merge config layers, later winning key by key — the cascade built-in defaults →
        global settings → per-provider overrides → combo config. ``options`` merge key by key;
        every other field is replaced whole. Unknown keys raise ``ValueError``."""
        merged: dict[str, object] = {}
        options: dict[str, object] = {}
        for layer in layers:
            if not layer:
                continue
            for k, v in _as_mapping("combo config", layer).items():
                key = normalize_key(k)
                key = _CONFIG_ALIASES.get(key, key)
                if key not in _CONFIG_KEYS:
                    raise ValueError(
                        f"unknown combo config field {k!r}; valid: {sorted(_CONFIG_KEYS)}"
                    )
                if key == "response_validation" and isinstance(v, bool):
                    key = "quality_validation"  # the older spelling of the empty/truncated check
                if key == "options":
                    options |= {normalize_key(ok): ov for ok, ov in _as_mapping(k, v).items()}
                else:
                    merged[key] = v
        shadow_raw = merged.get("shadow")
        judge_raw = merged.get("judge")
        return cls(
            max_retries=_as_int("maxRetries", merged.get("max_retries", 1), minimum=0),
            retry_delay_ms=_as_int("retryDelayMs", merged.get("retry_delay_ms", 0), minimum=0),
            fallback_delay_ms=_as_int(
                "fallbackDelayMs", merged.get("fallback_delay_ms", 0), minimum=0
            ),
            timeout_ms=_as_opt_int("timeoutMs", merged.get("timeout_ms"), minimum=1),
            max_attempts=_as_opt_int("maxAttempts", merged.get("max_attempts"), minimum=1),
            quality_validation=_as_bool(
                "qualityValidation", merged.get("quality_validation", True)
            ),
            max_wait_ms=_as_int(
                "maxWaitMs", merged.get("max_wait_ms", DEFAULT_MAX_WAIT_MS), minimum=0
            ),
            queue_timeout_ms=_as_int(
                "queueTimeoutMs",
                merged.get("queue_timeout_ms", DEFAULT_QUEUE_TIMEOUT_MS),
                minimum=0,
            ),
            shadow=(
                ShadowConfig()
                if shadow_raw is None
                else shadow_raw
                if isinstance(shadow_raw, ShadowConfig)
                else ShadowConfig.from_mapping(_as_mapping("shadow", shadow_raw))
            ),
            judge=None if judge_raw is None else _target_of(judge_raw),
            options=options,
            predictive_ttft_ms=_predictive_ttft(merged.get("predictive_ttft_ms")),
            max_hedges_in_flight=_as_int(
                "maxHedgesInFlight", merged.get("max_hedges_in_flight", 4), minimum=1
            ),
            reasoning_buffer=ReasoningBuffer.from_value(merged.get("reasoning_buffer", False)),
            context_compression=(
                None
                if merged.get("context_compression") is None
                else ContextCompression.from_value(merged["context_compression"])
            ),
            response_validation=ResponseValidation.from_value(
                merged.get("response_validation") or {}
            ),
        )


_CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(ComboConfig))
