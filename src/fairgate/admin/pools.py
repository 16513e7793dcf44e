"""Admin routes of the quota domain: pools (CRUD, usage, log, model caps, export/import), plans
and the side-effect-free admission preview.

Every write validates fully (request model, then references inside one DB transaction) before
anything is stored, then calls ``gw.reload()`` so the proxy sees the change on its next request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from fairgate.admin.common import (
    ERROR_RESPONSES,
    GW,
    STORE_RESPONSES,
    AdminError,
    invalid,
)
from fairgate.admin.models import (
    AllocationBody,
    AllocationIn,
    BurnSampleOut,
    DimensionOut,
    EnforcedDimensionOut,
    ImportResult,
    ModelCapIn,
    PlanIn,
    PlanOut,
    PoolIn,
    PoolLogOut,
    PoolOut,
    PoolPatch,
    PoolsExport,
    PoolUsageOut,
    PreviewDimensionOut,
    PreviewOut,
)
from fairgate.config import unique_caps
from fairgate.db.common import Invalid, transaction
from fairgate.db.keys import KeyRepo
from fairgate.db.plans import PlanRepo
from fairgate.db.pools import PoolRecord, PoolRepo, resolve_pool
from fairgate.domain.connections import Connection
from fairgate.domain.units import UNKNOWN_LIMIT, Unit
from fairgate.process.state import Gateway
from fairgate.quota.catalog import resolve_plan
from fairgate.quota.decision import (
    Outcome,
    Verdict,
    compile_checks,
    dominant_levels,
    evaluate,
    retry_after_ms,
)
from fairgate.quota.hold import HoldSettings
from fairgate.quota.model import (
    Allocation,
    Dimension,
    PlanSource,
    Policy,
    ShareMode,
    unenforced_message,
)
from fairgate.quota.ports import CounterRef
from fairgate.quota.window import Count

log = logging.getLogger("fairgate.admin")

router = APIRouter(responses=ERROR_RESPONSES)

NonNegative = Annotated[float, Query(ge=0, le=1e15, allow_inf_nan=False)]


def _pool_out(rec: PoolRecord, overrides: Mapping[str, tuple[Dimension, ...]]) -> PoolOut:
    pool = resolve_pool(rec, overrides)
    source: Literal["pool", "override", "catalog", "empty"] = "pool"
    if not rec.dimensions:
        first = rec.connections[0] if rec.connections else ""
        source = _plan_source(resolve_plan(rec.provider, overrides.get(first)).source)
    return PoolOut(
        **dict(PoolIn.of(rec)),  # the pool as written: every field of PoolIn, PoolOut's base
        provider=rec.provider,
        effective_dimensions=[EnforcedDimensionOut.of_pool(pool, d) for d in pool.dimensions],
        plan_source=source,
    )


def _out(gw: Gateway, rec: PoolRecord) -> PoolOut:
    return _pool_out(rec, PlanRepo(gw.db).all())


async def _clear_counters(gw: Gateway, pool_id: str) -> None:
    """Drop a pool's counters; a store fault is logged, not fatal (the DB change stands)."""
    try:
        await gw.engine.forget_pool(pool_id)
    except Exception as exc:
        log.warning("clearing the counters of pool %s failed (%s)", pool_id, type(exc).__name__)


def _store_unavailable(exc: Exception) -> AdminError:
    log.warning("quota store read failed (%s)", type(exc).__name__)
    return AdminError(503, "The quota store is unavailable; try again shortly")


# -- pools: declared before /quota/pools/{pool_id} so these are not shadowed ------------------


@router.get("/quota/pools/export", tags=["pools"])
async def export_pools(gw: GW) -> PoolsExport:
    """Every pool with its allocations, in the shape ``POST /quota/pools/import`` accepts."""
    return PoolsExport(pools=[PoolIn.of(r) for r in PoolRepo(gw.db).records()])


@router.post("/quota/pools/import", tags=["pools"])
async def import_pools(body: PoolsExport, gw: GW) -> ImportResult:
    """Upsert each pool to exactly the imported state, all or nothing. Importing the same export
    twice changes nothing the second time. Pools not in the body are left alone."""
    repo = PoolRepo(gw.db)
    records = [p.to_record() for p in body.pools]
    try:
        outcomes = repo.upsert_many(records)
    except Invalid as exc:
        raise invalid([(f"pools.{f}", m) for f, m in exc.problems]) from None
    for rec, outcome in zip(records, outcomes, strict=True):
        if outcome == "created":
            await _clear_counters(gw, rec.id)
    gw.reload()
    return ImportResult(
        created=outcomes.count("created"),
        updated=outcomes.count("updated"),
        unchanged=outcomes.count("unchanged"),
    )


@router.get("/quota/pools", tags=["pools"])
async def list_pools(gw: GW) -> list[PoolOut]:
    overrides = PlanRepo(gw.db).all()
    return [_pool_out(r, overrides) for r in PoolRepo(gw.db).records()]


@router.post("/quota/pools", status_code=201, tags=["pools"])
async def create_pool(body: PoolIn, gw: GW) -> PoolOut:
    repo = PoolRepo(gw.db)
    rec = body.to_record()
    if repo.find_record(rec.id) is not None:
        raise AdminError(409, f"pool '{rec.id}' already exists")
    repo.validate(rec)
    # a new pool starts from zero even if a previous pool of this id left counters behind
    await _clear_counters(gw, rec.id)
    rec = repo.create(rec)
    gw.reload()
    return _out(gw, rec)


@router.get("/quota/pools/{pool_id}", tags=["pools"])
async def get_pool(pool_id: str, gw: GW) -> PoolOut:
    return _out(gw, PoolRepo(gw.db).record(pool_id))


@router.patch("/quota/pools/{pool_id}", tags=["pools"])
async def patch_pool(pool_id: str, body: PoolPatch, gw: GW) -> PoolOut:
    nulls = [name for name in body.model_fields_set if getattr(body, name) is None]
    if nulls:
        raise invalid([(PoolPatch.model_fields[n].alias or n, "may not be null") for n in nulls])
    repo = PoolRepo(gw.db)
    with transaction(gw.db):
        rec = repo.record(pool_id)
        if body.name is not None:
            rec = replace(rec, name=body.name or rec.id)
        if body.share_mode is not None:
            rec = replace(rec, share_mode=body.share_mode)
        if body.active_window_s is not None:
            rec = replace(rec, active_window_ms=round(body.active_window_s * 1000))
        rec = replace(rec, hold=_patched_hold(rec.hold, body))
        if body.dimensions is not None:
            rec = replace(rec, dimensions=tuple(d.to_domain() for d in body.dimensions))
        if body.connections is not None:
            rec = replace(rec, connections=tuple(body.connections))
        if body.allocations is not None:
            rec = replace(rec, allocations=tuple(a.to_domain() for a in body.allocations))
        rec = repo.update(rec)
    gw.reload()
    return _out(gw, rec)


def _patched_hold(hold: HoldSettings, body: PoolPatch) -> HoldSettings:
    """The pool's admission setting with the fields the patch gives."""
    return HoldSettings(
        hold.mode if body.admission is None else body.admission,
        hold.max_wait_ms if body.max_wait_ms is None else body.max_wait_ms,
        hold.queue_per_key if body.queue_per_key is None else body.queue_per_key,
        hold.queue_per_pool if body.queue_per_pool is None else body.queue_per_pool,
    )


@router.delete("/quota/pools/{pool_id}", status_code=204, tags=["pools"])
async def delete_pool(pool_id: str, gw: GW) -> Response:
    """Deletes the pool, its allocations and its counters (a new pool of the same id starts
    from zero)."""
    PoolRepo(gw.db).delete(pool_id)
    gw.reload()
    await gw.pool_log.forget(pool_id)
    await _clear_counters(gw, pool_id)
    return Response(status_code=204)


@router.get("/quota/pools/{pool_id}/usage", tags=["pools"], responses=STORE_RESPONSES)
async def pool_usage(pool_id: str, gw: GW) -> PoolUsageOut:
    pool = PoolRepo(gw.db).get(pool_id)
    try:
        usage = await gw.engine.usage(pool, unallocated_allowed=not gw.registry.require_allocation)
    except Exception as exc:
        raise _store_unavailable(exc) from None
    out = PoolUsageOut.of(usage)
    for dim in out.dimensions:
        series = gw.engine.burn_samples(pool.id, dim.key)
        samples = series.samples if series is not None else ()
        dim.burn_samples = [BurnSampleOut(t_ms=s.t_ms, value=s.value) for s in samples]
    return out


@router.get("/quota/pools/{pool_id}/log", tags=["pools"])
async def pool_log(
    pool_id: str, gw: GW, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> PoolLogOut:
    """The most recent admission events of the pool, newest first, from every replica or worker
    (the log is shared like the quota counters, bounded per pool, and survives restarts)."""
    PoolRepo(gw.db).record(pool_id)
    try:
        events = await gw.pool_log.recent(pool_id, limit)
    except Exception as exc:
        reason = type(exc).__name__
        raise AdminError(503, f"The admission log cannot be read ({reason})") from None
    return PoolLogOut(pool_id=pool_id, events=events)


@router.put("/quota/pools/{pool_id}/allocations/{key_id}", tags=["pools"])
async def put_allocation(pool_id: str, key_id: str, body: AllocationBody, gw: GW) -> PoolOut:
    """Give one key its allocation in a pool, or replace the one it has (weight, policy, cap
    and per-model caps: all as the body says); the pool's other allocations are left as they
    are. Adding a key this way needs no resend of the whole ``allocations`` list, so two admins
    adding two keys at the same time cannot drop each other's (``fairgate pools allow``)."""
    KeyRepo(gw.db).get(key_id)  # an unknown key is a 404 naming it, like an unknown pool
    rec = PoolRepo(gw.db).set_allocation(pool_id, body.to_domain(key_id))
    gw.reload()
    return _out(gw, rec)


@router.delete("/quota/pools/{pool_id}/allocations/{key_id}", status_code=204, tags=["pools"])
async def delete_allocation(pool_id: str, key_id: str, gw: GW) -> Response:
    """Take one key's allocation out of a pool (404 when it has none); the other allocations
    are left as they are (``fairgate pools disallow``). With ``server.require_allocation`` on,
    the key can no longer use the pool's connections. 204 with no body, as every delete."""
    PoolRepo(gw.db).remove_allocation(pool_id, key_id)
    gw.reload()
    return Response(status_code=204)


@router.put("/quota/pools/{pool_id}/allocations/{key_id}/model-caps", tags=["pools"])
async def put_model_caps(pool_id: str, key_id: str, body: list[ModelCapIn], gw: GW) -> AllocationIn:
    """Replace the per-model caps (hourly) of one key in one pool."""
    try:
        unique_caps(body)
    except ValueError as exc:
        raise invalid([("", str(exc))]) from None
    alloc = PoolRepo(gw.db).set_model_caps(pool_id, key_id, [c.to_domain() for c in body])
    gw.reload()
    return AllocationIn.of(alloc)


# -- plans ------------------------------------------------------------------------------------


def _plan_source(source: PlanSource) -> Literal["override", "catalog", "empty"]:
    """The API's spelling of a plan source (a Literal keeps the OpenAPI schema's enum)."""
    if source is PlanSource.OVERRIDE:
        return "override"
    return "catalog" if source is PlanSource.CATALOG else "empty"


def _plan_out(c: Connection, override: tuple[Dimension, ...] | None) -> PlanOut:
    plan = resolve_plan(c.provider, override)
    warning = unenforced_message(plan.dimensions) if plan.source == "override" else None
    return PlanOut(
        connection_id=c.id,
        provider=c.provider,
        source=_plan_source(plan.source),
        dimensions=[DimensionOut.of(d) for d in plan.dimensions],
        warnings=[] if warning is None else [f"manual plan: {warning}"],
    )


@router.get("/quota/plans", tags=["plans"])
async def list_plans(gw: GW) -> list[PlanOut]:
    overrides = PlanRepo(gw.db).all()
    return [_plan_out(c, overrides.get(c.id)) for c in gw.connections().all()]


@router.get("/quota/plans/{connection_id}", tags=["plans"])
async def get_plan(connection_id: str, gw: GW) -> PlanOut:
    conn = gw.connections().get(connection_id)
    return _plan_out(conn, PlanRepo(gw.db).get(connection_id))


@router.put("/quota/plans/{connection_id}", tags=["plans"])
async def put_plan(connection_id: str, body: PlanIn, gw: GW) -> PlanOut:
    """Set the manual plan of a connection (it wins over the catalog)."""
    with transaction(gw.db):
        conn = gw.connections().get(connection_id)
        PlanRepo(gw.db).set(connection_id, [d.to_domain() for d in body.dimensions])
    gw.reload()
    return _plan_out(conn, PlanRepo(gw.db).get(connection_id))


@router.delete("/quota/plans/{connection_id}", status_code=204, tags=["plans"])
async def delete_plan(connection_id: str, gw: GW) -> Response:
    """Drop the manual plan: the catalog plan (or the empty plan) applies again (``GET`` says
    which). 204 with no body, as every delete of this API."""
    with transaction(gw.db):
        gw.connections().get(connection_id)  # 404 for an unknown connection
        PlanRepo(gw.db).delete(connection_id)
    gw.reload()
    return Response(status_code=204)


# -- preview ----------------------------------------------------------------------------------


#: The estimate's parameters under their short names and under the seeds' names (aliases).
_PREVIEW_ALIASES = {
    "estimatedTokens": "tokens",
    "estimatedRequests": "requests",
    "estimatedUsd": "usd",
}
_PREVIEW_PARAMS = frozenset({"pool", "key", "model", *_PREVIEW_ALIASES.values()})


def _preview_estimate(
    request: Request, given: Mapping[str, float | None], defaults: Mapping[str, float]
) -> dict[str, float]:
    """Refuse what the preview would otherwise ignore: an unknown query parameter (a typo
    such as ``token=5000`` answered a plausible "allow" for the default size), or one value
    given under both of its names."""
    names = set(request.query_params.keys())
    unknown = sorted(names - _PREVIEW_PARAMS - set(_PREVIEW_ALIASES))
    if unknown:
        known = ", ".join(sorted(_PREVIEW_PARAMS | set(_PREVIEW_ALIASES)))
        raise invalid(
            [(name, f"unknown query parameter (known: {known})") for name in unknown],
            f"unknown query parameter(s): {', '.join(unknown)}",
        )
    aliases = _PREVIEW_ALIASES.items()
    both = [(a, f"give {a} or {n}, not both") for a, n in aliases if {a, n} <= names]
    if both:
        raise invalid(both)
    out = dict(defaults)
    for alias, name in _PREVIEW_ALIASES.items():
        value = given.get(alias) if alias in names else given.get(name)
        if value is not None:
            out[name] = value
    return out


@router.get("/quota/preview", tags=["pools"], responses=STORE_RESPONSES)
async def preview(
    gw: GW,
    request: Request,
    pool: Annotated[str, Query(min_length=1, description="Pool id")],
    key: Annotated[str, Query(min_length=1, description="Client key id")],
    tokens: NonNegative | None = None,
    requests: NonNegative | None = None,
    usd: NonNegative | None = None,
    estimated_tokens: Annotated[NonNegative | None, Query(alias="estimatedTokens")] = None,
    estimated_requests: Annotated[NonNegative | None, Query(alias="estimatedRequests")] = None,
    estimated_usd: Annotated[NonNegative | None, Query(alias="estimatedUsd")] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
) -> PreviewOut:
    """What admission would decide for this request now, without reserving anything: the
    counters are only read (``peek``/``pool_usage``), never admitted to. The estimate is
    ``tokens`` / ``requests`` (default 1) / ``usd``, or the same under the seeds' names
    ``estimatedTokens`` / ``estimatedRequests`` / ``estimatedUsd``; any other query
    parameter is a 422 naming it."""
    est = _preview_estimate(
        request,
        {
            "tokens": tokens,
            "requests": requests,
            "usd": usd,
            "estimatedTokens": estimated_tokens,
            "estimatedRequests": estimated_requests,
            "estimatedUsd": estimated_usd,
        },
        {"tokens": 0.0, "requests": 1.0, "usd": 0.0},
    )
    tokens, requests, usd = est["tokens"], est["requests"], est["usd"]
    p = PoolRepo(gw.db).get(pool)
    KeyRepo(gw.db).get(key)
    alloc = p.allocation(key)
    effective = alloc or Allocation(key, 0.0, policy=Policy.HARD)
    threshold = gw.quota_settings.saturation_threshold
    # the percent a request of these tokens is priced at, as admission prices it (issue 44,
    # item 1: the preview and admission must not disagree about the same request)
    percent = gw.percent_estimate(p, tokens)
    cost = {Unit.REQUESTS: requests, Unit.TOKENS: tokens, Unit.USD: usd, Unit.PERCENT: percent}
    store = gw.engine.store
    now = gw.clock.now_ms()
    try:
        levels = None
        if p.share_mode is ShareMode.ACTIVE:
            active = set(await store.active_keys(p.id, now - p.active_window_ms))
            levels = dominant_levels(p, sorted(active | {key}))
        checks = compile_checks(
            p,
            effective,
            cost,
            model=model,
            signals=gw.pool_signals(p),
            levels=levels,
            anchors=await store.anchors(p.id),
        )
        refs = [CounterRef(c.key, c.window_ms, c.anchor) for c in checks]
        mine = await store.peek(p.id, key, refs, now)
        pool_refs = [r for r, c in zip(refs, checks, strict=True) if c.scope == "pool"]
        totals = (await store.pool_usage(p.id, [], pool_refs, now)).totals
    except Exception as exc:
        raise _store_unavailable(exc) from None
    counts = [
        (totals.get(c.key, Count()) if c.scope == "pool" else Count(), mine.get(c.key, Count()))
        for c in checks
    ]
    values = [
        (t.value(now, c.window_ms), m.value(now, c.window_ms), m.curr)
        for c, (t, m) in zip(checks, counts, strict=True)
    ]
    verdict = (
        evaluate(checks, values, effective.policy, threshold) if checks else Verdict(Outcome.ALLOW)
    )
    dimension = retry = None
    if verdict.index is not None and verdict.reason is not None:
        check = checks[verdict.index]
        dimension = check.key
        total_c, mine_c = counts[verdict.index]
        retry = retry_after_ms(check, verdict.reason, total_c, mine_c, now, threshold)
    dims = []
    for c, (total, consumed, _) in zip(checks, values, strict=True):
        known = c.limit > UNKNOWN_LIMIT
        used = max(total / c.limit, c.signal) if c.scope == "pool" and known else 0.0
        dims.append(
            PreviewDimensionOut(
                key=c.key,
                unit=c.unit,
                scope="model" if c.scope == "model" else "pool",
                limit=c.limit,
                total=total,
                consumed=consumed,
                fair_share=c.fair_share,
                cap=c.cap,
                cost=c.cost,
                used_fraction=used,
                strict=c.scope == "pool" and used >= threshold,
            )
        )
    return PreviewOut(
        pool=p.id,
        key=key,
        model=model,
        allocated=alloc is not None,
        policy=effective.policy,
        outcome=verdict.outcome,
        reason=verdict.reason,
        dimension=dimension,
        retry_after_ms=retry,
        threshold=threshold,
        dimensions=dims,
    )
