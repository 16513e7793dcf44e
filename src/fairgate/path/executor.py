"""The executor: one call's way through its ordered candidates.

Per candidate: a concurrency slot (:mod:`fairgate.path.slots`), the resilience check, the
admission against the candidate's pool (a :class:`~fairgate.path.reservation.Reservation`
that is settled or released exactly once), a soft-penalised admission held while unpenalised
candidates are tried, then attempts (:mod:`fairgate.path.attempt`) with retries, fall-through
pauses and the failover rule. When nothing can be tried now: the FIFO queue for a slot, the
bounded wait for a cooling target, or the error that says why, with diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from fairgate.domain.connections import Connection
from fairgate.domain.units import Unit
from fairgate.formats.usage import Usage, estimate_prompt_tokens
from fairgate.path.attempt import attempt
from fairgate.path.call import Call, Candidate, ExecOptions
from fairgate.path.context_fit import compress_messages, window_of
from fairgate.path.diagnostics import Diagnostics, Terminal
from fairgate.path.outcome import Outcome
from fairgate.path.quota_headers import quota_headers
from fairgate.path.reservation import Reservation
from fairgate.process import credentials, tracing
from fairgate.process.client_request import ClientRequest
from fairgate.process.errors import ApiError
from fairgate.process.events import AdmissionEvent
from fairgate.quota.decision import Reason
from fairgate.quota.hold import MAX_WAIT_HEADER, client_max_wait_ms
from fairgate.quota.messages import block_message
from fairgate.quota.model import Pool
from fairgate.quota.outcomes import ALLOW_UNGOVERNED, Admission
from fairgate.resilience.failover import Step
from fairgate.resilience.manager import Exclusion, all_rate_limited
from fairgate.routing import (
    Lease,
)
from fairgate.routing.model import (
    GLOBAL_MAX_ATTEMPTS,
)

_T = TypeVar("_T")


@dataclass
class Blocked:
    conn: Connection
    admission: Admission


async def execute(
    call: Call,
    cands: list[Candidate],
    diag: Diagnostics,
    opts: ExecOptions | None = None,
) -> Outcome:
    """Try the candidates in order until one answers.

    A candidate is skipped when resilience excludes it (breaker open, cooling down, model locked,
    permanently blocked, rate-limited until a learned reset) or its pool blocks the key; one at
    its concurrency cap is queued for (FIFO, bounded) once nothing else is left; a soft admission
    is held while an unpenalised candidate is looked for, unless the order came from a combo's
    strategy, which already scored the penalty (``ExecOptions.soft_ordered``); after a failure
    the one failover rule (:mod:`fairgate.resilience.failover`) retries, moves on or ends the
    request. When nothing can be tried now but a target frees within ``max_wait_ms``, the
    request waits for it. When nothing answers, the error says why, with diagnostics. Every
    reservation taken here is settled by the answer or released on the way out, cancellation
    included.
    """
    run = _Execution(call, diag, opts or ExecOptions())
    try:
        resp = await run.serve(cands)
    except BaseException:
        run.end_reservations_soon()
        raise
    finally:
        if run.held is not None:
            run.held.lease.release()
    await run.end_reservations()
    return resp


@dataclass
class _Admitted:
    """A candidate that got a slot and an admission: what an attempt needs."""

    cand: Candidate
    pool: Pool | None
    adm: Admission
    res: Reservation
    lease: Lease


class _Execution:
    """One request's way through its candidates (the state :func:`execute` keeps)."""

    def __init__(self, call: Call, diag: Diagnostics, opts: ExecOptions) -> None:
        self.call, self.diag, self.opts = call, diag, opts
        self.svc = call.svc
        self.timer = call.svc.state.timer
        #: every reservation taken, oldest first: each is ended on the way out, as an
        #: ``async with`` would (a list, not an exit stack: a twentieth of its cost per request)
        self.reservations: list[Reservation] = []
        self.blocked: list[Blocked] = []
        self.exclusions: list[Exclusion] = []
        #: connections the credential gate skipped (``connection id: the admin's action``)
        self.unusable: dict[str, str] = {}
        self.last_error: ApiError | None = None
        #: the soonest Retry-After (ms) of the 429s the attempts got: when every target failed,
        #: the first moment one of them said it may serve again
        self.soonest_retry_ms: int | None = None
        self.blocked_pools: set[str] = set()
        self.full: list[Candidate] = []  # at their concurrency cap in this pass
        self.failed: list[Candidate] = []  # attempted and failed in this pass
        self.queue: list[Candidate] = []
        self.held: _Admitted | None = None  # a penalised admission, kept while looking on
        self.attempts = 0  # in this pass
        self.total_attempts = 0
        self.wait_spent = 0  # ms of cooldown waits asked for (the max_wait_ms budget)
        #: the call a candidate is sent when its context window needed a compressed
        #: conversation (by candidate label), with how many messages were dropped
        self.fitted: dict[str, tuple[Call, int]] = {}

    async def end_reservations(self) -> None:
        """(The request got its answer) release what no answer kept, newest first; if that is
        cancelled, the rest go in tasks of their own."""
        todo = self.reservations
        while todo:
            res = todo.pop()
            try:
                await res.close()
            except BaseException:
                self.end_reservations_soon()
                raise

    def end_reservations_soon(self) -> None:
        """(The request failed or was cancelled) release what no answer kept, in tasks."""
        todo = self.reservations
        while todo:
            todo.pop().abandon()

    def _capped(self) -> bool:
        return self.attempts >= self.opts.attempt_cap or self.total_attempts >= GLOBAL_MAX_ATTEMPTS

    async def serve(self, cands: list[Candidate]) -> Outcome:
        while True:
            resp = await self._pass(cands)
            if resp is not None:
                return resp
            if self.full:
                resp = await self._queue_for_slot()
                if resp is not None:
                    return resp
            wake = await self._next_free_ms()
            if wake is None:
                raise self._no_answer()
            await self._sleep_until(wake)
            # a fresh pass: its own attempt cap (the waits bound how many passes there are)
            self.blocked, self.exclusions, self.blocked_pools = [], [], set()
            self.unusable = {}
            self.full, self.failed = [], []
            self.attempts = 0

    async def _pass(self, cands: list[Candidate]) -> Outcome | None:
        self.queue = list(cands)
        while self.queue:
            cand = self.queue.pop(0)
            if self._capped():
                self.diag.exclude(cand.label, "attempt-cap")
                continue
            if self.opts.fit_context and not self._fits(cand):
                continue
            lease = await self.svc.slots.try_acquire(
                cand.target, cand.conn.max_concurrent, self.call.key.id
            )
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

    def _call_for(self, cand: Candidate) -> Call:
        """The call as ``cand`` is sent it: compressed to fit its window, or as it came."""
        fitted = self.fitted.get(cand.label)
        return self.call if fitted is None else fitted[0]

    def _fits(self, cand: Candidate) -> bool:
        """Whether ``cand`` can take the conversation (issue 46): its context window (its
        own, else the catalogue's) holds the prompt and the output bound; else, with the
        combo's compression rule, a compressed conversation that fits is made for it; else it
        is skipped (``context-window``) instead of spending an attempt on a certain 400."""
        call = self.call
        window = window_of(cand.target.context_window, cand.model)
        if window is None or call.prompt_estimate + call.output_reserved <= window:
            return True
        rule = self.opts.compression
        if cand.label not in self.fitted and rule is not None:
            squeezed = compress_messages(call.body, rule.keep_last_turns)
            if squeezed is not None:
                body, dropped = squeezed
                tokens = estimate_prompt_tokens(body)
                if tokens + call.output_reserved <= window:
                    sub = dataclasses.replace(call, body=body, prompt_estimate=tokens)
                    self.fitted[cand.label] = (sub, dropped)
        if cand.label in self.fitted:
            return True
        self.diag.exclude(cand.label, "context-window")
        return False

    async def _consider(self, cand: Candidate, lease: Lease) -> Outcome | None:
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
        if a.adm.penalized and self.held is None and more and not self.opts.soft_ordered:
            self.held = a  # soft, unscored order: look for an unpenalised candidate first
            return None
        # a held admission stays until something answers: if the unpenalised candidates all
        # fail, it serves (it is released on the way out when it was not needed)
        return await self._attempt(a)

    async def _admit(self, cand: Candidate, lease: Lease) -> _Admitted | None:
        conn, mgr = cand.conn, self.svc.state.resilience
        now = self.svc.state.clock.now_ms()
        oauth = self.svc.state.oauth
        tokens = None if oauth is None else oauth.tokens
        cred = await credentials.gate(conn, cand.model, tokens, now)
        if not cred.usable:  # known unusable: never attempted, never counted against anything
            self.unusable[conn.id] = f"{cred.action} ({cred.problem})"
            self.diag.exclude(cand.label, f"credential:{cred.problem}")
            return None
        if mgr is not None:
            excl = await mgr.check(conn.provider, conn.id, cand.model, conn.auth_type)
            if excl is not None:
                excl = self._until_the_providers_reset(excl, cand)
                self.exclusions.append(excl)
                self.diag.exclude(cand.label, excl.reason, excl.until_ms, now)
                return None
        pool = self.svc.state.registry.pool_by_connection.get(conn.id)
        if pool is not None and pool.id in self.blocked_pools:
            self.diag.exclude(cand.label, "quota:pool-blocked")
            return None  # counters are per pool: its other members would block this request too
        admitting = _admit(self._call_for(cand), conn, pool, cand.model, on_hold=lease.release)
        if pool is not None and pool.hold.holds:  # it may wait: the client may go away
            adm = await self._watching_client(admitting)
        else:
            adm = await admitting
        if adm.allowed and lease.released:  # held (admission: hold) without its slot
            got = await self._slot_after_hold(cand, adm)
            if got is None:
                return None
            lease = got
        if not adm.allowed:
            self.blocked.append(Blocked(conn, adm))
            reason = adm.reason.value if adm.reason else "blocked"
            until = None if adm.retry_after_ms is None else now + adm.retry_after_ms
            self.diag.exclude(cand.label, f"quota:{reason}", until, now)
            if pool is not None:
                self.blocked_pools.add(pool.id)
            return None
        svc = self.svc
        res = Reservation(svc.state.engine, adm.ticket, svc.inflight, svc.spawn)
        self.reservations.append(res)  # released on the way out unless settled
        return _Admitted(cand, pool, adm, res, lease)

    async def _slot_after_hold(self, cand: Candidate, adm: Admission) -> Lease | None:
        """A request held for quota room gave its concurrency slot back while it waited (a
        waiting request holds no slot, issue 45): a slot again now, else its reservation goes
        back and the candidate counts as full (the slot queue may still take it)."""
        lease = await self.svc.slots.try_acquire(
            cand.target, cand.conn.max_concurrent, self.call.key.id
        )
        if lease is None:
            await self.svc.state.engine.release(adm.ticket)
            self.full.append(cand)
            self.diag.exclude(cand.label, "concurrency-full")
        return lease

    def _until_the_providers_reset(self, excl: Exclusion, cand: Candidate) -> Exclusion:
        """A cooldown is capped at an hour, but an account that refused with its usage limit
        (or whose window reading is full) stated when it resets: the target is unavailable
        until then, and that is the Retry-After to give (issue 44, item 4: a client obeying
        the cooldown's 3,599 s was refused again)."""
        held = self.svc.signals.buckets.saturated_until(cand.conn.id, cand.model)
        if held is None or excl.until_ms is None or held <= excl.until_ms:
            return excl
        return dataclasses.replace(excl, until_ms=held)

    async def _attempt(self, a: _Admitted) -> Outcome | None:
        """Attempts on one target (retries per the failover rule); None when it failed and
        the request may move on. Raises when the failure ends the request."""
        opts = self.opts
        if self.last_error is not None:  # a previous target failed: this is a fallback
            self.svc.record_fallback(opts.combo, self.last_error.failure)
        if self.failed and opts.fallback_delay_ms > 0:
            await self._pause(opts.fallback_delay_ms)
        result: Outcome | ApiError | None = None
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
            call = self._call_for(a.cand)
            result = await attempt(
                call, a.cand, a.pool, a.adm, a.res, a.lease, diag=self.diag, opts=opts
            )
            if isinstance(result, Outcome):
                if call is not self.call:  # the answer says it saw a compressed conversation
                    result.compressed_dropped = self.fitted[a.cand.label][1]
                return result
            if result.step is not Step.RETRY or self._capped():
                break
        assert isinstance(result, ApiError)  # the first attempt always runs
        self.last_error = result
        hint = _retry_ms(result) if result.status == 429 else None
        if hint is not None and (self.soonest_retry_ms is None or hint < self.soonest_retry_ms):
            self.soonest_retry_ms = hint
        self.failed.append(a.cand)
        if result.final:
            self.diag.terminal = Terminal.CLIENT_ERROR
            raise self.diag.attach(result)
        if result.same_model_futile:  # another account of the same model has the same window
            self.queue = [c for c in self.queue if c.model != a.cand.model]
        return None

    async def _readmit(self, a: _Admitted) -> _Admitted | None:
        lease = await self.svc.slots.try_acquire(
            a.cand.target, a.cand.conn.max_concurrent, self.call.key.id
        )
        if lease is None:
            return None
        adm = await _admit(self._call_for(a.cand), a.cand.conn, a.pool, a.cand.model)
        if not adm.allowed:
            lease.release()
            return None
        res = Reservation(self.svc.state.engine, adm.ticket, self.svc.inflight, self.svc.spawn)
        self.reservations.append(res)
        return _Admitted(a.cand, a.pool, adm, res, lease)

    async def _pause(self, ms: int) -> None:
        await self.timer.sleep_until(self.timer.clock.now_ms() + ms)

    # -- waiting ------------------------------------------------------------------------------

    def _budget_end_ms(self, started: int, budget_ms: int) -> int:
        end = started + budget_ms
        deadline = self.opts.deadline_ms
        return end if deadline is None else min(end, deadline)

    async def _queue_for_slot(self) -> Outcome | None:
        """Every candidate left is at its concurrency cap: wait (FIFO, bounded) for a slot
        on any of them, then try that one."""
        now = self.timer.clock.now_ms()
        end = self._budget_end_ms(now, self.opts.queue_timeout_ms)
        wants = [(c.target, c.conn.max_concurrent or 0) for c in self.full]
        by_key = {c.target.load_key: c for c in self.full}
        self.full = []
        slots = self.svc.slots
        got = await self._watching_client(slots.wait(wants, end, self.timer, self.call.key.id))
        self.diag.waited_ms += self.timer.clock.now_ms() - now
        if got is None:
            raise self._concurrency_full()
        target, lease = got
        return await self._consider(by_key[target.load_key], lease)

    async def _next_free_ms(self) -> int | None:
        """When the earliest candidate cooling down or locked by a rate limit frees, if that is
        within the wait budget (``max_wait_ms`` in all, counted as the waits asked for, so the
        budget ends even on a clock that does not move; and the combo's timeout); else None. Quota
        blocks are never waited for: they are the key's fair share speaking."""
        if self.opts.max_wait_ms <= 0:
            return None
        # only what clears by itself at a known time: a rate limit's cooldown or lockout (a
        # server error, a breaker or a blocked credential is no reason to hold the client)
        untils = [e.until_ms for e in self.exclusions if e.until_ms is not None and e.rate_limit]
        mgr = self.svc.state.resilience
        if mgr is not None:
            for c in self.failed:  # what the failure just set (a cooldown, a lockout)
                excl = await mgr.check(c.conn.provider, c.conn.id, c.model, c.conn.auth_type)
                if excl is not None and excl.until_ms is not None and excl.rate_limit:
                    untils.append(excl.until_ms)
        if not untils:
            return None
        wake = min(untils)
        need = max(0, wake - self.timer.clock.now_ms())
        if self.wait_spent + need > self.opts.max_wait_ms:
            return None
        deadline = self.opts.deadline_ms
        return None if deadline is not None and wake > deadline else wake

    async def _sleep_until(self, wake_ms: int) -> None:
        now = self.timer.clock.now_ms()
        self.wait_spent += max(0, wake_ms - now)
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
        reasons = {e["reason"] for e in self.diag.excluded}
        if reasons == {"context-window"} and self.last_error is None and not self.blocked:
            return self.diag.error(  # every target too small: the request's own size
                400,
                f"The conversation does not fit the context window of any target of "
                f"'{self.call.model}' (a combo's contextCompression can shorten it)",
                code="context_length_exceeded",
                terminal=Terminal.CLIENT_ERROR,
                param="messages",
            )
        return _no_answer(
            self.call,
            self.diag,
            self.blocked,
            self.exclusions,
            self.last_error,
            self.soonest_retry_ms,
            self.unusable,
        )


async def _client_gone(request: ClientRequest) -> None:
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
    soonest_retry_ms: int | None = None,
    unusable: dict[str, str] | None = None,
) -> ApiError:
    """The error for a request nothing could serve, with its diagnostics. When every attempt
    was refused with a 429, the Retry-After is the soonest any of them stated (a Codex
    ``usage_limit_reached`` states its reset in the body: see ``attempt``). When the credential
    gate skipped every candidate, the error names what an admin must do (log in again)."""
    now = call.svc.state.clock.now_ms()
    if (
        unusable
        and not blocked
        and not exclusions
        and (last_error is None or last_error.code == "credential_unusable")
    ):
        diag.terminal = Terminal.ALL_UNAVAILABLE
        todo = "; ".join(f"{cid}: {action}" for cid, action in sorted(unusable.items()))
        return diag.error(
            503,
            f"No upstream for '{call.model}' has a usable credential ({todo})",
            code="credential_unusable",
            terminal=Terminal.ALL_UNAVAILABLE,
            type_="overloaded_error",
        )
    if last_error is not None:
        diag.terminal = Terminal.UPSTREAM_FAILED
        if not blocked and exclusions == [] and last_error.status == 429:
            if soonest_retry_ms is not None:
                last_error.headers["retry-after"] = str(soonest_retry_ms // 1000)
            diag.retry_after_ms = _retry_ms(last_error)
        return diag.attach(last_error)
    if blocked and not exclusions:
        diag.terminal = Terminal.QUOTA_BLOCKED
        err = _quota_blocked(blocked, call)
        diag.retry_after_ms = _retry_ms(err)
        if err.status == 413:  # too large for the pool: no wait helps, a smaller request does
            diag.terminal = Terminal.CLIENT_ERROR
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


def request_cost(
    call: Call, conn: Connection, upstream_model: str, units: Collection[Unit] | None = None
) -> dict[Unit, float]:
    """What admission reserves for this request on ``conn`` (and the quota view assumes).
    ``units``: the units the pool reads a cost in (:attr:`~fairgate.quota.model.Pool.cost_units`;
    None: all); a dollar price and a percent estimate are worked out only when asked for."""
    svc = call.svc
    tokens = float(call.prompt_estimate + call.output_reserved)
    cost = {Unit.REQUESTS: 1.0, Unit.TOKENS: tokens}
    if units is None or Unit.USD in units:
        cost[Unit.USD] = svc.prices.cost_usd(
            upstream_model,
            Usage(prompt_tokens=call.prompt_estimate, completion_tokens=call.output_reserved),
        )
    if units is None or Unit.PERCENT in units:
        cost[Unit.PERCENT] = svc.signals.percent_estimate(conn.id, tokens)
    return cost


async def _admit(
    call: Call,
    conn: Connection,
    pool: Pool | None,
    upstream_model: str,
    *,
    on_hold: Callable[[], None] | None = None,
) -> Admission:
    """The admission of ``call`` on ``conn`` (allowed without asking when no pool governs
    it; a pool with ``admission: hold`` may hold it up to the client's patience, issue 45),
    reported once to the event hook (log, pool log, metrics, trace)."""
    svc = call.svc
    started = time.time_ns()
    if pool is None:
        if not tracing.active():  # nothing but a trace reads an ungoverned admission
            return ALLOW_UNGOVERNED
        adm = ALLOW_UNGOVERNED
        pool_id = None
    else:
        cost = request_cost(call, conn, upstream_model, pool.cost_units)
        try:  # the client's patience, for a pool with admission: hold (issue 45)
            wait = client_max_wait_ms(call.headers)
        except ValueError as exc:
            raise ApiError(
                400,
                str(exc),
                code="invalid_header",
                param=MAX_WAIT_HEADER,
                type_="invalid_request_error",
            ) from None
        adm = await svc.state.engine.admit(
            pool, call.key.id, cost, model=upstream_model, max_wait_ms=wait, on_hold=on_hold
        )
        pool_id = pool.id
    svc.events.admission(
        AdmissionEvent(
            pool_id,
            call.key.id,
            conn.id,
            upstream_model,
            adm,
            svc.state.clock.now_ms(),
            started,
            time.time_ns(),
        )
    )
    return adm


def _quota_blocked(blocked: list[Blocked], call: Call) -> ApiError:
    best = min(blocked, key=lambda b: b.admission.retry_after_ms or math.inf)
    adm = best.admission
    assert adm.reason is not None
    if adm.reason is Reason.GLOBAL_SATURATED and adm.retry_after_ms is None:
        # the pool's window never frees enough: this request alone is more than its whole
        # limit, so no wait helps (a 429 would have the client retry it for ever)
        pool = call.svc.state.registry.pool_by_connection.get(best.conn.id)
        return ApiError(
            413,
            f"The request is too large for the pool{'' if pool is None else f' {pool.id!r}'}"
            f": its estimate on {adm.dimension} is more than the pool's whole limit; reduce "
            "the input or max_tokens",
            code="request_too_large",
            type_="invalid_request_error",
            extra={"reason": adm.reason.value, "dimension": adm.dimension},
        )
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
        headers={"retry-after": str(retry_s), **quota_headers(adm)},
    )


def _retry_ms(err: ApiError) -> int | None:
    raw = err.headers.get("retry-after")
    return int(raw) * 1000 if raw and raw.isdigit() else None
