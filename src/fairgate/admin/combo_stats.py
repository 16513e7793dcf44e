"""``GET /api/combos/{name}/stats``: how a combo's targets have behaved lately.

The figures are the ones the strategies already route by (``routing.metrics.TargetMetrics``:
outcomes per minute over the last 15 minutes, latency quantiles over the last successful
answers), joined with what resilience says about each target right now (its provider's breaker,
a cooldown or lockout on its connection), and the fallbacks the combo took with their reasons.
They belong to this gateway process: a replica reports its own traffic.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import Field

from fairgate.admin.common import ERROR_RESPONSES, GW, AdminError
from fairgate.admin.models import ApiModel
from fairgate.process.state import Gateway
from fairgate.routing import Target, expand_targets

router = APIRouter(responses=ERROR_RESPONSES)


class TargetStatsOut(ApiModel):
    key: str = Field(description="provider/model or provider/model@connection")
    provider: str
    model: str
    connection: str | None
    weight: float
    requests: int
    errors: int
    success_rate: float | None
    p50_ms: float | None
    p95_ms: float | None
    last_ok_ms: int | None
    last_error_ms: int | None
    breaker: str = Field(description="closed, open or half-open (the provider's breaker)")
    blocked_until_ms: int | None = Field(
        description="A cooldown or lockout on the target's connection ends then"
    )
    state: str = Field(description="One word for the table: ok, breaker-open, cooldown, …")


class ComboStatsOut(ApiModel):
    name: str
    strategy: str
    window_minutes: int
    at_ms: int
    targets: list[TargetStatsOut]
    fallbacks: dict[str, int] = Field(
        description="Fallbacks to a later target in the window, by the reason the earlier failed"
    )


def _blocks(
    resilience: dict[str, Any], t: Target, conns: list[str]
) -> tuple[int | None, str | None]:
    """When ``t`` is usable again and why, if every connection it may use (``conns``) is in a
    cooldown or (for its model) a lockout; ``(None, None)`` while one of them is free."""
    per_conn: dict[str, tuple[int, str]] = {}

    def block(conn_id: object, until: object, kind: str) -> None:
        if isinstance(conn_id, str) and isinstance(until, int) and conn_id in conns:
            per_conn[conn_id] = max(per_conn.get(conn_id, (0, "")), (until, kind))

    for cd in resilience.get("cooldowns", []):
        block(cd.get("connection_id"), cd.get("until_ms"), "cooldown")
    for lk in resilience.get("lockouts", []):
        if lk.get("model") == t.model:
            block(lk.get("connection_id"), lk.get("until_ms"), "lockout")
    if not conns or len(per_conn) < len(conns):
        return None, None
    until, kind = min(per_conn.values())
    return until, kind


async def combo_stats(gw: Gateway, name: str) -> ComboStatsOut:
    combo = gw.registry.combo(name)
    if combo is None:
        raise AdminError(404, f"combo '{name}' not found")
    now = gw.clock.now_ms()
    metrics = gw.target_metrics
    resilience = await gw.resilience.snapshot() if gw.resilience is not None else {}
    breakers = resilience.get("breakers", {})
    rows: list[TargetStatsOut] = []
    for t in expand_targets(combo.targets, gw.registry.by_provider):
        st = metrics.stats(t.key, now) if metrics is not None else None
        breaker = str(breakers.get(t.provider, {}).get("state", "closed"))
        conns = (
            [t.connection_id]
            if t.connection_id not in (None, "*")
            else [c.id for c in gw.registry.by_provider.get(t.provider, ()) if c.serves(t.model)]
        )
        until, kind = _blocks(resilience, t, [c for c in conns if c is not None])
        state = f"breaker-{breaker}" if breaker != "closed" else kind if kind is not None else "ok"
        rows.append(
            TargetStatsOut(
                key=t.key,
                provider=t.provider,
                model=t.model,
                connection=t.connection_id,
                weight=t.weight,
                requests=0 if st is None else st.requests,
                errors=0 if st is None else st.errors,
                success_rate=None if st is None else st.success_rate,
                p50_ms=None if st is None else st.p50_ms,
                p95_ms=None if st is None else st.p95_ms,
                last_ok_ms=None if st is None else st.last_ok_ms,
                last_error_ms=None if st is None else st.last_error_ms,
                breaker=breaker,
                blocked_until_ms=until,
                state=state,
            )
        )
    return ComboStatsOut(
        name=combo.name,
        strategy=combo.strategy,
        window_minutes=metrics.window_minutes if metrics is not None else 15,
        at_ms=now,
        targets=rows,
        fallbacks={} if gw.fallback_counts is None else gw.fallback_counts.counts(combo.name, now),
    )


@router.get("/combos/{name:path}/stats", tags=["combos"])
async def get_combo_stats(name: str, gw: GW) -> ComboStatsOut:
    """Per target: requests, success rate, p50/p95 latency, breaker and cooldown state; and the
    combo's fallbacks by reason — over the last 15 minutes of this gateway process."""
    return await combo_stats(gw, name)
