"""What a strategy may read about one request: :class:`RouteInput`, immutable.

Strategies are pure functions of a ``RouteInput`` and a :class:`~fairgate.routing.state.
StrategyState`; everything live (breaker state, cooldowns, quota snapshots, in-flight counts,
metrics) reaches them as plain data the pipeline gathered for this request. That keeps the
strategies free of I/O, testable with literals, and makes every routing decision reproducible
from its inputs: the time is ``now_ms`` and the randomness is ``rng`` (a seeded
``random.Random`` in tests).

Views default to "nothing known": a target missing from a view is healthy, has unknown quota,
no metrics and nothing in flight.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from fairgate.domain.breaker import BreakerState
from fairgate.routing.model import Target
from fairgate.routing.soft import SOFT_FACTOR

__all__ = [
    "EMPTY_METRICS",
    "BreakerState",
    "HealthView",
    "MetricsView",
    "QuotaView",
    "RouteInput",
    "TargetHealth",
    "TargetQuota",
    "TaskHints",
    "opt_bool",
    "opt_float",
    "opt_int",
    "task_hints",
]


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """Resilience flags of one target (SPEC §9): provider breaker, connection cooldown, model
    lockout. The executor skips unavailable targets; auto also scores them down."""

    breaker: BreakerState = BreakerState.CLOSED
    cooling: bool = False
    locked: bool = False

    @property
    def available(self) -> bool:
        return self.breaker is not BreakerState.OPEN and not self.cooling and not self.locked

    @property
    def score(self) -> float:
        """1 healthy, 0.5 half-open (one probe allowed), 0 unavailable."""
        if not self.available:
            return 0.0
        return 0.5 if self.breaker is BreakerState.HALF_OPEN else 1.0


HEALTHY = TargetHealth()


@dataclass(frozen=True, slots=True)
class HealthView:
    by_key: Mapping[str, TargetHealth] = field(default_factory=dict)

    def of(self, target: Target) -> TargetHealth:
        return self.by_key.get(target.key, HEALTHY)


@dataclass(frozen=True, slots=True)
class TargetQuota:
    """The quota picture of one target for *this client key* (from the fair-share decision and
    the plan's tightest dimension).

    ``soft_penalized``: the allocation is soft and over its fair share (SPEC §4).
    ``blocked``: admission would block it. ``remaining``: fraction 0..1 of the tightest
    dimension still free (None = unknown/unlimited). ``reset_in_ms``: when that dimension's
    window frees up; ``window_ms`` its length. ``headroom`` and ``request_cost``: what is left
    and what this request costs, in that dimension's unit (None = unknown). ``exhausts_in_ms``:
    time to exhaustion at the current burn rate (SPEC §6; None = no data).
    """

    soft_penalized: bool = False
    blocked: bool = False
    remaining: float | None = None
    reset_in_ms: int | None = None
    window_ms: int | None = None
    headroom: float | None = None
    request_cost: float | None = None
    exhausts_in_ms: int | None = None

    @property
    def has_room(self) -> bool:
        """Whether this request fits in what is left (unknown counts as fitting)."""
        if self.blocked:
            return False
        if self.headroom is not None and self.request_cost is not None:
            return self.headroom >= self.request_cost
        return self.remaining is None or self.remaining > 0.0

    @property
    def remaining_or_full(self) -> float:
        return 1.0 if self.remaining is None else min(1.0, max(0.0, self.remaining))

    @property
    def reset_urgency(self) -> float:
        """How close the window is to resetting: 1 = now, 0 = a full window away, 0.5 unknown."""
        if self.reset_in_ms is None:
            return 0.5
        if self.reset_in_ms <= 0:
            return 1.0
        if not self.window_ms:
            return 0.5
        return min(1.0, max(0.0, 1.0 - self.reset_in_ms / self.window_ms))


UNKNOWN_QUOTA = TargetQuota()


@dataclass(frozen=True, slots=True)
class QuotaView:
    by_key: Mapping[str, TargetQuota] = field(default_factory=dict)

    def of(self, target: Target) -> TargetQuota:
        return self.by_key.get(target.key, UNKNOWN_QUOTA)


class MetricsView(Protocol):
    """Windowed per-target metrics; :class:`fairgate.routing.metrics.TargetMetrics` is one."""

    def ewma_ms(self, key: str) -> float | None: ...

    def p95_ms(self, key: str) -> float | None: ...

    def success_rate(self, key: str, now_ms: int) -> float | None: ...

    def uses(self, key: str, now_ms: int) -> int: ...

    def last_ok_ms(self, key: str) -> int | None: ...


class _NoMetrics:
    """Nothing recorded anywhere."""

    def ewma_ms(self, key: str) -> float | None:
        return None

    def p95_ms(self, key: str) -> float | None:
        return None

    def success_rate(self, key: str, now_ms: int) -> float | None:
        return None

    def uses(self, key: str, now_ms: int) -> int:
        return 0

    def last_ok_ms(self, key: str) -> int | None:
        return None


EMPTY_METRICS: MetricsView = _NoMetrics()


@dataclass(frozen=True, slots=True)
class TaskHints:
    """What the request needs, as the pipeline detected it (:func:`task_hints`). ``kind``:
    ``code``, ``reasoning``, ``chat``, … matched against target tags; tools, vision and a long
    context become the ``tools``, ``vision`` and ``long-context`` tags."""

    kind: str | None = None
    needs_tools: bool = False
    needs_vision: bool = False
    long_context: bool = False

    @property
    def required_tags(self) -> frozenset[str]:
        tags = {self.kind} if self.kind else set()
        if self.needs_tools:
            tags.add("tools")
        if self.needs_vision:
            tags.add("vision")
        if self.long_context:
            tags.add("long-context")
        return frozenset(tags)


#: A prompt this long (estimated tokens) asks for a ``long-context`` target.
LONG_CONTEXT_TOKENS = 32_000


def _has_image(messages: object) -> bool:
    if not isinstance(messages, list):
        return False
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image")
            for p in content
        ):
            return True
    return False


def _wants_reasoning(body: Mapping[str, object]) -> bool:
    if body.get("reasoning_effort") or body.get("reasoning"):
        return True
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") == "enabled"


def task_hints(body: Mapping[str, object], prompt_tokens: int) -> TaskHints:
    """What a chat or messages request needs, from its body (OpenAI or Anthropic shape):
    tools (``tools`` / ``functions``), vision (an image part), reasoning (``reasoning_effort``,
    ``reasoning`` or Anthropic's ``thinking``), a long context (the prompt estimate)."""
    return TaskHints(
        kind="reasoning" if _wants_reasoning(body) else None,
        needs_tools=bool(body.get("tools") or body.get("functions")),
        needs_vision=_has_image(body.get("messages")),
        long_context=prompt_tokens >= LONG_CONTEXT_TOKENS,
    )


@dataclass(frozen=True, slots=True)
class RouteInput:
    """One request's routing inputs. ``request_tokens``: prompt estimate; ``output_tokens``:
    ``max_tokens`` or the configured default (both feed context fit and cost).
    ``inflight`` is keyed by target key. ``options`` are the combo's strategy options
    (snake_case). ``soft_factor`` is ``QUOTA_SOFT_DEPRIORITIZE_FACTOR``."""

    combo: str
    targets: tuple[Target, ...]
    now_ms: int
    rng: random.Random
    request_tokens: int = 0
    output_tokens: int = 0
    metrics: MetricsView = EMPTY_METRICS
    health: HealthView = field(default_factory=HealthView)
    quota: QuotaView = field(default_factory=QuotaView)
    inflight: Mapping[str, int] = field(default_factory=dict)
    session_key: str | None = None
    task: TaskHints = field(default_factory=TaskHints)
    options: Mapping[str, object] = field(default_factory=dict)
    soft_factor: float = SOFT_FACTOR

    def penalized(self, target: Target) -> bool:
        return self.quota.of(target).soft_penalized

    def inflight_of(self, target: Target) -> int:
        return self.inflight.get(target.key, 0)

    def fits(self, target: Target) -> bool:
        """Prompt + expected output fit the target's context window (unknown window fits)."""
        if target.context_window is None:
            return True
        return self.request_tokens + self.output_tokens <= target.context_window

    def estimated_cost(self, target: Target) -> float | None:
        """USD for this request on ``target``; None when its price is unknown. A missing
        output price counts as the input price (flat-priced models)."""
        if target.price_in is None:
            return None
        price_out = target.price_in if target.price_out is None else target.price_out
        return (self.request_tokens * target.price_in + self.output_tokens * price_out) / 1e6


# -- typed option readers (options are validated at configuration time; these only coerce) -----


def opt_float(options: Mapping[str, object], name: str, default: float) -> float:
    v = options.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return default
    return float(v)


def opt_int(options: Mapping[str, object], name: str, default: int) -> int:
    v = options.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int):
        return default
    return v


def opt_bool(options: Mapping[str, object], name: str, default: bool = False) -> bool:
    v = options.get(name, default)
    return v if isinstance(v, bool) else default
