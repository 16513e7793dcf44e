"""What moves through the request path: the route, the long-lived services, one client call,
a candidate connection, and how the executor treats a call's candidates.

Plain data (and the services' task bookkeeping), imported by every stage of the path and
importing none of them: the HTTP edge (``proxy``), combos (``pipeline``), the executor, one
attempt and the exchange table all depend on this module, never the other way round.
"""

from __future__ import annotations

import math
import random
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey
from fairgate.formats.pricing import PriceTable
from fairgate.path.background import Background
from fairgate.path.deps import PathState
from fairgate.path.provider_signals import ProviderSignals
from fairgate.path.slots import Slots
from fairgate.process.client_request import ClientRequest
from fairgate.process.errors import ApiError
from fairgate.process.events import EventSink
from fairgate.process.guards import KeyRateGuard
from fairgate.process.http_settings import HttpSettings
from fairgate.process.metrics import Metrics
from fairgate.providers.transport import Upstream
from fairgate.quota.outcomes import Ticket
from fairgate.routing import (
    DrrState,
    DrrTicket,
    InflightTracker,
    StrategyState,
    Target,
    TargetMetrics,
)
from fairgate.routing.fallbacks import FallbackCounts
from fairgate.routing.model import (
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_QUEUE_TIMEOUT_MS,
    ContextCompression,
    ReasoningBuffer,
    ResponseValidation,
)


class Route(StrEnum):
    CHAT = "chat"
    MESSAGES = "messages"
    EMBEDDINGS = "embeddings"
    #: the OpenAI Responses API (``/v1/responses``): relayed as it is to a Responses-wire
    #: connection, translated through the chat form to the others (issue 42, item 3)
    RESPONSES = "responses"


class PlainCandidates:
    """The candidates of a plain model (its connections, heaviest first, as routing targets),
    built once per registry snapshot instead of per request: a request filters them by what
    its key may use. Starts over when the registry is replaced or holds too many entries."""

    __slots__ = ("_by", "_reg")

    MAX = 4096

    def __init__(self) -> None:
        self._reg: object = None
        self._by: dict[tuple[str, tuple[str, ...]], tuple[Candidate, ...]] = {}

    def of(self, reg: object, model: str, conns: Sequence[Connection]) -> tuple[Candidate, ...]:
        if reg is not self._reg:
            self._reg, self._by = reg, {}
        k = (model, tuple([c.id for c in conns]))
        hit = self._by.get(k)
        if hit is None:
            if len(self._by) >= self.MAX:
                self._by.clear()
            ordered = sorted(conns, key=lambda c: -c.weight)
            hit = self._by[k] = tuple(Candidate.of(c, model) for c in ordered)
        return hit


@dataclass
class Services:
    """The request path's dependencies, built once by the app: the process state it reads
    (:class:`~fairgate.path.deps.PathState`: registry, clock, timer, engine, resilience, ...),
    the upstream port, provider signals, prices, the event hook, and its own bookkeeping
    (in-flight tickets, slots, routing state, metrics)."""

    state: PathState
    upstream: Upstream
    signals: ProviderSignals
    prices: PriceTable
    #: the one hook the path reports its events to (log, metrics, tracing adapters)
    events: EventSink
    inflight: set[Ticket] = field(default_factory=set)
    tasks: Background = field(default_factory=Background)
    tracker: InflightTracker = field(default_factory=InflightTracker)
    slots: Slots = field(init=False)
    drr: DrrState = field(default_factory=DrrState)
    strategy_state: StrategyState = field(default_factory=StrategyState)
    target_metrics: TargetMetrics = field(default_factory=TargetMetrics)
    rng: random.Random = field(default_factory=random.Random)
    metrics: Metrics = field(default_factory=Metrics)
    limits: HttpSettings = field(default_factory=HttpSettings)
    rate: KeyRateGuard = field(init=False)
    fallbacks: FallbackCounts = field(default_factory=FallbackCounts)
    plain_candidates: PlainCandidates = field(default_factory=PlainCandidates)
    #: hedges in flight per combo (a combo's ``maxHedgesInFlight`` caps them)
    hedges: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        state = self.state
        self.slots = Slots(self.tracker, lambda: state.slot_leases, timer=lambda: state.timer)
        self.rate = KeyRateGuard(self.limits.key_rate_per_s, self.limits.key_rate_burst)

    def check_rate(self, key: ClientKey) -> None:
        """429 when ``key`` sends faster than the per-key flood guard allows (checked before
        its body is read)."""
        wait_ms = self.rate.take(key.id, self.state.clock.now_ms())
        if wait_ms:
            raise ApiError(
                429,
                "This API key sends requests too fast; slow down",
                code="key_rate_limited",
                headers={"retry-after": str(max(1, math.ceil(wait_ms / 1000)))},
            )

    def record_attempt(
        self, cand: Candidate, failure: str | None, latency_ms: float, tokens: int = 0
    ) -> None:
        """One finished upstream attempt (``failure``: None for a success, else its class), for
        the routing metrics the strategies read and the per-target Prometheus series."""
        ok = failure is None
        now = self.state.clock.now_ms()
        self.target_metrics.record(cand.target.key, latency_ms, ok, now, tokens)
        conn = cand.conn
        outcome = "ok" if ok else (failure if failure and failure != "ok" else "error")
        self.metrics.observe_attempt(
            self.state.registry, conn.provider, conn.id, cand.model, outcome, latency_ms
        )

    def record_fallback(self, combo: str | None, reason: str | None) -> None:
        """A combo moved on to another target because the previous one failed (``reason``)."""
        if combo is not None:
            why = reason or "error"
            self.fallbacks.record(combo, why, self.state.clock.now_ms())
            self.metrics.observe_fallback(self.state.registry, combo, why)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run bookkeeping off the response path; shutdown waits for what is still running."""
        self.tasks.spawn(coro)

    async def drain(self) -> None:
        await self.tasks.settle()
        await self.slots.aclose()


@dataclass
class Call:
    """One client request as it moves through the hot path."""

    svc: Services
    request: ClientRequest
    key: ClientKey
    body: dict[str, Any]
    route: Route
    model: str
    stream: bool
    prompt_estimate: int
    #: the output bound of one choice: the client's, else the gateway's default, which is then
    #: sent upstream (``exchange``) so that the upstream cannot bill more than was reserved
    max_output: int
    t0: float
    headers: Mapping[str, str]
    #: how many answers the upstream generates and bills (chat's ``n``; 1 elsewhere)
    choices: int = 1
    #: an ``auto`` combo's candidates as it scored them (factors, score), for the diagnostics
    route_scores: list[dict[str, object]] | None = None

    @property
    def anthropic_client(self) -> bool:
        return self.route is Route.MESSAGES

    @property
    def output_reserved(self) -> int:
        """The output tokens the upstream may bill: every choice up to its bound. What
        admission reserves and what a request without a usage report is charged."""
        return self.max_output * self.choices


@dataclass(frozen=True, slots=True)
class Candidate:
    """One concrete place a request may go: a connection and the model name it knows, as the
    routing target it came from (metrics, in-flight counts and DRR are kept per target)."""

    conn: Connection
    model: str
    target: Target

    @classmethod
    def of(cls, conn: Connection, model: str) -> Candidate:
        return cls(conn, model, Target(conn.provider, model, conn.id, weight=conn.weight))

    @property
    def label(self) -> str:
        return f"{self.conn.provider}/{self.model}@{self.conn.id}"


@dataclass
class ExecOptions:
    """How the executor treats failures: retries on the same target for transient ones,
    pauses between fall-throughs, a cap on attempts, quality validation of 200s, the bounded
    waits (cooling targets, concurrency slots) and the quota-share DRR ticket to charge."""

    max_retries: int = 0
    retry_delay_ms: int = 0
    fallback_delay_ms: int = 0
    attempt_cap: int = 20
    quality: bool = True
    drr: DrrTicket | None = None
    combo: str | None = None
    #: how long to wait for a cooling/locked target to free (0: never wait)
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    #: how long to queue for a concurrency slot when every candidate is at its cap
    queue_timeout_ms: int = DEFAULT_QUEUE_TIMEOUT_MS
    #: the combo's timeout as an instant on the clock (waits never outlast it)
    deadline_ms: int | None = None
    #: the combo's answer checks beyond quality (patterns, requested schema)
    validation: ResponseValidation = field(default_factory=ResponseValidation)
    #: hold a stream's reasoning until its first content (None: pass it through live)
    reasoning: ReasoningBuffer | None = None
    #: how a conversation too large for a target's window is made to fit (None: skip it)
    compression: ContextCompression | None = None
    #: combo routing: a target whose known context window is too small is skipped or
    #: compressed for (plain models leave the upstream to say so)
    fit_context: bool = False
    #: one side of a hedged request: an attempt cut off by the other side's win is charged
    #: its prompt (the upstream bills the work it started), not released
    charge_if_cancelled: bool = False
    #: the candidates' order already weighs the soft penalty (a combo's strategy scored the
    #: penalised targets × ``soft_factor``, SPEC §4): the executor keeps that order instead of
    #: holding a penalised admission behind every unpenalised candidate, which would make the
    #: factor meaningless (a penalised target priced 1 losing to one priced 100)
    soft_ordered: bool = False
