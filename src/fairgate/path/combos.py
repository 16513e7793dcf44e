"""Routing a request to candidates: the imperative shell around the pure ``routing`` core.

- A plain model whose connections are the members of one pool goes through that pool's internal
  ``qtSd/<pool>/<model>`` combo: bucket gating, concurrency caps, DRR and P2C order the members
  (SPEC §7); the DRR ticket is charged to the member actually dispatched.
- Only what the key may use is routed to (``server.access``): refused connections are dropped
  before anything is ordered, refused combo targets are skipped, and nothing left → 403.
- A user combo is ordered by its strategy (SPEC §8) over live views (per-target metrics, breaker
  health, in-flight counts) and executed with its config: retries, attempt cap, timeout,
  quality validation. ``fusion`` asks a panel in parallel and has a judge combine the answers;
  ``pipeline`` chains steps, each output feeding the next. Shadow targets get a sampled copy
  after the answer, never touching it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import orjson

from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey, Denial
from fairgate.formats.usage import estimate_prompt_tokens
from fairgate.path import access, executor
from fairgate.path.call import Call, Candidate, ExecOptions, Route
from fairgate.path.diagnostics import Diagnostics, Terminal
from fairgate.path.exchange import carried
from fairgate.path.outcome import Outcome
from fairgate.path.responses_chat import served_as_chat
from fairgate.path.views import health_view, quota_view
from fairgate.process.errors import ApiError
from fairgate.resilience.manager import SHADOW_KEY_SUFFIX
from fairgate.routing import (
    Combo,
    PanelAnswer,
    RouteInput,
    Target,
    decide_fusion,
    expand_targets,
    get_strategy,
    judge_messages,
    mode_of,
    saturation_gate,
    select_quota_share,
    step_messages,
    task_hints,
)
from fairgate.routing.modes import FusionPlan, PipelinePlan, answer_text
from fairgate.routing.strategies.auto import auto_breakdown, auto_weights
from fairgate.snapshot import Registry

log = logging.getLogger("fairgate.routing")


# -- plain models ---------------------------------------------------------------------------


async def route_plain(call: Call, upstream_model: str, conns: Sequence[Connection]) -> Outcome:
    reg = call.svc.state.registry
    every = call.svc.plain_candidates.of(reg, upstream_model, conns)
    cands, why = access.permitted(reg, call.key, every, _conn_of)
    if not cands:
        assert why is not None  # the caller routes only models some connection serves
        raise access.denied(why, call.model)
    diag = Diagnostics(pool_size=len(cands))
    if len(cands) > 1:
        pools = {reg.pool_by_connection.get(c.conn.id) for c in cands}
        pool = next(iter(pools)) if len(pools) == 1 else None
        combo = None if pool is None else reg.quota_share(pool, upstream_model)
        if combo is not None:
            return await _quota_share(call, combo, upstream_model, cands, diag)
    return await executor.execute(call, cands, diag, _plain_options(reg))


def _conn_of(c: Candidate) -> Connection:
    return c.conn


def _plain_options(reg: Registry, **kw: Any) -> ExecOptions:
    """A plain model (no combo) waits and queues by the routing defaults' global layer."""
    cfg = reg.routing_defaults
    return ExecOptions(max_wait_ms=cfg.max_wait_ms, queue_timeout_ms=cfg.queue_timeout_ms, **kw)


async def _quota_share(
    call: Call,
    combo: Combo,
    model: str,
    cands: list[Candidate],
    diag: Diagnostics,
) -> Outcome:
    svc = call.svc
    by_conn = {c.conn.id: c for c in cands}
    res = select_quota_share(
        combo.targets,
        combo.name,
        model,
        svc.state.clock.now_ms(),
        saturated=saturation_gate(svc.signals.buckets, model),
        max_concurrent={c.conn.id: c.conn.max_concurrent for c in cands},
        inflight=svc.tracker,
        drr=svc.drr,
    )
    ordered = [
        dataclasses.replace(by_conn[t.connection_id], target=t)
        for t in res.order
        if t.connection_id in by_conn
    ]
    ordered += [c for c in cands if c.conn.id not in {o.conn.id for o in ordered}]
    diag.combo, diag.strategy = combo.name, "quota-share"
    with res.ticket:  # charges DRR to the member that was really dispatched
        opts = _plain_options(svc.state.registry, drr=res.ticket, combo=combo.name)
        return await executor.execute(call, ordered, diag, opts)


# -- user combos ----------------------------------------------------------------------------


def _itself(c: Connection) -> Connection:
    return c


def target_connections(reg: Registry, t: Target, route: Route) -> list[Connection]:
    """The connections a target names whose wire carries ``route``: the named one, else every
    enabled connection of its provider that serves the model, heaviest first."""
    if t.connection_id and t.connection_id != "*":
        c = reg.connections.get(t.connection_id)
        named = [c] if c is not None and c.enabled else []
        return list(carried(route, named))
    conns = carried(route, (c for c in reg.by_provider.get(t.provider, ()) if c.serves(t.model)))
    return sorted(conns, key=lambda c: -c.weight)


def target_candidates(reg: Registry, t: Target, call: Call) -> list[Candidate]:
    """The candidates of a target that the call's key may use on the call's route."""
    conns, _ = access.permitted(reg, call.key, target_connections(reg, t, call.route), _itself)
    return [Candidate(c, t.model, t) for c in conns]


def usable_targets(call: Call, targets: Sequence[Target]) -> list[Target]:
    """The targets with a connection the key may use, in order (the others are skipped, never
    tried). Raises the 403 when targets had connections but the key may use none of them;
    targets with no connection at all are left to the usual "no targets" answer."""
    reg = call.svc.state.registry
    kept: list[Target] = []
    reason: Denial | None = None
    for t in targets:
        conns = target_connections(reg, t, call.route)
        ok, why = access.permitted(reg, call.key, conns, _itself)
        if ok:
            kept.append(t)
        elif why is not None and reason is not Denial.NO_ALLOCATION:
            reason = why
    if not kept and reason is not None:
        raise access.denied(reason, call.model)
    return kept if kept else list(targets)


async def order_targets(call: Call, combo: Combo, targets: Sequence[Target]) -> list[Target]:
    """The combo's strategy over this request's live views (quota, health, load, task)."""
    svc = call.svc
    reg = svc.state.registry
    now = svc.state.clock.now_ms()
    buckets = {
        c.id: svc.signals.buckets.buckets(c.id)
        for t in targets
        if (c := reg.connections.get(t.connection_id or "")) is not None
    }
    quota = await quota_view(
        svc.state.engine,
        reg,
        buckets,
        call.key.id,
        lambda conn, model: executor.request_cost(call, conn, model),
        targets,
        now,
    )
    inp = RouteInput(
        combo=combo.name,
        targets=tuple(targets),
        now_ms=now,
        rng=svc.rng,
        request_tokens=call.prompt_estimate,
        output_tokens=call.output_reserved,
        metrics=svc.target_metrics,
        health=health_view(svc.state.resilience, reg, targets),
        quota=quota,
        inflight=svc.tracker.snapshot(targets),
        session_key=call.key.id,
        task=task_hints(call.body, call.prompt_estimate),
        options=combo.config.options,
        soft_factor=svc.state.quota_settings.soft_deprioritize_factor,
    )
    if combo.strategy == "auto":  # what each candidate scored, for the diagnostics
        call.route_scores = auto_breakdown(inp, svc.strategy_state)
    return get_strategy(combo.strategy)(inp, svc.strategy_state)


async def route_combo(call: Call, combo: Combo) -> Outcome:
    reg = call.svc.state.registry
    targets = expand_targets(combo.targets, reg.by_provider)
    mode = mode_of(combo.strategy)
    if mode != "fallback":
        if call.route is Route.RESPONSES:  # these combos compose chat answers
            return await served_as_chat(call, lambda sub: route_combo(sub, combo))
        if call.route is not Route.CHAT:
            raise ApiError(
                400, f"'{combo.strategy}' combos are served on /v1/chat/completions", param="model"
            )
        if mode == "fusion":
            return await _fusion(call, combo, usable_targets(call, targets))
        return await _pipeline(call, combo, targets)
    _check_the_route_is_served(call, combo, targets)
    targets = usable_targets(call, targets)
    ordered = _pin(call, combo, await order_targets(call, combo, targets))
    fan_out = _int_option(combo, "fan_out")
    if fan_out >= 2 and not call.stream:
        response = await _fan_out(call, combo, ordered[:fan_out], ordered[fan_out:])
    elif combo.config.predictive_ttft_ms is not None and len(ordered) > 1:
        response = await _hedged(call, combo, ordered)
    else:
        response = await _run(call, combo, ordered)
    _after_answer(call, combo, response)
    return response


def _check_the_route_is_served(call: Call, combo: Combo, targets: Sequence[Target]) -> None:
    """A 400 when the combo has connections but none speaks a wire that serves the route (an
    embeddings request to a combo of Anthropic and Codex accounts): the client's request is
    wrong for this combo, which no retry or failover changes."""
    reg = call.svc.state.registry
    if call.route is Route.CHAT or any(target_connections(reg, t, call.route) for t in targets):
        return
    if any(target_connections(reg, t, Route.CHAT) for t in targets):  # every wire serves chat
        raise ApiError(
            400,
            f"No target of combo '{combo.name}' is on a connection that serves "
            f"/v1/{call.route.value}",
            code="route_not_served",
            param="model",
        )


def _int_option(combo: Combo, name: str) -> int:
    raw = combo.config.options.get(name)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def _pin(call: Call, combo: Combo, ordered: list[Target]) -> list[Target]:
    """Pre-dispatch pinning: ``x-fairgate-pin: provider/model[@connection]`` puts that target
    first (session affinity decided by the client); with the combo option ``strictPin`` it is
    the only one tried."""
    pin = call.headers.get("x-fairgate-pin")
    if not pin:
        return ordered
    pinned = [t for t in ordered if pin in (t.key, f"{t.provider}/{t.model}")]
    if not pinned:
        raise ApiError(
            400,
            f"Pinned target '{pin}' is not a target of combo '{combo.name}'",
            param="x-fairgate-pin",
        )
    if combo.config.options.get("strict_pin") is True:
        return pinned
    return pinned + [t for t in ordered if t not in pinned]


async def _fan_out(
    call: Call, combo: Combo, racers: Sequence[Target], rest: Sequence[Target]
) -> Outcome:
    """Chaos fan-out (option ``fanOut: n``): the first n targets race, the first good answer
    wins and the others are aborted (their reservations released; an answer that arrived
    anyway is settled, since the upstream did the work). All racers failing → the remaining
    targets in order."""
    tasks = [asyncio.create_task(_run(call, combo, [t])) for t in racers]
    winner: Outcome | None = None
    last: ApiError | None = None
    pending: set[asyncio.Task[Outcome]] = set(tasks)
    while pending and winner is None:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            if exc is None and winner is None:
                winner = task.result()
            elif exc is None:
                await task.result().discard()
            elif isinstance(exc, ApiError):
                last = exc
            else:
                raise exc
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await (await task).discard()
    if winner is not None:
        winner.fan_out = len(racers)
        return winner
    if rest:
        return await _run(call, combo, rest)
    assert last is not None
    raise last


def _hedge_delay_ms(call: Call, combo: Combo, first: Target) -> int | None:
    """How long the first target may take to its first token before a hedge starts:
    ``predictiveTtftMs``, or with ``"p95"`` the first target's learned p95 (no data yet: no
    hedge)."""
    setting = combo.config.predictive_ttft_ms
    if setting == "p95":
        p95 = call.svc.target_metrics.p95_ms(first.key)
        return None if p95 is None else max(1, int(p95))
    return setting if isinstance(setting, int) else None


async def _hedged(call: Call, combo: Combo, ordered: Sequence[Target]) -> Outcome:
    """Hedged first token (issue 46): the combo runs over its targets as usual; when no first
    token came within the hedge delay, the next targets are started too (each attempt admitted
    and charged like any). The first answer wins and the other side is cancelled at once (an
    attempt it had started is charged its prompt; an answer it had already got is settled).
    At most ``maxHedgesInFlight`` hedges of the combo run at once; one over the cap is not
    sent. For a stream the answer comes back once its first content is read (quality
    validation), so "first" is the first token; for a non-stream answer it is the answer."""
    svc = call.svc
    delay = _hedge_delay_ms(call, combo, ordered[0])
    if delay is None:
        return await _run(call, combo, ordered)
    reg = svc.state.registry
    primary = asyncio.create_task(_run(call, combo, ordered, charge_if_cancelled=True))
    timer = svc.state.timer
    late = asyncio.ensure_future(timer.sleep_until(timer.clock.now_ms() + delay))
    try:
        await asyncio.wait({primary, late}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client went away: nothing of it goes on
        primary.cancel()
        raise
    finally:
        late.cancel()
    if primary.done():
        return primary.result()
    name = combo.name
    if svc.hedges.get(name, 0) >= combo.config.max_hedges_in_flight:
        svc.metrics.observe_hedge(reg, name, "capped")
        return await primary
    svc.hedges[name] = svc.hedges.get(name, 0) + 1
    hedge = asyncio.create_task(_run(call, combo, ordered[1:], charge_if_cancelled=True))
    try:
        winner, outcome = await _race(primary, hedge, svc.spawn)
    finally:
        svc.hedges[name] -= 1
        if not svc.hedges[name]:
            del svc.hedges[name]
        for task in (primary, hedge):
            task.cancel()
    svc.metrics.observe_hedge(reg, name, outcome)
    if outcome == "won":
        winner.hedged = True
    return winner


async def _reap(task: asyncio.Task[Outcome]) -> None:
    """A hedge race's loser, cancelled: wait for it to end (its attempt charged, its slot
    given back), and settle an answer it got anyway."""
    try:
        resp = await task
    except (asyncio.CancelledError, ApiError):
        return
    await resp.discard()


async def _race(
    primary: asyncio.Task[Outcome],
    hedge: asyncio.Task[Outcome],
    spawn: Callable[[Coroutine[Any, Any, None]], None],
) -> tuple[Outcome, str]:
    """The first answer of the two and the hedge's outcome (``won``, ``lost``, ``cancelled``,
    ``failed``); the other side is cancelled at once, or settled if it answered too. Raises
    the primary's error when neither answers."""
    pending: set[asyncio.Task[Outcome]] = {primary, hedge}
    winner: asyncio.Task[Outcome] | None = None
    try:
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in (primary, hedge):  # the primary first when both answered at once
                if (
                    task in done
                    and winner is None
                    and not task.cancelled()
                    and task.exception() is None
                ):
                    winner = task
    finally:
        for task in pending:
            task.cancel()
    loser = hedge if winner is primary else primary
    loser_answered = loser.done() and not loser.cancelled() and loser.exception() is None
    if winner is not None:  # the loser ends in the background: the winner is not held
        spawn(_reap(loser))
    if winner is None:  # both failed: the first target's error, as without a hedge
        err = primary.exception()
        assert err is not None
        raise err
    if winner is hedge:
        return winner.result(), "won"
    if loser_answered:
        return winner.result(), "lost"
    if hedge.done() and not hedge.cancelled():
        return winner.result(), "failed"
    return winner.result(), "cancelled"


async def _run(
    call: Call,
    combo: Combo,
    ordered: Sequence[Target],
    *,
    stream: bool | None = None,
    charge_if_cancelled: bool = False,
) -> Outcome:
    """Execute over the targets in order with the combo's config (timeout included)."""
    reg = call.svc.state.registry
    cfg = combo.config
    cands = [c for t in ordered for c in target_candidates(reg, t, call)]
    diag = Diagnostics(pool_size=len(cands), combo=combo.name, strategy=combo.strategy)
    if call.route_scores is not None:
        diag.candidates = call.route_scores
        diag.weights = {k: round(v, 4) for k, v in auto_weights(cfg.options).items()}
    if not cands:
        usable_targets(call, ordered)  # the 403 when the key may use none of them
        raise diag.error(
            503,
            f"Combo '{combo.name}' has no enabled connection for its targets",
            code="no_targets",
            terminal=Terminal.NO_TARGETS,
        )
    opts = ExecOptions(
        max_retries=cfg.max_retries,
        retry_delay_ms=cfg.retry_delay_ms,
        fallback_delay_ms=cfg.fallback_delay_ms,
        attempt_cap=cfg.attempt_cap(len(cands)),
        quality=cfg.quality_validation,
        combo=combo.name,
        max_wait_ms=cfg.max_wait_ms,
        queue_timeout_ms=cfg.queue_timeout_ms,
        validation=cfg.response_validation,
        reasoning=cfg.reasoning_buffer if cfg.reasoning_buffer.enabled else None,
        compression=cfg.context_compression,
        fit_context=True,
        charge_if_cancelled=charge_if_cancelled,
        soft_ordered=True,  # the strategy's order weighs the soft penalty (× soft_factor)
    )
    if cfg.timeout_ms is None:
        return await executor.execute(call, cands, diag, opts)
    opts.deadline_ms = call.svc.state.clock.now_ms() + cfg.timeout_ms
    try:
        async with asyncio.timeout(cfg.timeout_ms / 1000):
            return await executor.execute(call, cands, diag, opts)
    except TimeoutError:
        raise diag.error(
            504,
            f"Combo '{combo.name}' did not answer within {cfg.timeout_ms} ms",
            code="combo_timeout",
            terminal=Terminal.TIMEOUT,
        ) from None


def _after_answer(call: Call, combo: Combo, response: Outcome) -> None:
    """Remember who served (lkgp, cache affinity) and send the sampled shadow copies."""
    svc = call.svc
    conn_id = response.served_by
    for t in combo.targets:
        if t.connection_id in (conn_id, None, "*"):
            conn = svc.state.registry.connections.get(conn_id or "")
            if conn is not None and conn.provider == t.provider:
                svc.strategy_state.note_success(combo.name, call.key.id, t)
                break
    shadow = combo.config.shadow
    if shadow.targets and svc.rng.random() < shadow.sample_rate:
        for t in shadow.targets:
            svc.spawn(_shadow(call, combo, t, shadow.timeout_ms))


async def _shadow(call: Call, combo: Combo, target: Target, timeout_ms: int) -> None:
    """A copy of the request to a shadow target: its own metrics, a real abort on timeout, and
    quota drawn as an unallocated key (it borrows spare capacity only, never a client's share);
    only on connections the client's own key may use."""
    svc = call.svc
    shadow_key = ClientKey(f"{call.key.id}{SHADOW_KEY_SUFFIX}", "shadow", "")
    sub = dataclasses.replace(
        call, key=shadow_key, stream=False, body={**call.body, "stream": False}
    )
    # the shadow's outcome is recorded per attempt in the target metrics; nothing else to do
    with contextlib.suppress(TimeoutError, ApiError):
        async with asyncio.timeout(timeout_ms / 1000):
            resp = await executor.execute(
                sub,
                target_candidates(svc.state.registry, target, call),
                Diagnostics(combo=combo.name),
                ExecOptions(combo=combo.name),
            )
            await resp.settle()


# -- fusion and pipeline --------------------------------------------------------------------


async def _ask(
    call: Call, combo: Combo, target: Target, messages: list[dict[str, Any]]
) -> PanelAnswer:
    """One non-stream sub-request (a panel member or a pipeline step) to one target."""
    body = {**call.body, "messages": messages, "stream": False}
    body.pop("stream_options", None)
    sub = dataclasses.replace(
        call, body=body, stream=False, prompt_estimate=estimate_prompt_tokens(body)
    )
    try:
        resp = await _run(sub, combo, [target])
    except ApiError as err:
        return PanelAnswer(target, error=err.message)
    await resp.settle()  # settle the sub-request's usage now
    try:
        text = answer_text(orjson.loads(resp.body))
    except orjson.JSONDecodeError:
        text = None
    return PanelAnswer(target, content=text) if text else PanelAnswer(target, error="empty")


def _failed(combo: Combo, pool_size: int, answers: Sequence[PanelAnswer], message: str) -> ApiError:
    """The 502 of a fusion or pipeline combo whose upstream answers failed, each one in the
    diagnostics."""
    diag = Diagnostics(
        pool_size=pool_size,
        combo=combo.name,
        strategy=combo.strategy,
        terminal=Terminal.UPSTREAM_FAILED,
    )
    for a in answers:
        diag.attempt(a.target.key, "failed", error=a.error)
    return diag.error(502, message, code="upstream_error", terminal=Terminal.UPSTREAM_FAILED)


async def _fusion(call: Call, combo: Combo, targets: Sequence[Target]) -> Outcome:
    plan = FusionPlan.from_combo(combo, await order_targets(call, combo, targets))
    messages = list(call.body.get("messages") or [])
    answers = await asyncio.gather(*(_ask(call, combo, t, messages) for t in plan.panel))
    decision = decide_fusion(answers)
    if decision.action == "fail":
        raise _failed(
            combo,
            len(plan.panel),
            answers,
            f"Every panel member of '{combo.name}' failed",
        )
    if decision.action == "single":
        return _synthetic_answer(call, combo, decision.answers[0])
    judged = dataclasses.replace(
        call, body={**call.body, "messages": judge_messages(messages, decision.answers)}
    )
    try:
        return await _run(judged, combo, [plan.judge])
    except ApiError:
        fallback = decision.fallback
        if fallback is None:
            raise
        return _synthetic_answer(call, combo, fallback)


async def _pipeline(call: Call, combo: Combo, targets: Sequence[Target]) -> Outcome:
    plan = PipelinePlan.from_combo(combo)
    for step in plan.steps:  # a step cannot be skipped: one the key may not use refuses it all
        usable_targets(call, [step.target])
    messages = list(call.body.get("messages") or [])
    previous: str | None = None
    for step in plan.steps[:-1]:
        ans = await _ask(call, combo, step.target, step_messages(messages, step, previous))
        if not ans.ok:
            raise _failed(
                combo, len(plan.steps), [ans], f"Pipeline '{combo.name}' failed at a step"
            )
        previous = ans.content
    last = plan.steps[-1]
    final = dataclasses.replace(
        call, body={**call.body, "messages": step_messages(messages, last, previous)}
    )
    return await _run(final, combo, [last.target])


def _synthetic_answer(call: Call, combo: Combo, answer: PanelAnswer) -> Outcome:
    """A panel answer given as the combo's answer (fusion with one survivor), in the shape the
    client asked for (a one-chunk stream when it streams)."""
    created = call.svc.state.clock.now_ms() // 1000
    msg = {"role": "assistant", "content": answer.content}
    # a stream's one chunk carries the message as its delta
    kind, part = (
        ("chat.completion.chunk", "delta") if call.stream else ("chat.completion", "message")
    )
    out = {
        "id": "chatcmpl-fusion",
        "object": kind,
        "created": created,
        "model": call.model,
        "choices": [{"index": 0, part: msg, "finish_reason": "stop"}],
    }
    if call.stream:
        body = b"data: " + orjson.dumps(out) + b"\n\ndata: [DONE]\n\n"
        return Outcome(body, sse=True, combo=combo.name)
    return Outcome(orjson.dumps(out), combo=combo.name)
