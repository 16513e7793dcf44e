"""Admin routes for resilience: the health view and clearing what only an admin may clear.

Permanent blocks (billing, deactivated accounts, exhausted monthly quota) never expire on their
own: an operator fixes the account, then clears the block here. Cooldowns, lockouts and breakers
expire by themselves; clearing them is for "I fixed it, try now".
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Response

from fairgate.server.admin_common import ERROR_RESPONSES, GW, AdminError

router = APIRouter(responses=ERROR_RESPONSES)

Kind = Literal["cooldown", "lockout", "permanent", "breaker"]


@router.get("/monitoring/health", tags=["monitoring"])
async def health(gw: GW) -> dict[str, Any]:
    """Breakers per provider, cooldowns and lockouts with their remaining time, permanent
    blocks, soft rate-limit warnings, and the quota store's status."""
    reachable = await gw.engine.store.ping()
    out: dict[str, Any] = {
        "quotaStore": {
            "driver": gw.store_choice.driver,
            "requested": gw.store_choice.requested,
            "fallbackReason": gw.store_choice.fallback_reason,
            "reachable": reachable,
            "failOpen": gw.engine.fail_open_count,
            "storeErrors": gw.engine.store_errors,
        },
    }
    if gw.resilience is not None:
        out["resilience"] = await gw.resilience.snapshot()
    return out


@router.delete("/resilience/{kind}", status_code=204, tags=["monitoring"])
async def clear(
    kind: Kind,
    gw: GW,
    provider: str | None = Query(default=None, max_length=128),
    connection_id: str | None = Query(default=None, alias="connectionId", max_length=128),
    model: str | None = Query(default=None, max_length=256),
) -> Response:
    """Clear one cooldown / lockout / permanent block / breaker; 404 when there was none."""
    if gw.resilience is None:
        raise AdminError(503, "resilience is not running")
    needs = {
        "cooldown": ("connectionId",),
        "lockout": ("provider", "connectionId", "model"),
        "permanent": ("connectionId",),
        "breaker": ("provider",),
    }[kind]
    given = {"provider": provider, "connectionId": connection_id, "model": model}
    missing = [(f, "required for this kind") for f in needs if not given[f]]
    if missing:
        raise AdminError(422, f"{kind} needs {', '.join(needs)}", missing)
    cleared = await gw.resilience.clear(
        kind, provider=provider, connection_id=connection_id, model=model
    )
    if not cleared:
        raise AdminError(404, f"no {kind} to clear for {given}")
    return Response(status_code=204)
