"""One attempt on one connection: encode, send, read or relay, validate, settle.

Every outcome is reported once: to the resilience manager (cooldowns, lockouts and breakers
learn from a failure; a success clears them) and to the per-target metrics the strategies
read; a failure also to the diagnostics (they are only ever shown for a request that got no
answer, so a success builds nothing for them). A failure gets its ``step`` from the one
failover rule (:mod:`fairgate.resilience.failover`); the executor acts on it. The reservation
is settled by the answer (in the background once a non-stream answer is sent, when a stream
ends), or by a failure the upstream did work for; otherwise its owner releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

import orjson

from fairgate.clock import Clock
from fairgate.domain.connections import Connection
from fairgate.domain.readings import RateLimitSnapshot
from fairgate.domain.units import Unit
from fairgate.formats.translate import CannotCarry
from fairgate.formats.usage import Usage
from fairgate.path import relay
from fairgate.path.call import Call, Candidate, ExecOptions, Services
from fairgate.path.diagnostics import Diagnostics
from fairgate.path.exchange import EXCHANGES, Exchange, quality_problem, stream_error_event
from fairgate.path.outcome import Outcome
from fairgate.path.provider_signals import PercentCharge, Reading
from fairgate.path.reservation import Reservation
from fairgate.path.validation import validation_problem
from fairgate.process import tracing
from fairgate.process.errors import ApiError
from fairgate.process.logs import MASK, REDACTOR, REQUEST_ID
from fairgate.providers.transport import TRANSPORT_ERRORS, UpstreamResponse
from fairgate.providers.upstream import UpstreamAuthUnavailable
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Pool
from fairgate.quota.outcomes import Admission
from fairgate.resilience.classify import Classification, FailureClass, classify
from fairgate.resilience.evidence import request_explains
from fairgate.resilience.failover import Step, same_model_is_futile, step_after
from fairgate.routing import (
    Lease,
)
from fairgate.routing.model import ReasoningBuffer

log = logging.getLogger("fairgate.proxy")

#: Failure kinds that are a 200 the gateway refused (no failure class of the upstream's).
_BAD_200 = frozenset({"quality", "validation"})

#: Units whose reservation an unbounded answer could overrun (all but the request count: a
#: percent estimate is made from tokens too).
_BOUNDED_UNITS = frozenset(u for u in Unit if u is not Unit.REQUESTS)


@tracing.traced(
    "fairgate.attempt",
    tracing.attempt_attrs,
    tracing.attempt_result,
    call_of=tracing.call_of_attempt,
)
async def attempt(
    call: Call,
    cand: Candidate,
    pool: Pool | None,
    adm: Admission,
    res: Reservation,
    lease: Lease,
    *,
    diag: Diagnostics,
    opts: ExecOptions,
) -> Outcome | ApiError:
    """The answer on success; ApiError (its ``step`` from the failover rule) otherwise.

    Every outcome is reported to the resilience manager (cooldowns, lockouts, breakers learn
    from it) and to the per-target metrics the strategies read; a failure also to the
    diagnostics. The request holds its slot (``lease``) on the target until its answer (or
    stream) ends; the reservation is settled by the answer, or by a failure the upstream did
    work for.
    """
    with _attempted(call, cand, res, lease, opts):
        svc = call.svc
        conn, upstream_model = cand.conn, cand.model
        exchange = EXCHANGES[(call.route, conn.protocol)]
        path = exchange.path
        encoded = _encoded(call, exchange, conn, upstream_model, _output_bound(call, pool, res))
        if isinstance(encoded, ApiError):  # no target helps: the request cannot be sent as it is
            lease.release()
            await res.release()
            return encoded
        payload, wants_usage = encoded
        t_send = time.perf_counter()
        sent_ms = svc.state.clock.now_ms()  # the injected clock: what the evidence rule measures
        reading: Reading | None = None  # the answer's provider reading, attributed at settlement

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
            if (
                settle_usage is not None
            ):  # the upstream did the work: charge it even though it failed
                await _settle(svc, res, conn, call, upstream_model, settle_usage, reading)
            else:
                await res.release()
            verdict = (
                _CREDENTIAL_VERDICT
                if kind == "credential"
                else await _report_failure(
                    call,
                    conn,
                    upstream_model,
                    status,
                    body,
                    headers,
                    exc,
                    sent_ms=sent_ms,
                    request=payload,
                )
            )
            err = _for_the_client(err, status, verdict)
            cls = verdict.cls.value
            latency = _ms_since(t_send)
            svc.record_attempt(cand, "connect_error" if kind == "connect_error" else cls, latency)
            diag.attempt(
                cand.label,
                kind if kind != "upstream" else cls,
                status=status,
                latency_ms=latency,
                error=None if exc is None else type(exc).__name__,
            )
            err.failure = "connect_error" if kind == "connect_error" else cls
            # the one failover rule (a bad 200 is no class: another target may do better)
            failure = None if kind in _BAD_200 else verdict.cls
            err.step = step_after(failure)
            err.final = err.step is Step.END
            err.same_model_futile = same_model_is_futile(failure)
            if kind == "validation":
                err.failure = "validation"
                if opts.combo is not None:  # a pinned session is not sent back to this target
                    svc.strategy_state.release(opts.combo, call.key.id, cand.target.key)
            return err

        try:
            resp = await svc.upstream.post(conn, path, payload, call.headers)
        except UpstreamAuthUnavailable as exc:
            log.warning("upstream credential unusable", extra={"connection": conn.id})
            return await fail(
                "credential",
                ApiError(
                    503,
                    f"The credential of connection '{conn.id}' is unusable: "
                    "an admin must log in again",
                    code="credential_unusable",
                ),
                exc=exc,
            )
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
        reading, charges = svc.signals.observe(
            conn.id, upstream_model, resp.headers, force=resp.status >= 400, defer=resp.status < 400
        )
        snap = None if reading is None else reading.snap
        if pool is not None and snap is not None:
            await _apply_readings(svc.state.engine, pool, conn.id, snap, charges)
        if resp.status >= 400:
            err, raw_err = await _upstream_error(resp, conn)
            log.warning("upstream error", extra={"connection": conn.id, "status": resp.status})
            return await fail(
                "upstream", err, status=resp.status, body=raw_err, headers=resp.headers
            )
        omitted, tools = _left_out(call, exchange)
        if call.stream:
            tally = relay.StreamTally(prompt_estimate=call.prompt_estimate)
            source = exchange.relay(call, resp, wants_usage, tally)
            first, problem = await _primed(call, opts, source, tally, resp)
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
            res.keep()  # the stream settles it when it ends
            return Outcome(
                chunks=_stream_chunks(
                    call,
                    conn,
                    res,
                    resp,
                    upstream_model,
                    tally,
                    source,
                    first,
                    lease,
                    sent_ms,
                    reading,
                ),
                sse=True,
                served_by=conn.id,
                combo=opts.combo,
                overhead_ms=(t_send - call.t0) * 1000,
                admission=adm,
                omitted=omitted,
                tools_omitted=tools,
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
        out, usage, obj = exchange.answer(call, raw, upstream_model)
        kind, problem = _answer_problem(call, opts, obj)
        if problem is not None:
            return await fail(
                kind,
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
        overhead = (time.perf_counter() - call.t0 - (t_body - t_send)) * 1000
        # settle after the answer is on its way: the client need not wait for our bookkeeping
        # (the reservation holds the quota meanwhile, so nothing can overshoot)
        if res.open or tracing.active() or reading is not None:
            settle: Callable[[], Awaitable[None]] | None = functools.partial(
                _settle, svc, res, conn, call, upstream_model, usage, reading
            )
        else:  # nothing reserved (no pool), no span to record: no task, only the tokens to count
            settle = None
            _count_tokens(svc, conn, call, usage, reading)
        return Outcome(
            out,
            served_by=conn.id,
            combo=opts.combo,
            overhead_ms=overhead,
            usage=usage,
            admission=adm,
            omitted=omitted,
            tools_omitted=tools,
            pending=settle,
        )


@contextlib.contextmanager
def _attempted(
    call: Call, cand: Candidate, res: Reservation, lease: Lease, opts: ExecOptions
) -> Iterator[None]:
    """What surrounds an attempt: the DRR scheduler learns it was dispatched; one left by an
    exception (a combo timeout, a shadow's abort or a bug) gives its slot back (the reservation
    is released by its owner on the way out), and a hedge's loser, whose upstream started (and
    bills) the work, has its prompt charged."""
    if opts.drr is not None:
        opts.drr.dispatch(cand.target)
    try:
        yield
    except BaseException as exc:
        lease.release()
        if opts.charge_if_cancelled and isinstance(exc, asyncio.CancelledError) and res.open:
            res.keep()
            usage = Usage(prompt_tokens=call.prompt_estimate)
            call.svc.spawn(_settle(call.svc, res, cand.conn, call, cand.model, usage))
        raise


def _output_bound(call: Call, pool: Pool | None, res: Reservation) -> int | None:
    """The output bound to send a request that names none: the one its reservation counted,
    when the pool that admitted it meters tokens, dollars or percent (else None: the upstream's
    own default, as the client asked)."""
    if pool is None or not res.open or not pool.cost_units & _BOUNDED_UNITS:
        return None
    return call.max_output


#: Our own credential is unusable (found out by this attempt; the credential gate skips the
#: connection from here on): nothing reached the provider, so nothing counts against it.
_CREDENTIAL_VERDICT = Classification(FailureClass.AUTH, retry_elsewhere=True, signal="credential")


def _encoded(
    call: Call, exchange: Exchange, conn: Connection, upstream_model: str, bound: int | None
) -> tuple[bytes, bool] | ApiError:
    """The upstream request body, or the final 400 when it cannot be encoded for this wire."""
    try:
        return exchange.body(call, upstream_model, bound, conn.billing_fields)
    except orjson.JSONEncodeError:  # e.g. nested too deeply once translated
        err = ApiError(
            400, "The request body cannot be encoded for the upstream (nested too deeply)"
        )
    except CannotCarry as exc:  # a field this upstream's wire cannot express: never dropped
        err = ApiError(
            400,
            f"'{exc.field}': {exc.message} (the upstream chosen speaks the "
            f"{conn.protocol.value} wire)",
            param=exc.field,
            code="unsupported_for_upstream",
        )
    err.final, err.step = True, Step.END
    return err


def _left_out(call: Call, exchange: Exchange) -> tuple[str | None, str | None]:
    """What the translation left out (never silently, issue 42): the request's fields, and
    its hosted tools, each as the list the edge shows (None: nothing)."""
    omitted = exchange.omitted(call)
    tools = exchange.tools_omitted(call)
    return (", ".join(omitted) if omitted else None), (", ".join(tools) if tools else None)


def _answer_problem(
    call: Call, opts: ExecOptions, obj: dict[str, object] | None
) -> tuple[str, str | None]:
    """Why a non-stream 200 is refused, and by which check: ``quality`` (empty, cut off,
    reasoning only) or the combo's ``validation`` (patterns, requested schema)."""
    problem = quality_problem(call.route, obj) if opts.quality else None
    if problem is None and obj is not None and opts.validation.active:
        return "validation", validation_problem(opts.validation, call.route, call.body, obj)
    return "quality", problem


async def _apply_readings(
    engine: QuotaEngine,
    pool: Pool,
    connection_id: str,
    snap: RateLimitSnapshot,
    charges: Sequence[PercentCharge],
) -> None:
    """A provider's percent readings, into the pool: each window that states its reset anchors
    the pool's window of that length there (first, so the charges land in the provider's
    current window), then each rise is charged to the keys (``ProviderSignals.observe``)."""
    for reading in snap.percent_windows:
        if reading.reset_ms is not None and reading.window_ms is not None:
            await engine.anchor(
                pool, reading.counter, reading.window_ms, reading.reset_ms, connection_id
            )
    for ch in charges:
        await engine.record(pool, ch.key_id, {ch.counter: ch.amount})


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
    if svc.state.resilience is not None:
        await svc.state.resilience.on_success(
            cand.conn.provider,
            cand.conn.id,
            cand.model,
            snapshot=snap,
            key_id=call.key.id,
            request_id=REQUEST_ID.get(),
        )
    tokens = 0 if usage is None else usage.prompt_tokens + usage.completion_tokens
    svc.record_attempt(cand, None, latency_ms, tokens)
    svc.state.registry.served_by_wildcard(cand.conn, cand.model)  # for /v1/models


async def _primed(
    call: Call,
    opts: ExecOptions,
    source: AsyncIterator[bytes],
    tally: relay.StreamTally,
    resp: UpstreamResponse,
) -> tuple[list[bytes], str | None]:
    """:func:`_prime` when the stream is validated or its reasoning held, else nothing read;
    the upstream answer is released if this is cancelled (a hedge's loser, a combo timeout)."""
    hold = _reasoning_hold(call, opts)
    if not opts.quality and hold is None:
        return [], None
    try:
        return await _prime(source, tally, hold, call.svc.state.clock)
    except BaseException:
        resp.release()
        raise


#: The request header with which a client asks to see reasoning as it comes
#: (``x-fairgate-reasoning: live``): a combo's reasoning buffer is never applied to it.
REASONING_HEADER = "x-fairgate-reasoning"


def _reasoning_hold(call: Call, opts: ExecOptions) -> ReasoningBuffer | None:
    """The combo's reasoning buffer for this request, unless the client asked to see
    reasoning live."""
    if opts.reasoning is None or call.headers.get(REASONING_HEADER, "").lower() == "live":
        return None
    return opts.reasoning


async def _prime(
    source: AsyncIterator[bytes],
    tally: relay.StreamTally,
    hold: ReasoningBuffer | None = None,
    clock: Clock | None = None,
) -> tuple[list[bytes], str | None]:
    """Read a stream up to its first content (SPEC §8: validate on the first content chunk,
    then pass the rest through live). Returns what was read and, if the stream is no good
    (ended without a finish, broke or errored before any content), why. A stream that finishes
    with nothing in it is an answer (an empty turn), not a failure.

    With ``hold`` (a combo's reasoning buffer, issue 46) reasoning is no content: it is held
    until the first content or tool token, within ``max_bytes`` and ``max_ms`` (checked as each
    event arrives; past either the stream is passed through as it is); a stream that ends in
    reasoning only because its budget ran out is a failure the combo fails over from before
    the client saw a byte. What was held is sent first, in order."""
    first: list[bytes] = []
    held = 0
    started = 0 if clock is None else clock.now_ms()

    def said() -> int:
        return tally.text_chars if hold is None else tally.answer_chars

    try:
        async for chunk in source:
            first.append(chunk)
            if said() == 0 and (
                tally.failed or (tally.scan_errors and chunk.find(b'"error"') != -1)
            ):  # find: see sse.py
                return first, "error event"
            if said() > 0:
                return first, None
            if tally.finished:
                if hold is not None and tally.reasoning_chars and tally.truncated:
                    async for _rest in source:  # the usage that follows the finish
                        pass
                    return first, "reasoning used the whole budget, no content"
                return first, None
            if hold is not None:
                held += len(chunk)
                waited = 0 if clock is None else clock.now_ms() - started
                if held > hold.max_bytes or waited > hold.max_ms:
                    return first, None  # bounded: pass it through from here
    except TRANSPORT_ERRORS as exc:
        return first, type(exc).__name__
    return first, "ended without content"


#: Upstream failures whose status would mislead the client (and its SDK's retries), by the
#: status and the class found: the status, message and code the client gets instead.
_REWORDED: Mapping[tuple[int, FailureClass], tuple[int, str, str]] = {
    # a request too large for the account's per-minute budget (issue 43, N1): retrying it can
    # never help, so it is no 429 (an SDK would retry it) and has no Retry-After
    (429, FailureClass.CONTEXT_OVERFLOW): (
        413,
        "The request is too large for the upstream account's per-minute limit: "
        "reduce the input or max_tokens",
        "request_too_large",
    ),
    # a bare 403 (a WAF page) is the request's, not our credentials (issue 43, N6): the
    # sender's own 403, not a 502 about the gateway's configuration
    (403, FailureClass.BAD_REQUEST): (
        403,
        "An upstream refused this request (HTTP 403 without a provider error); "
        "it would be refused on every account",
        "upstream_error",
    ),
}


def _for_the_client(err: ApiError, status: int | None, verdict: Classification) -> ApiError:
    """The error the sender sees for an upstream failure, once it is classified: the class
    may show that the upstream's status would mislead the client (and its SDK's retries)."""
    reworded = None if status is None else _REWORDED.get((status, verdict.cls))
    if reworded is not None:
        shown, message, code = reworded
        return ApiError(shown, message, code=code)
    if status == 429 and "retry-after" not in err.headers and verdict.retry_after_ms:
        # the reset a provider states in its body (Codex resets_at / resets_in_seconds)
        err.headers["retry-after"] = str(max(1, math.ceil(verdict.retry_after_ms / 1000)))
    return err


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
    message, kind = "", ""
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
        if isinstance(err, dict):
            kind = next((v for f in ("type", "code") if _KIND.match(v := str(err.get(f)))), "")
    message = _redact(message, conn)[:500] or f"Upstream returned HTTP {resp.status}"
    if resp.status in _ACCOUNT_STATE:
        # the text describes the shared account (its organisation, its limits, its use): the
        # admin reads it in the log; the tenant gets fairgate's words and the provider's type
        log.info(
            "upstream error text",
            extra={"connection": conn.id, "status": resp.status, "error": message},
        )
        message = _account_message(resp.status, kind)
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


async def _report_stream_failure(
    call: Call, conn: Connection, model: str, exc: BaseException, sent_ms: int
) -> None:
    await _report_failure(call, conn, model, None, None, None, exc, sent_ms=sent_ms)


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
    *,
    sent_ms: int,
    request: bytes | None = None,
) -> Classification:
    """Classify a failed attempt and let cooldowns, lockouts and breakers learn from it, naming
    the client key and request as the cause of any block it sets, and saying whether the
    request's own size or duration explains the failure (then it is the request's alone:
    issue 43, N3, :mod:`fairgate.resilience.evidence`). ``request`` is the body sent upstream:
    an error body that echoes it is not the provider's word (issue 43, N9)."""
    mgr = call.svc.state.resilience
    now = call.svc.state.clock.now_ms()
    cls = classify(status, body, headers, exception=exc, model=model, now_ms=now, request=request)
    call.svc.signals.refused(conn.id, model, cls)
    if mgr is not None:
        explained = request_explains(
            cls,
            answered=status is not None and status >= 400,
            output_bound=call.output_reserved,
            prompt_tokens=call.prompt_estimate,
            elapsed_ms=now - sent_ms,
        )
        await mgr.on_failure(
            conn.provider,
            conn.id,
            model,
            conn.auth_type,
            cls,
            key_id=call.key.id,
            request_id=REQUEST_ID.get(),
            request_explained=explained,
        )
    return cls


#: Statuses whose error text is about the shared account, not the request (issue 43, N14).
_ACCOUNT_STATE = frozenset({402, 429, *range(500, 600)})
#: A provider's error type or code as shown to a tenant: an identifier, nothing else.
_KIND = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def _account_message(status: int, kind: str) -> str:
    """What a tenant reads for an answer about the shared account: fairgate's words and the
    provider's error type (``rate_limit_exceeded``), never its text, which names the account's
    organisation, its limits and its use (``Limit 30000, Used 29990``)."""
    what = (
        "the upstream account is rate limited"
        if status == 429
        else "the upstream account has a billing problem"
        if status == 402
        else "the upstream failed or is overloaded"
    )
    return f"Upstream HTTP {status}: {what}" + (f" ({kind})" if kind else "")


def _redact(text: str, conn: Connection) -> str:
    """An upstream's error text with no credential in it: the connection's stored secret, and
    whatever looks like one (an OAuth access token the gateway sent in its place, which the
    stored secret is not; a ``Bearer`` value, an ``sk-`` key, a JWT), by the logs' own rules."""
    if conn.secret and conn.secret in text:
        text = text.replace(conn.secret, MASK)
    return REDACTOR(text)


def _count_tokens(
    svc: Services,
    conn: Connection,
    call: Call,
    usage: Usage | None,
    reading: Reading | None = None,
) -> tuple[Usage, float, list[PercentCharge]]:
    """The usage to charge (the estimate when the upstream reported none) and its tokens, which
    the percent attribution of ``conn`` counts for the key whether or not a pool reserved
    anything; then the reading the answer carried is attributed, this request's own tokens
    included (its rise is this request's: issue 44, item 3). Returns the percent charges."""
    if usage is None:
        usage = Usage(prompt_tokens=call.prompt_estimate, completion_tokens=call.output_reserved)
    tokens = float(usage.prompt_tokens + usage.completion_tokens)
    charges = svc.signals.attribute(conn.id, call.key.id, tokens, reading)
    return usage, tokens, charges


@tracing.traced("fairgate.settle", tracing.settle_attrs, call_of=tracing.call_of_settle)
async def _settle(
    svc: Services,
    res: Reservation,
    conn: Connection,
    call: Call,
    upstream_model: str,
    usage: Usage | None,
    reading: Reading | None = None,
) -> None:
    usage, tokens, charges = _count_tokens(svc, conn, call, usage, reading)
    if charges:
        pool = svc.state.registry.pool_by_connection.get(conn.id)
        if pool is not None:
            for ch in charges:
                await svc.state.engine.record(pool, ch.key_id, {ch.counter: ch.amount})
    if not res.open:  # no reservation to settle (no pool, or it ended already): no price
        return
    await res.settle(
        {
            Unit.REQUESTS: 1.0,
            Unit.TOKENS: tokens,
            Unit.USD: svc.prices.cost_usd(upstream_model, usage),
            Unit.PERCENT: 0.0,  # charged by attribution when the provider's reading moves
        },
    )


def _stream_chunks(
    call: Call,
    conn: Connection,
    res: Reservation,
    resp: UpstreamResponse,
    upstream_model: str,
    tally: relay.StreamTally,
    source: AsyncIterator[bytes],
    first: list[bytes],
    lease: Lease,
    sent_ms: int,
    reading: Reading | None = None,
) -> AsyncIterator[bytes]:
    """The stream's events for the client: what was read to validate it, then the rest live;
    when it ends, breaks or is closed, the upstream answer and the slot are given back and
    the reservation settled with what was streamed."""
    svc = call.svc
    route = call.route

    async def body() -> AsyncIterator[bytes]:
        try:
            for chunk in first:  # what was read to validate the stream, then the rest live
                yield chunk
            async for chunk in source:
                yield chunk
        except TRANSPORT_ERRORS as exc:
            svc.spawn(_report_stream_failure(call, conn, upstream_model, exc, sent_ms))
            log.warning(
                "upstream stream broke", extra={"connection": conn.id, "error": type(exc).__name__}
            )
            yield stream_error_event(route, type(exc).__name__)
        finally:
            # runs also when the client went away (this generator is then cancelled): the
            # settlement is its own task, so neither the cancellation nor the client waits on it
            resp.release()
            lease.release()
            usage = tally.effective_usage()
            if res.open or tracing.active() or reading is not None:
                svc.spawn(_settle(svc, res, conn, call, upstream_model, usage, reading))
            else:  # nothing reserved (no pool), no span to record: no task
                _count_tokens(svc, conn, call, usage)

    return body()
