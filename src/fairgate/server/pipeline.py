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
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.responses import Response

from fairgate.providers.usage import estimate_prompt_tokens
from fairgate.registry import ClientKey, Connection, Denial, Registry
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
from fairgate.server import access, executor
from fairgate.server.call import Call, Candidate, ExecOptions, Route
from fairgate.server.diagnostics import Diagnostics, Terminal
from fairgate.server.errors import ApiError
from fairgate.server.views import health_view, quota_view

log = logging.getLogger("fairgate.routing")


# -- plain models ---------------------------------------------------------------------------


async def route_plain(call: Call, upstream_model: str, conns: Sequence[Connection]) -> Response:
    reg = call.svc.gw.registry
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
) -> Response:
    svc = call.svc
    by_conn = {c.conn.id: c for c in cands}
    res = select_quota_share(
        combo.targets,
        combo.name,
        model,
        svc.gw.clock.now_ms(),
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
        opts = _plain_options(svc.gw.registry, drr=res.ticket, combo=combo.name)
        return await executor.execute(call, ordered, diag, opts)


# -- user combos ----------------------------------------------------------------------------


def _itself(c: Connection) -> Connection:
    return c


def target_connections(reg: Registry, t: Target) -> list[Connection]:
    """The connections a target names: the named one, else every enabled connection of its
    provider that serves the model, heaviest first."""
    if t.connection_id and t.connection_id != "*":
        c = reg.connections.get(t.connection_id)
        return [c] if c is not None and c.enabled else []
    conns = [c for c in reg.by_provider.get(t.provider, ()) if c.serves(t.model)]
    return sorted(conns, key=lambda c: -c.weight)


def target_candidates(reg: Registry, t: Target, key: ClientKey) -> list[Candidate]:
    """The candidates of a target that ``key`` may use."""
    conns, _ = access.permitted(reg, key, target_connections(reg, t), _itself)
    return [Candidate(c, t.model, t) for c in conns]


def usable_targets(call: Call, targets: Sequence[Target]) -> list[Target]:
    """The targets with a connection the key may use, in order (the others are skipped, never
    tried). Raises the 403 when targets had connections but the key may use none of them;
    targets with no connection at all are left to the usual "no targets" answer."""
    reg = call.svc.gw.registry
    kept: list[Target] = []
    reason: Denial | None = None
    for t in targets:
        ok, why = access.permitted(reg, call.key, target_connections(reg, t), _itself)
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
    reg = svc.gw.registry
    now = svc.gw.clock.now_ms()
    buckets = {
        c.id: svc.signals.buckets.buckets(c.id)
        for t in targets
        if (c := reg.connections.get(t.connection_id or "")) is not None
    }
    quota = await quota_view(
        svc.gw.engine,
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
        health=health_view(svc.gw.resilience, reg, targets),
        quota=quota,
        inflight=svc.tracker.snapshot(targets),
        session_key=call.key.id,
        task=task_hints(call.body, call.prompt_estimate),
        options=combo.config.options,
        soft_factor=svc.gw.quota_settings.soft_deprioritize_factor,
    )
    return get_strategy(combo.strategy)(inp, svc.strategy_state)


async def route_combo(call: Call, combo: Combo) -> Response:
    reg = call.svc.gw.registry
    targets = expand_targets(combo.targets, reg.by_provider)
    mode = mode_of(combo.strategy)
    if mode != "fallback":
        if call.route is not Route.CHAT:
            raise ApiError(
                400, f"'{combo.strategy}' combos are served on /v1/chat/completions", param="model"
            )
        if mode == "fusion":
            return await _fusion(call, combo, usable_targets(call, targets))
        return await _pipeline(call, combo, targets)
    targets = usable_targets(call, targets)
    ordered = _pin(call, combo, await order_targets(call, combo, targets))
    fan_out = _int_option(combo, "fan_out")
    if fan_out >= 2 and not call.stream:
        response = await _fan_out(call, combo, ordered[:fan_out], ordered[fan_out:])
    else:
        response = await _run(call, combo, ordered)
    _after_answer(call, combo, response)
    return response


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
) -> Response:
    """Chaos fan-out (option ``fanOut: n``): the first n targets race, the first good answer
    wins and the others are aborted (their reservations released; an answer that arrived
    anyway is settled, since the upstream did the work). All racers failing → the remaining
    targets in order."""
    tasks = [asyncio.create_task(_run(call, combo, [t])) for t in racers]
    winner: Response | None = None
    last: ApiError | None = None
    pending: set[asyncio.Task[Response]] = set(tasks)
    while pending and winner is None:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            if exc is None and winner is None:
                winner = task.result()
            elif exc is None:
                await _settle_loser(task.result())
            elif isinstance(exc, ApiError):
                last = exc
            else:
                raise exc
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await _settle_loser(await task)
    if winner is not None:
        winner.headers["x-fairgate-fan-out"] = str(len(racers))
        return winner
    if rest:
        return await _run(call, combo, rest)
    assert last is not None
    raise last


async def _settle_loser(resp: Response) -> None:
    if resp.background is not None:
        await resp.background()


async def _run(
    call: Call,
    combo: Combo,
    ordered: Sequence[Target],
    *,
    stream: bool | None = None,
) -> Response:
    """Execute over the targets in order with the combo's config (timeout included)."""
    reg = call.svc.gw.registry
    cfg = combo.config
    cands = [c for t in ordered for c in target_candidates(reg, t, call.key)]
    diag = Diagnostics(pool_size=len(cands), combo=combo.name, strategy=combo.strategy)
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
        soft_ordered=True,  # the strategy's order weighs the soft penalty (× soft_factor)
    )
    if cfg.timeout_ms is None:
        return await executor.execute(call, cands, diag, opts)
    opts.deadline_ms = call.svc.gw.clock.now_ms() + cfg.timeout_ms
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


def _after_answer(call: Call, combo: Combo, response: Response) -> None:
    """Remember who served (lkgp, cache affinity) and send the sampled shadow copies."""
    svc = call.svc
    conn_id = response.headers.get("x-fairgate-connection")
    for t in combo.targets:
        if t.connection_id in (conn_id, None, "*"):
            conn = svc.gw.registry.connections.get(conn_id or "")
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
                target_candidates(svc.gw.registry, target, call.key),
                Diagnostics(combo=combo.name),
                ExecOptions(combo=combo.name),
            )
            if resp.background is not None:
                await resp.background()


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
    if resp.background is not None:
        await resp.background()  # settle the sub-request's usage now
    try:
        text = answer_text(orjson.loads(bytes(resp.body)))
    except orjson.JSONDecodeError:
        text = None
    return PanelAnswer(target, content=text) if text else PanelAnswer(target, error="empty")


async def _fusion(call: Call, combo: Combo, targets: Sequence[Target]) -> Response:
    plan = FusionPlan.from_combo(combo, await order_targets(call, combo, targets))
    messages = list(call.body.get("messages") or [])
    answers = await asyncio.gather(*(_ask(call, combo, t, messages) for t in plan.panel))
    decision = decide_fusion(answers)
    if decision.action == "fail":
        diag = Diagnostics(
            pool_size=len(plan.panel),
            combo=combo.name,
            strategy="fusion",
            terminal=Terminal.UPSTREAM_FAILED,
        )
        for a in answers:
            diag.attempt(a.target.key, "failed", error=a.error)
        raise diag.error(
            502,
            f"Every panel member of '{combo.name}' failed",
            code="upstream_error",
            terminal=Terminal.UPSTREAM_FAILED,
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


async def _pipeline(call: Call, combo: Combo, targets: Sequence[Target]) -> Response:
    plan = PipelinePlan.from_combo(combo)
    for step in plan.steps:  # a step cannot be skipped: one the key may not use refuses it all
        usable_targets(call, [step.target])
    messages = list(call.body.get("messages") or [])
    previous: str | None = None
    for step in plan.steps[:-1]:
        ans = await _ask(call, combo, step.target, step_messages(messages, step, previous))
        if not ans.ok:
            diag = Diagnostics(
                pool_size=len(plan.steps),
                combo=combo.name,
                strategy="pipeline",
                terminal=Terminal.UPSTREAM_FAILED,
            )
            diag.attempt(step.target.key, "failed", error=ans.error)
            raise diag.error(
                502,
                f"Pipeline '{combo.name}' failed at a step",
                code="upstream_error",
                terminal=Terminal.UPSTREAM_FAILED,
            )
        previous = ans.content
    last = plan.steps[-1]
    final = dataclasses.replace(
        call, body={**call.body, "messages": step_messages(messages, last, previous)}
    )
    return await _run(final, combo, [last.target])


def _synthetic_answer(call: Call, combo: Combo, answer: PanelAnswer) -> Response:
    """A panel answer given as the combo's answer (fusion with one survivor), in the shape the
    client asked for (a one-chunk stream when it streams)."""
    created = call.svc.gw.clock.now_ms() // 1000
    msg = {"role": "assistant", "content": answer.content}
    headers = {"x-fairgate-combo": combo.name}
    if call.stream:
        chunk = {
            "id": "chatcmpl-fusion",
            "object": "chat.completion.chunk",
            "created": created,
            "model": call.model,
            "choices": [{"index": 0, "delta": msg, "finish_reason": "stop"}],
        }
        body = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
        return Response(body, media_type="text/event-stream", headers=headers)
    out = {
        "id": "chatcmpl-fusion",
        "object": "chat.completion",
        "created": created,
        "model": call.model,
        "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
    }
    return Response(orjson.dumps(out), media_type="application/json", headers=headers)
