"""The hot path: ``/v1/chat/completions``, ``/v1/messages``, ``/v1/embeddings``, ``/v1/models``.

One request: authenticate the key (hash lookup) → parse the body once → resolve the model to
candidate connections → for each candidate, atomically admit against its pool (block → next
candidate; soft → prefer an unpenalised one) → send upstream (translating between the OpenAI and
Anthropic formats when the connection speaks the other one) → stream or return the answer →
settle the reservation with the real usage (release it on failure). Headers carry the key's
remaining share. Nothing here scans all keys, pools or connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from fairgate.providers.pricing import PriceTable
from fairgate.providers.ratelimit import RateLimitSnapshot
from fairgate.providers.responses_upstream import (
    upstream_responses_answer,
    upstream_responses_body,
)
from fairgate.providers.translate import (
    anthropic_to_openai_request,
    anthropic_to_openai_response,
    openai_to_anthropic_request,
    openai_to_anthropic_response,
)
from fairgate.providers.transport import TRANSPORT_ERRORS, Upstream, UpstreamResponse
from fairgate.providers.usage import Usage, estimate_prompt_tokens, estimate_text_tokens
from fairgate.providers.usage import usage_from_anthropic as _usage_anthropic
from fairgate.providers.usage import usage_from_openai as _usage_openai
from fairgate.quota.engine import ALLOW_UNGOVERNED, Admission, Ticket
from fairgate.quota.messages import block_message
from fairgate.quota.model import Pool
from fairgate.quota.units import Unit
from fairgate.registry import ClientKey, Connection, Protocol
from fairgate.resilience.classify import Classification, classify
from fairgate.resilience.failover import Step, same_model_is_futile, step_after
from fairgate.resilience.manager import Exclusion, all_rate_limited
from fairgate.routing import (
    DrrState,
    DrrTicket,
    InflightTracker,
    Lease,
    StrategyState,
    Target,
    TargetMetrics,
)
from fairgate.routing.fallbacks import FallbackCounts
from fairgate.routing.model import (
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_QUEUE_TIMEOUT_MS,
    GLOBAL_MAX_ATTEMPTS,
)
from fairgate.server import relay, tracing
from fairgate.server.bodies import (
    CHAT_FIELDS,
    MAX_MODEL_LEN,
    MAX_OUTPUT_TOKENS,
    MESSAGES_FIELDS,
    check_depth,
    check_fields,
    check_message_limits,
    check_messages,
    decode_json_object,
    optional_bool,
    optional_int,
    read_body,
    require_str,
)
from fairgate.server.diagnostics import Diagnostics, Terminal
from fairgate.server.errors import ApiError, error_response
from fairgate.server.guards import KeyRateGuard
from fairgate.server.http_settings import HttpSettings
from fairgate.server.logs import REQUEST_ID
from fairgate.server.metrics import Metrics
from fairgate.server.provider_signals import ProviderSignals
from fairgate.server.reservation import Reservation
from fairgate.server.slots import Slots
from fairgate.server.state import Gateway

log = logging.getLogger("fairgate.proxy")

_T = TypeVar("_T")


class Route(StrEnum):
    CHAT = "chat"
    MESSAGES = "messages"
    EMBEDDINGS = "embeddings"


_UPSTREAM_PATH = {
    (Route.CHAT, Protocol.OPENAI): "/chat/completions",
    (Route.CHAT, Protocol.ANTHROPIC): "/messages",
    (Route.MESSAGES, Protocol.ANTHROPIC): "/messages",
    (Route.MESSAGES, Protocol.OPENAI): "/chat/completions",
    (Route.EMBEDDINGS, Protocol.OPENAI): "/embeddings",
    (Route.CHAT, Protocol.RESPONSES): "/responses",
    (Route.MESSAGES, Protocol.RESPONSES): "/responses",
}


@dataclass
class Services:
    """Long-lived things the proxy needs besides the Gateway state."""

    gw: Gateway
    upstream: Upstream
    signals: ProviderSignals
    prices: PriceTable
    inflight: set[Ticket] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
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

    def __post_init__(self) -> None:
        self.slots = Slots(self.tracker)
        self.rate = KeyRateGuard(self.limits.key_rate_per_s, self.limits.key_rate_burst)

    def check_rate(self, key: ClientKey) -> None:
        """429 when ``key`` sends faster than the per-key flood guard allows (checked before
        its body is read)."""
        wait_ms = self.rate.take(key.id, self.gw.clock.now_ms())
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
        self.target_metrics.record(cand.target.key, latency_ms, ok, self.gw.clock.now_ms(), tokens)
        conn = cand.conn
        outcome = "ok" if ok else (failure if failure and failure != "ok" else "error")
        self.metrics.observe_attempt(
            self.gw.registry, conn.provider, conn.id, cand.model, outcome, latency_ms
        )

    def record_fallback(self, combo: str | None, reason: str | None) -> None:
        """A combo moved on to another target because the previous one failed (``reason``)."""
        if combo is not None:
            why = reason or "error"
            self.fallbacks.record(combo, why, self.gw.clock.now_ms())
            self.metrics.observe_fallback(self.gw.registry, combo, why)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run bookkeeping off the response path; shutdown waits for what is still running."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


@dataclass
class Call:
    """One client request as it moves through the hot path."""

    svc: Services
    request: Request
    key: ClientKey
    body: dict[str, Any]
    route: Route
    model: str
    stream: bool
    prompt_estimate: int
    max_output: int
    t0: float
    headers: Mapping[str, str]

    @property
    def anthropic_client(self) -> bool:
        return self.route is Route.MESSAGES


# -- entry points --------------------------------------------------------------------------


def _services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def _client_secret(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def check_model_allowed(key: ClientKey, model: str) -> None:
    """403 when ``key`` lists the models it may use and ``model`` is not one of them."""
    if key.allowed_models and model not in key.allowed_models:
        raise ApiError(
            403,
            f"This API key may not use model '{model}'",
            code="model_not_allowed",
            param="model",
        )


def authenticate(svc: Services, request: Request) -> ClientKey:
    secret = _client_secret(request)
    if secret is None:
        raise ApiError(
            401,
            "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'",
            code="missing_api_key",
        )
    key = svc.gw.registry.authenticate(secret)
    if key is None:
        raise ApiError(401, "Invalid API key", code="invalid_api_key")
    svc.gw.key_last_used[key.id] = svc.gw.clock.now_ms()
    return key


async def chat_completions(request: Request) -> Response:
    return await _handle(request, Route.CHAT)


async def messages(request: Request) -> Response:
    return await _handle(request, Route.MESSAGES)


async def embeddings(request: Request) -> Response:
    return await _handle(request, Route.EMBEDDINGS)


async def models(request: Request) -> Response:
    svc = _services(request)
    try:
        key = authenticate(svc, request)
    except ApiError as err:
        return error_response(err)
    reg = svc.gw.registry
    seen: dict[str, str] = {}
    for provider, conns in reg.by_provider.items():
        for conn in conns:
            if reg.denial(key, conn) is not None:
                continue  # only what this key may use
            for m in conn.named_models:
                seen.setdefault(f"{provider}/{m}", provider)
                if reg.default_provider == provider:
                    seen.setdefault(m, provider)
    for name in reg.combos:  # user combos; the internal qtSd/ ones are not selectable
        seen.setdefault(name, "fairgate-combo")
    if key.allowed_models:
        seen = {m: p for m, p in seen.items() if m in key.allowed_models}
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": p} for m, p in sorted(seen.items())
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def chat_from(
    request: Request, prepare: Callable[[dict[str, Any]], dict[str, Any]]
) -> Response:
    """Serve a request of another client API as a chat completion: ``prepare`` turns its body
    into a chat body (raising ``ApiError`` for what cannot be served), then everything —
    admission, routing, settlement, translation to any upstream — is the chat route's."""
    return await _handle(request, Route.CHAT, prepare)


@tracing.traced("fairgate.request", tracing.request_attrs, tracing.response_attrs, request=True)
async def _handle(
    request: Request,
    route: Route,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Response:
    svc = _services(request)
    t0 = time.perf_counter()
    key: ClientKey | None = None
    body: dict[str, Any] | None = None
    try:
        key = authenticate(svc, request)
        svc.check_rate(key)
        raw = await read_body(request, svc.gw.config.server.max_body_bytes)
        if len(raw) < svc.limits.thread_parse_bytes:
            body = decode_json_object(raw)
            if prepare is not None:
                body = prepare(body)
            call = _parse(svc, request, key, body, route, t0)
        else:  # a large body is parsed and checked off the loop: other requests go on meanwhile
            body = await asyncio.to_thread(decode_json_object, raw)
            if prepare is not None:
                body = await asyncio.to_thread(prepare, body)
            call = await asyncio.to_thread(_parse, svc, request, key, body, route, t0)
        resp = await _dispatch(call)
    except ApiError as err:
        if err.diagnostics is not None:  # the client sees reason codes; the admin, all of it
            log.info(
                "request failed",
                extra={"status": err.status, "code": err.code, "diagnostics": err.diagnostics},
            )
        resp = error_response(err, anthropic=route is Route.MESSAGES)
    svc.metrics.observe_request(svc.gw.registry, key, body, resp, t0)
    return resp


def _parse(
    svc: Services, request: Request, key: ClientKey, body: dict[str, Any], route: Route, t0: float
) -> Call:
    model = require_str(body, "model", max_len=MAX_MODEL_LEN)
    # the cheap refusals first: a key that may not use the model, too many or too large
    # messages; only then the walks over the whole body
    check_model_allowed(key, model)
    limits = svc.limits
    check_message_limits(body, limits.max_messages, limits.max_message_bytes)
    check_depth(body)
    default_out = svc.gw.config.server.default_max_tokens
    if route is Route.EMBEDDINGS:
        inp = body.get("input")
        if isinstance(inp, str):
            texts = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(x, str) for x in inp):
            texts = list(inp)
        elif isinstance(inp, list) and inp and all(isinstance(x, int) for x in inp):
            texts = ["x" * 4 * len(inp)]  # a token array: ~4 characters a token
        else:
            raise ApiError(400, "'input' must be a string or an array of strings", param="input")
        prompt = sum(estimate_text_tokens(t) for t in texts)
        return Call(svc, request, key, body, route, model, False, prompt, 0, t0, request.headers)
    check_messages(body)
    check_fields(body, MESSAGES_FIELDS if route is Route.MESSAGES else CHAT_FIELDS)
    stream = optional_bool(body, "stream")
    if route is Route.MESSAGES:
        max_out = optional_int(body, "max_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
        if max_out is None:
            raise ApiError(400, "'max_tokens' is required", param="max_tokens")
    else:
        max_cap = optional_int(body, "max_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
        max_out = (
            optional_int(body, "max_completion_tokens", minimum=1, maximum=MAX_OUTPUT_TOKENS)
            or max_cap
        )
    return Call(
        svc,
        request,
        key,
        body,
        route,
        model,
        stream,
        estimate_prompt_tokens(body),
        max_out or default_out,
        t0,
        request.headers,
    )


# -- admission over candidates -------------------------------------------------------------


@dataclass
class Blocked:
    conn: Connection
    admission: Admission


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
    """How :func:`_execute` treats failures: retries on the same target for transient ones,
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


async def _dispatch(call: Call) -> Response:
    reg = call.svc.gw.registry
    from fairgate.server import pipeline  # the routing shell builds on this module

    combo = reg.combos.get(call.model)
    if combo is not None:
        return await pipeline.route_combo(call, combo)
    if call.model.startswith("qtSd/"):
        raise ApiError(
            400,
            "qtSd/ combos are internal to quota-share routing and not selectable; "
            "ask for the model itself",
            param="model",
        )
    upstream_model, conns = reg.candidates(call.model)
    if call.route is Route.EMBEDDINGS:
        conns = tuple(c for c in conns if c.protocol is Protocol.OPENAI)
    if not conns:
        raise ApiError(
            404,
            f"The model '{call.model}' does not exist or has no enabled connection",
            code="model_not_found",
            param="model",
        )
    return await pipeline.route_plain(call, upstream_model, conns)


async def _execute(
    call: Call,
    cands: list[Candidate],
    diag: Diagnostics,
    opts: ExecOptions | None = None,
) -> Response:
    """Try the candidates in order until one answers.

    A candidate is skipped when resilience excludes it (breaker open, cooling down, model locked,
    permanently blocked, rate-limited until a learned reset) or its pool blocks the key; one at
    its concurrency cap is queued for (FIFO, bounded) once nothing else is left; a soft admission
    is held while an unpenalised candidate is looked for; after a failure the one failover rule
    (:mod:`fairgate.resilience.failover`) retries, moves on or ends the request. When nothing
    can be tried now but a target frees within ``max_wait_ms``, the request waits for it. When
    nothing answers, the error says why, with diagnostics. Every reservation taken here is
    settled by the answer or released on the way out, cancellation included.
    """
    run = _Execution(call, diag, opts or ExecOptions())
    async with contextlib.AsyncExitStack() as stack:
        run.stack = stack
        try:
            return await run.serve(cands)
        finally:
            if run.held is not None:
                run.held.lease.release()


@dataclass
class _Admitted:
    """A candidate that got a slot and an admission: what an attempt needs."""

    cand: Candidate
    pool: Pool | None
    adm: Admission
    res: Reservation
    lease: Lease


class _Execution:
    """One request's way through its candidates (the state :func:`_execute` keeps)."""

    def __init__(self, call: Call, diag: Diagnostics, opts: ExecOptions) -> None:
        self.call, self.diag, self.opts = call, diag, opts
        self.svc = call.svc
        self.timer = call.svc.gw.timer
        self.stack = contextlib.AsyncExitStack()
        self.blocked: list[Blocked] = []
        self.exclusions: list[Exclusion] = []
        self.last_error: ApiError | None = None
        self.blocked_pools: set[str] = set()
        self.full: list[Candidate] = []  # at their concurrency cap in this pass
        self.failed: list[Candidate] = []  # attempted and failed in this pass
        self.queue: list[Candidate] = []
        self.held: _Admitted | None = None  # a penalised admission, kept while looking on
        self.attempts = 0  # in this pass
        self.total_attempts = 0

    def _capped(self) -> bool:
        return self.attempts >= self.opts.attempt_cap or self.total_attempts >= GLOBAL_MAX_ATTEMPTS

    async def serve(self, cands: list[Candidate]) -> Response:
        started = self.timer.clock.now_ms()
        while True:
            resp = await self._pass(cands)
            if resp is not None:
                return resp
            if self.full:
                resp = await self._queue_for_slot()
                if resp is not None:
                    return resp
            wake = await self._next_free_ms(started)
            if wake is None:
                raise self._no_answer()
            await self._sleep_until(wake)
            # a fresh pass: its own attempt cap (the waits bound how many passes there are)
            self.blocked, self.exclusions, self.blocked_pools = [], [], set()
            self.full, self.failed = [], []
            self.attempts = 0

    async def _pass(self, cands: list[Candidate]) -> Response | None:
        self.queue = list(cands)
        while self.queue:
            cand = self.queue.pop(0)
            if self._capped():
                self.diag.exclude(cand.label, "attempt-cap")
                continue
            lease = self.svc.slots.try_acquire(cand.target, cand.conn.max_concurrent)
            if lease is None:
                self.full.append(cand)
                self.diag.exclude(cand.label, "concurrency-full")
                continue
            resp = await self._consider(cand, lease)
            if resp is not None:
                return resp
        if self.held is not None:
            held, self.held = self.held, None
            return await self._attempt(held)
        return None

    async def _consider(self, cand: Candidate, lease: Lease) -> Response | None:
        """Resilience, then admission, then an attempt (or holding a soft admission)."""
        try:
            a = await self._admit(cand, lease)
        except BaseException:
            lease.release()
            raise
        if a is None:
            lease.release()
            return None
        more = bool(self.queue)  # a candidate at its cap cannot be tried now: not an option
        if a.adm.penalized and self.held is None and more:
            self.held = a  # soft: look for an unpenalised candidate first
            return None
        # a held admission stays until something answers: if the unpenalised candidates all
        # fail, it serves (it is released on the way out when it was not needed)
        return await self._attempt(a)

    async def _admit(self, cand: Candidate, lease: Lease) -> _Admitted | None:
        conn, mgr = cand.conn, self.svc.gw.resilience
        now = self.svc.gw.clock.now_ms()
        if mgr is not None:
            excl = await mgr.check(conn.provider, conn.id, cand.model, conn.auth_type)
            if excl is not None:
                self.exclusions.append(excl)
                self.diag.exclude(cand.label, excl.reason, excl.until_ms, now)
                return None
        pool = self.svc.gw.registry.pool_by_connection.get(conn.id)
        if pool is not None and pool.id in self.blocked_pools:
            self.diag.exclude(cand.label, "quota:pool-blocked")
            return None  # counters are per pool: its other members would block this request too
        adm = await _admit(self.call, conn, pool, cand.model)
        if not adm.allowed:
            self.blocked.append(Blocked(conn, adm))
            reason = adm.reason.value if adm.reason else "blocked"
            until = None if adm.retry_after_ms is None else now + adm.retry_after_ms
            self.diag.exclude(cand.label, f"quota:{reason}", until, now)
            if pool is not None:
                self.blocked_pools.add(pool.id)
            return None
        svc = self.svc
        res = Reservation(svc.gw.engine, adm.ticket, svc.inflight, svc.spawn)
        await self.stack.enter_async_context(res)  # released on the way out unless settled
        return _Admitted(cand, pool, adm, res, lease)

    async def _attempt(self, a: _Admitted) -> Response | None:
        """Attempts on one target (retries per the failover rule); None when it failed and
        the request may move on. Raises when the failure ends the request."""
        opts = self.opts
        if self.last_error is not None:  # a previous target failed: this is a fallback
            self.svc.record_fallback(opts.combo, self.last_error.failure)
        if self.failed and opts.fallback_delay_ms > 0:
            await self._pause(opts.fallback_delay_ms)
        result: Response | ApiError = ApiError(502, "no attempt made")
        for n in range(1 + max(0, opts.max_retries)):
            if n > 0:
                retry = await self._readmit(a)
                if retry is None:
                    break
                a = retry
                if opts.retry_delay_ms > 0:
                    await self._pause(opts.retry_delay_ms)
            self.attempts += 1
            self.total_attempts += 1
            result = await _attempt(
                self.call, a.cand, a.pool, a.adm, a.res, a.lease, diag=self.diag, opts=opts
            )
            if isinstance(result, Response):
                return result
            if result.step is not Step.RETRY or self._capped():
                break
        assert isinstance(result, ApiError)
        self.last_error = result
        self.failed.append(a.cand)
        if result.final:
            self.diag.terminal = Terminal.CLIENT_ERROR
            raise self.diag.attach(result)
        if result.same_model_futile:  # another account of the same model has the same window
            self.queue = [c for c in self.queue if c.model != a.cand.model]
        return None

    async def _readmit(self, a: _Admitted) -> _Admitted | None:
        lease = self.svc.slots.try_acquire(a.cand.target, a.cand.conn.max_concurrent)
        if lease is None:
            return None
        adm = await _admit(self.call, a.cand.conn, a.pool, a.cand.model)
        if not adm.allowed:
            lease.release()
            return None
        res = Reservation(self.svc.gw.engine, adm.ticket, self.svc.inflight, self.svc.spawn)
        await self.stack.enter_async_context(res)
        return _Admitted(a.cand, a.pool, adm, res, lease)

    async def _pause(self, ms: int) -> None:
        await self.timer.sleep_until(self.timer.clock.now_ms() + ms)

    # -- waiting ------------------------------------------------------------------------------

    def _budget_end_ms(self, started: int, budget_ms: int) -> int:
        end = started + budget_ms
        deadline = self.opts.deadline_ms
        return end if deadline is None else min(end, deadline)

    async def _queue_for_slot(self) -> Response | None:
        """Every candidate left is at its concurrency cap: wait (FIFO, bounded) for a slot
        on any of them, then try that one."""
        now = self.timer.clock.now_ms()
        end = self._budget_end_ms(now, self.opts.queue_timeout_ms)
        wants = [(c.target, c.conn.max_concurrent or 0) for c in self.full]
        by_key = {c.target.load_key: c for c in self.full}
        self.full = []
        got = await self._watching_client(self.svc.slots.wait(wants, end, self.timer))
        self.diag.waited_ms += self.timer.clock.now_ms() - now
        if got is None:
            raise self._concurrency_full()
        target, lease = got
        return await self._consider(by_key[target.load_key], lease)

    async def _next_free_ms(self, started: int) -> int | None:
        """When the earliest cooling or locked candidate frees, if that is within the wait
        budget (``max_wait_ms`` since the first pass, and the combo's timeout); else None.
        Quota blocks are never waited for: they are the key's fair share speaking."""
        if self.opts.max_wait_ms <= 0:
            return None
        untils = [e.until_ms for e in self.exclusions if e.until_ms is not None]
        mgr = self.svc.gw.resilience
        if mgr is not None:
            for c in self.failed:  # what the failure just set (a cooldown, a lockout)
                excl = await mgr.check(c.conn.provider, c.conn.id, c.model, c.conn.auth_type)
                if excl is not None and excl.until_ms is not None:
                    untils.append(excl.until_ms)
        if not untils:
            return None
        wake = min(untils)
        if wake > self._budget_end_ms(started, self.opts.max_wait_ms):
            return None
        return wake

    async def _sleep_until(self, wake_ms: int) -> None:
        now = self.timer.clock.now_ms()
        await self._watching_client(self.timer.sleep_until(wake_ms))
        self.diag.waited_ms += self.timer.clock.now_ms() - now

    async def _watching_client(self, wait: Coroutine[Any, Any, _T]) -> _T:
        """Run a wait, abandoned (nothing held, nothing charged) if the client goes away."""
        gone = asyncio.ensure_future(_client_gone(self.call.request))
        task = asyncio.ensure_future(wait)
        try:
            await asyncio.wait({gone, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not task.done() or task.cancelled():
            raise ApiError(499, "The client closed the request while it waited", code="client_gone")
        return task.result()

    # -- no answer ----------------------------------------------------------------------------

    def _concurrency_full(self) -> ApiError:
        wait_s = max(1, math.ceil(self.opts.queue_timeout_ms / 1000))
        self.diag.retry_after_ms = wait_s * 1000
        return self.diag.error(
            503,
            f"Every upstream for '{self.call.model}' is at its concurrency limit",
            code="concurrency_full",
            terminal=Terminal.CONCURRENCY_FULL,
            type_="overloaded_error",
            headers={"retry-after": str(wait_s)},
        )

    def _no_answer(self) -> ApiError:
        return _no_answer(self.call, self.diag, self.blocked, self.exclusions, self.last_error)


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: only that can come)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _no_answer(
    call: Call,
    diag: Diagnostics,
    blocked: list[Blocked],
    exclusions: list[Exclusion],
    last_error: ApiError | None,
) -> ApiError:
    """The error for a request nothing could serve, with its diagnostics."""
    now = call.svc.gw.clock.now_ms()
    if last_error is not None:
        diag.terminal = Terminal.UPSTREAM_FAILED
        if not blocked and exclusions == [] and last_error.status == 429:
            diag.retry_after_ms = _retry_ms(last_error)
        return diag.attach(last_error)
    if blocked and not exclusions:
        diag.terminal = Terminal.QUOTA_BLOCKED
        err = _quota_blocked(blocked, call)
        diag.retry_after_ms = int(err.headers["retry-after"]) * 1000
        return diag.attach(err)
    # every candidate excluded by resilience (maybe some by quota): the earliest one to free
    waits = [e.until_ms - now for e in exclusions if e.until_ms is not None]
    waits += [b.admission.retry_after_ms for b in blocked if b.admission.retry_after_ms]
    rate_limited = all_rate_limited(exclusions)
    retry_headers: dict[str, str] = {}
    if waits:
        diag.retry_after_ms = max(0, min(waits))
        retry_headers["retry-after"] = str(max(1, math.ceil(diag.retry_after_ms / 1000)))
    what = "rate limited" if rate_limited else "unavailable (cooling down, locked or failing)"
    return diag.error(
        429 if rate_limited else 503,
        f"Every upstream for '{call.model}' is {what}",
        code="all_targets_unavailable",
        terminal=Terminal.ALL_RATE_LIMITED if rate_limited else Terminal.ALL_UNAVAILABLE,
        type_="rate_limit_error" if rate_limited else "overloaded_error",
        headers=retry_headers,
    )


def request_cost(call: Call, conn: Connection, upstream_model: str) -> dict[Unit, float]:
    """What admission reserves for this request on ``conn`` (and the quota view assumes)."""
    svc = call.svc
    tokens = float(call.prompt_estimate + call.max_output)
    return {
        Unit.REQUESTS: 1.0,
        Unit.TOKENS: tokens,
        Unit.USD: svc.prices.cost_usd(
            upstream_model,
            Usage(prompt_tokens=call.prompt_estimate, completion_tokens=call.max_output),
        ),
        Unit.PERCENT: svc.signals.percent_estimate(conn.id, tokens),
    }


@tracing.traced(
    "fairgate.admission",
    tracing.admission_attrs,
    tracing.admission_result,
    call_of=tracing.call_of_admission,
)
async def _admit(call: Call, conn: Connection, pool: Pool | None, upstream_model: str) -> Admission:
    if pool is None:
        return ALLOW_UNGOVERNED
    svc = call.svc
    cost = request_cost(call, conn, upstream_model)
    adm = await svc.gw.engine.admit(pool, call.key.id, cost, model=upstream_model)
    svc.metrics.observe_admission(adm)
    if not adm.allowed:
        log.info(
            "admission blocked",
            extra={
                "pool": pool.id,
                "key": call.key.id,
                "connection": conn.id,
                "reason": adm.reason.value if adm.reason else None,
                "dimension": adm.dimension,
                "retry_after_ms": adm.retry_after_ms,
            },
        )
    svc.gw.pool_log.log(
        pool.id,
        {
            "ts": svc.gw.clock.now_ms(),
            "keyId": call.key.id,
            "model": upstream_model,
            "connectionId": conn.id,
            "outcome": adm.outcome.value,
            "reason": adm.reason.value if adm.reason else None,
            "dimension": adm.dimension,
            "retryAfterMs": adm.retry_after_ms,
            "failOpen": adm.fail_open,
        },
    )
    return adm


def _quota_blocked(blocked: list[Blocked], call: Call) -> ApiError:
    best = min(blocked, key=lambda b: b.admission.retry_after_ms or math.inf)
    adm = best.admission
    assert adm.reason is not None
    retry_s = max(1, math.ceil((adm.retry_after_ms or 1000) / 1000))
    return ApiError(
        429,
        block_message(adm.reason, best.conn.provider, call.model),
        code="rate_limit_exceeded",
        type_="rate_limit_error",
        extra={
            "reason": adm.reason.value,
            "dimension": adm.dimension,
            "retry_after_seconds": retry_s,
        },
        headers={"retry-after": str(retry_s), **_quota_headers(adm)},
    )


def _quota_headers(adm: Admission) -> dict[str, str]:
    """``x-ratelimit-*`` per dimension (SPEC §4). When the store could not be read (fail-open)
    the limits and resets are still sent, the remaining counts are not, and
    ``x-fairgate-quota: unavailable`` says why (README, "Quota headers")."""
    out: dict[str, str] = {}
    for st in adm.status:
        suffix = st.key.replace("/", "-").replace(":", "-")
        out[f"x-ratelimit-limit-{suffix}"] = f"{st.limit:g}"
        out[f"x-ratelimit-reset-{suffix}"] = f"{math.ceil(st.reset_ms / 1000)}s"
        # the unsuffixed names SDK users know, from the first dimension of each unit
        out.setdefault(f"x-ratelimit-limit-{st.unit}", f"{st.limit:g}")
        if st.remaining is None:
            out["x-fairgate-quota"] = "unavailable"
            continue
        out[f"x-ratelimit-remaining-{suffix}"] = f"{st.remaining:g}"
        out.setdefault(f"x-ratelimit-remaining-{st.unit}", f"{st.remaining:g}")
    return out


# -- one attempt on one connection -----------------------------------------------------------


def _upstream_body(call: Call, conn: Connection, upstream_model: str) -> tuple[bytes, bool]:
    """The request body for this connection, and whether the client asked for stream usage."""
    body = call.body
    wants_usage = False
    if conn.protocol is Protocol.RESPONSES:
        return upstream_responses_body(call.route is Route.MESSAGES, body, upstream_model)
    if call.route is Route.MESSAGES:
        if conn.protocol is Protocol.ANTHROPIC:
            payload = {**body, "model": upstream_model}
        else:
            payload = anthropic_to_openai_request(body, upstream_model)
            wants_usage = True
    elif call.route is Route.CHAT and conn.protocol is Protocol.ANTHROPIC:
        payload = openai_to_anthropic_request(
            body, upstream_model, default_max_tokens=call.svc.gw.config.server.default_max_tokens
        )
        opts = body.get("stream_options")
        wants_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    else:
        payload = {**body, "model": upstream_model}
        if call.stream:
            opts = body.get("stream_options")
            wants_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            # always ask for the usage chunk: settlement needs the real token counts
            payload["stream_options"] = {
                **(opts if isinstance(opts, dict) else {}),
                "include_usage": True,
            }
    return orjson.dumps(payload), wants_usage


@tracing.traced("fairgate.attempt", tracing.attempt_attrs, tracing.attempt_result)
async def _attempt(
    call: Call,
    cand: Candidate,
    pool: Pool | None,
    adm: Admission,
    res: Reservation,
    lease: Lease,
    *,
    diag: Diagnostics,
    opts: ExecOptions,
) -> Response | ApiError:
    """Response on success; ApiError (its ``step`` from the failover rule) otherwise.

    Every outcome is reported to the resilience manager (cooldowns, lockouts, breakers learn
    from it), to the per-target metrics the strategies read, and to the diagnostics. The
    request holds its slot (``lease``) on the target until its answer (or stream) ends; the
    reservation is settled by the answer, or by a failure the upstream did work for.
    """
    if opts.drr is not None:
        opts.drr.dispatch(cand.target)
    try:
        return await _attempt_on(call, cand, pool, adm, res, lease, diag=diag, opts=opts)
    except BaseException:
        # a combo timeout, a shadow's abort or a bug: give the slot back (the reservation is
        # released by its owner on the way out)
        lease.release()
        raise


async def _attempt_on(
    call: Call,
    cand: Candidate,
    pool: Pool | None,
    adm: Admission,
    res: Reservation,
    lease: Lease,
    *,
    diag: Diagnostics,
    opts: ExecOptions,
) -> Response | ApiError:
    svc = call.svc
    conn, upstream_model, label = cand.conn, cand.model, cand.label
    path = _UPSTREAM_PATH[(call.route, conn.protocol)]
    try:
        payload, wants_usage = _upstream_body(call, conn, upstream_model)
    except orjson.JSONEncodeError:  # e.g. nested too deeply once translated: no target helps
        lease.release()
        await res.release()
        err = ApiError(
            400, "The request body cannot be encoded for the upstream (nested too deeply)"
        )
        err.final, err.step = True, Step.END
        return err
    t_send = time.perf_counter()

    async def fail(
        kind: str,
        err: ApiError,
        *,
        status: int | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        exc: BaseException | None = None,
        settle_usage: Usage | None = None,
    ) -> ApiError:
        lease.release()
        if settle_usage is not None:  # the upstream did the work: charge it even though it failed
            await _settle(svc, res, conn, call, upstream_model, settle_usage)
        else:
            await res.release()
        verdict = await _report_failure(call, conn, upstream_model, status, body, headers, exc)
        cls = verdict.cls.value
        latency = _ms_since(t_send)
        svc.record_attempt(cand, "connect_error" if kind == "connect_error" else cls, latency)
        diag.attempt(
            label,
            kind if kind != "upstream" else cls,
            status=status,
            latency_ms=latency,
            error=None if exc is None else type(exc).__name__,
        )
        err.failure = "connect_error" if kind == "connect_error" else cls
        # the one failover rule (a bad 200 is no class: another target may do better)
        failure = None if kind == "quality" else verdict.cls
        err.step = step_after(failure)
        err.final = err.step is Step.END
        err.same_model_futile = same_model_is_futile(failure)
        return err

    try:
        resp = await svc.upstream.post(conn, path, payload, call.headers)
    except TRANSPORT_ERRORS as exc:
        log.warning(
            "upstream unreachable", extra={"connection": conn.id, "error": type(exc).__name__}
        )
        return await fail(
            "connect_error",
            ApiError(
                502,
                f"An upstream connection failed ({type(exc).__name__})",
                code="upstream_error",
            ),
            exc=exc,
        )
    snap, charges = svc.signals.observe(
        conn.id, upstream_model, resp.headers, force=resp.status >= 400
    )
    if pool is not None:
        for ch in charges:
            await svc.gw.engine.record(pool, ch.key_id, {ch.counter: ch.amount})
    if resp.status >= 400:
        err, raw_err = await _upstream_error(resp, conn)
        log.warning("upstream error", extra={"connection": conn.id, "status": resp.status})
        return await fail("upstream", err, status=resp.status, body=raw_err, headers=resp.headers)
    headers = {**_quota_headers(adm), "x-fairgate-connection": conn.id}
    if opts.combo:
        headers["x-fairgate-combo"] = opts.combo
    if call.stream:
        tally = relay.StreamTally(prompt_estimate=call.prompt_estimate)
        source = _stream_source(call, conn, resp, wants_usage, tally)
        primed = await _prime(source, tally) if opts.quality else ([], None)
        first, problem = primed
        if problem is not None:
            resp.release()
            return await fail(
                "quality",
                ApiError(
                    502,
                    f"An upstream stream failed before any content ({problem})",
                    code="upstream_error",
                ),
                status=200,
                body=problem.encode(),
                settle_usage=tally.effective_usage(),
            )
        await _report_success(call, cand, snap, _ms_since(t_send))
        diag.attempt(label, "ok", status=200, latency_ms=_ms_since(t_send))
        headers["x-fairgate-overhead-ms"] = f"{(t_send - call.t0) * 1000:.3f}"
        res.keep()  # the stream settles it when it ends
        return _stream_response(
            call, conn, res, resp, upstream_model, headers, tally, source, first, lease
        )
    try:
        raw = await resp.read()
    except TRANSPORT_ERRORS as exc:
        return await fail(
            "upstream",
            ApiError(
                502,
                f"An upstream connection failed mid-answer ({type(exc).__name__})",
                code="upstream_error",
            ),
            exc=exc,
        )
    finally:
        resp.release()
    t_body = time.perf_counter()
    out, usage, obj = _translate_answer(call, conn, raw, upstream_model)
    problem = _quality_problem(call.route, obj) if opts.quality else None
    if problem is not None:
        return await fail(
            "quality",
            ApiError(
                502,
                f"An upstream answered 200 without a usable answer ({problem})",
                code="upstream_error",
            ),
            status=200,
            body=problem.encode(),
            settle_usage=usage or Usage(prompt_tokens=call.prompt_estimate),
        )
    lease.release()
    res.keep()  # settled by the answer's background task
    await _report_success(call, cand, snap, (t_body - t_send) * 1000, usage)
    diag.attempt(label, "ok", status=200, latency_ms=(t_body - t_send) * 1000)
    overhead = (time.perf_counter() - call.t0 - (t_body - t_send)) * 1000
    headers["x-fairgate-overhead-ms"] = f"{overhead:.3f}"
    # settle after the answer is on its way: the client need not wait for our bookkeeping
    # (the reservation holds the quota meanwhile, so nothing can overshoot)
    return Response(
        out,
        status_code=200,
        media_type="application/json",
        headers=headers,
        background=BackgroundTask(_settle, svc, res, conn, call, upstream_model, usage),
    )


async def _report_success(
    call: Call,
    cand: Candidate,
    snap: RateLimitSnapshot | None,
    latency_ms: float,
    usage: Usage | None = None,
) -> None:
    """``snap``: the rate-limit headers as parsed by the provider signals (None when they were
    not parsed this time: readings are taken at most once a second per connection)."""
    svc = call.svc
    if svc.gw.resilience is not None:
        await svc.gw.resilience.on_success(
            cand.conn.provider,
            cand.conn.id,
            cand.model,
            snapshot=snap,
            key_id=call.key.id,
            request_id=REQUEST_ID.get(),
        )
    tokens = 0 if usage is None else usage.prompt_tokens + usage.completion_tokens
    svc.record_attempt(cand, None, latency_ms, tokens)


def _quality_problem(route: Route, obj: dict[str, Any] | None) -> str | None:
    """Why a 200 is not a usable answer (SPEC §8): empty, an error inside, no finish, or a
    reasoning model that spent the whole budget thinking. None when it is fine."""
    if obj is None:
        return "not JSON"
    if obj.get("error"):
        return "error object in a 200"
    if route is Route.EMBEDDINGS:
        return None if obj.get("data") else "no embeddings"
    if route is Route.MESSAGES:
        blocks = obj.get("content") or []
        useful = any(
            (b.get("type") == "text" and b.get("text")) or b.get("type") == "tool_use"
            for b in blocks
            if isinstance(b, dict)
        )
        if not useful:
            return "empty content"
        return None if obj.get("stop_reason") else "no stop reason"
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return "no choices"
    choice = choices[0]
    msg = choice.get("message") or {}
    if not (isinstance(msg, dict) and (msg.get("content") or msg.get("tool_calls"))):
        details = (obj.get("usage") or {}).get("completion_tokens_details") or {}
        if choice.get("finish_reason") == "length" and details.get("reasoning_tokens"):
            return "reasoning used the whole budget, no content"
        return "empty content"
    return None if choice.get("finish_reason") else "no finish reason"


async def _prime(
    source: AsyncIterator[bytes], tally: relay.StreamTally
) -> tuple[list[bytes], str | None]:
    """Read a stream up to its first content (SPEC §8: validate on the first content chunk,
    then pass the rest through live). Returns what was read and, if the stream is no good
    (ended, broke or errored before any content), why."""
    first: list[bytes] = []
    try:
        async for chunk in source:
            first.append(chunk)
            if b'"error"' in chunk and tally.text_chars == 0:
                return first, "error event"
            if tally.text_chars > 0:
                return first, None
            if tally.finished:
                return first, "finished without content"
    except TRANSPORT_ERRORS as exc:
        return first, type(exc).__name__
    return first, "ended without content"


def _translate_answer(
    call: Call, conn: Connection, raw: bytes, upstream_model: str
) -> tuple[bytes, Usage | None, dict[str, Any] | None]:
    """The answer in the client's format, its usage, and the parsed answer (for validation)."""
    if conn.protocol is Protocol.RESPONSES:
        return upstream_responses_answer(raw, call.route is Route.MESSAGES, call.model)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw, None, None
    if not isinstance(obj, dict):
        return raw, None, None
    if conn.protocol is Protocol.ANTHROPIC:
        usage = _usage_anthropic(obj)
        if call.route is Route.CHAT:
            out = anthropic_to_openai_response(obj, call.model)
            return orjson.dumps(out), usage, out
        return raw, usage, obj
    usage = _usage_openai(obj)
    if call.route is Route.MESSAGES:
        out = openai_to_anthropic_response(obj, call.model)
        return orjson.dumps(out), usage, out
    return raw, usage, obj


async def _upstream_error(resp: UpstreamResponse, conn: Connection) -> tuple[ApiError, bytes]:
    """The upstream's error, made safe to show: its message (never our credentials) and status.

    The upstream rejecting our credentials is our misconfiguration, not the client's: 502.
    """
    try:
        raw = await resp.read_prefix(64 * 1024)
    except TRANSPORT_ERRORS:
        raw = b""
    finally:
        resp.release()
    message = ""
    try:
        obj = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
    message = _redact(message, conn)[:500] or f"Upstream returned HTTP {resp.status}"
    headers: dict[str, str] = {}
    if resp.status in (401, 403):
        err = ApiError(
            502,
            "An upstream rejected the gateway's credentials",
            code="upstream_auth_error",
        )
        return err, raw
    retry_after = resp.headers.get("retry-after")
    if retry_after and resp.status in (429, 503, 529):
        headers["retry-after"] = retry_after
    status = resp.status if resp.status < 600 else 502
    if status == 529:
        status = 503
    return ApiError(status, message, code="upstream_error", headers=headers), raw


def _retry_ms(err: ApiError) -> int | None:
    raw = err.headers.get("retry-after")
    return int(raw) * 1000 if raw and raw.isdigit() else None


async def _report_stream_failure(
    call: Call, conn: Connection, model: str, exc: BaseException
) -> None:
    await _report_failure(call, conn, model, None, None, None, exc)


def _ms_since(t: float) -> float:
    return (time.perf_counter() - t) * 1000


async def _report_failure(
    call: Call,
    conn: Connection,
    model: str,
    status: int | None,
    body: bytes | None,
    headers: Mapping[str, str] | None,
    exc: BaseException | None,
) -> Classification:
    """Classify a failed attempt and let cooldowns, lockouts and breakers learn from it, naming
    the client key and request as the cause of any block it sets."""
    mgr = call.svc.gw.resilience
    cls = classify(
        status, body, headers, exception=exc, model=model, now_ms=call.svc.gw.clock.now_ms()
    )
    if mgr is not None:
        await mgr.on_failure(
            conn.provider,
            conn.id,
            model,
            conn.auth_type,
            cls,
            key_id=call.key.id,
            request_id=REQUEST_ID.get(),
        )
    return cls


def _redact(text: str, conn: Connection) -> str:
    if conn.secret and conn.secret in text:
        text = text.replace(conn.secret, "[redacted]")
    return text


@tracing.traced("fairgate.settle", tracing.settle_attrs, call_of=tracing.call_of_settle)
async def _settle(
    svc: Services,
    res: Reservation,
    conn: Connection,
    call: Call,
    upstream_model: str,
    usage: Usage | None,
) -> None:
    if usage is None:
        usage = Usage(prompt_tokens=call.prompt_estimate, completion_tokens=call.max_output)
    tokens = float(usage.prompt_tokens + usage.completion_tokens)
    svc.signals.add_tokens(conn.id, call.key.id, tokens)
    await res.settle(
        {
            Unit.REQUESTS: 1.0,
            Unit.TOKENS: tokens,
            Unit.USD: svc.prices.cost_usd(upstream_model, usage),
            Unit.PERCENT: 0.0,  # charged by attribution when the provider's reading moves
        },
    )


def _stream_source(
    call: Call,
    conn: Connection,
    resp: UpstreamResponse,
    wants_usage: bool,
    tally: relay.StreamTally,
) -> AsyncIterator[bytes]:
    """The relay that turns this upstream stream into the client's format."""
    sid = uuid.uuid4().hex[:24]
    if call.route is Route.MESSAGES:
        if conn.protocol is Protocol.ANTHROPIC:
            return relay.anthropic_to_anthropic(resp, tally)
        if conn.protocol is Protocol.RESPONSES:
            return relay.responses_to_anthropic(resp, tally, model=call.model, id_=f"msg_{sid}")
        return relay.openai_to_anthropic(resp, tally, model=call.model, id_=f"msg_{sid}")
    if conn.protocol is Protocol.RESPONSES:
        return relay.responses_to_openai(
            resp,
            tally,
            model=call.model,
            client_wants_usage=wants_usage,
            created=int(time.time()),
            id_=f"chatcmpl-{sid}",
        )
    if conn.protocol is Protocol.ANTHROPIC:
        return relay.anthropic_to_openai(
            resp,
            tally,
            model=call.model,
            client_wants_usage=wants_usage,
            created=int(time.time()),
            id_=f"chatcmpl-{sid}",
        )
    return relay.openai_to_openai(resp, tally, client_wants_usage=wants_usage)


def _stream_response(
    call: Call,
    conn: Connection,
    res: Reservation,
    resp: UpstreamResponse,
    upstream_model: str,
    headers: dict[str, str],
    tally: relay.StreamTally,
    source: AsyncIterator[bytes],
    first: list[bytes],
    lease: Lease,
) -> StreamingResponse:
    svc = call.svc
    anthropic_client = call.anthropic_client

    async def body() -> AsyncIterator[bytes]:
        try:
            for chunk in first:  # what was read to validate the stream, then the rest live
                yield chunk
            async for chunk in source:
                yield chunk
        except TRANSPORT_ERRORS as exc:
            svc.spawn(_report_stream_failure(call, conn, upstream_model, exc))
            log.warning(
                "upstream stream broke", extra={"connection": conn.id, "error": type(exc).__name__}
            )
            yield _stream_error_event(anthropic_client, type(exc).__name__)
        finally:
            # runs also when the client went away (this generator is then cancelled): the
            # settlement is its own task, so neither the cancellation nor the client waits on it
            resp.release()
            lease.release()
            svc.spawn(_settle(svc, res, conn, call, upstream_model, tally.effective_usage()))

    return StreamingResponse(
        body(),
        status_code=200,
        media_type="text/event-stream",
        headers={**headers, "cache-control": "no-cache"},
    )


def _stream_error_event(anthropic_client: bool, what: str) -> bytes:
    msg = f"Upstream stream interrupted ({what})"
    if anthropic_client:
        data = {"type": "error", "error": {"type": "api_error", "message": msg}}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"
    return (
        b"data: "
        + orjson.dumps({"error": {"message": msg, "type": "api_error", "code": "upstream_error"}})
        + b"\n\n"
    )


RouteHandler = Callable[[Request], Any]
