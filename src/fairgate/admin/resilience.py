"""Admin routes for resilience: the health view and clearing what only an admin may clear.

Permanent blocks (billing, deactivated accounts, exhausted monthly quota) never expire on their
own: an operator fixes the account, then clears the block here. Cooldowns, lockouts and breakers
expire by themselves; clearing them is for "I fixed it, try now".
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from fairgate.admin.common import ERROR_RESPONSES, GW, AdminError
from fairgate.db.settings import SettingsRepo
from fairgate.resilience.settings import ResilienceSettings, knob_names, parse_knob

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
            # circuit and journal: is the store considered down, what waits to be replayed
            "outage": gw.engine.health().as_json(),
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
    if kind == "permanent" and model:  # a model-scoped block is named by provider too
        needs = ("connectionId", "provider")
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


class ResilienceSettingsIn(BaseModel):
    """Knobs by camelCase name (``breakerThreshold``, ``apikeyBaseCooldownMs``, ...) and
    per-provider overrides of the same knobs. A null value removes the DB setting."""

    settings: dict[str, float | bool | None] = Field(default_factory=dict)
    providers: dict[str, dict[str, float | bool]] | None = None


def _effective(gw: Any) -> dict[str, Any]:
    mgr = gw.resilience
    current = mgr.settings if mgr is not None else ResilienceSettings()
    return {"settings": dataclasses.asdict(current), "knobs": list(knob_names())}


@router.get("/resilience/settings", tags=["monitoring"])
async def get_settings(gw: GW) -> dict[str, Any]:
    return _effective(gw)


@router.put("/resilience/settings", tags=["monitoring"])
async def put_settings(body: ResilienceSettingsIn, gw: GW) -> dict[str, Any]:
    """Validate everything first (422 naming each bad field, nothing written), then store in
    the DB settings (which win over ``RESILIENCE_*`` env) and apply without a restart."""
    problems: list[tuple[str, str]] = []
    for name, raw in body.settings.items():
        if raw is not None and parse_knob(name, raw) is None:
            problems.append((f"settings.{name}", "unknown knob or value out of range"))
    for provider, knobs in (body.providers or {}).items():
        for name, raw in knobs.items():
            if parse_knob(name, raw) is None:
                problems.append((f"providers.{provider}.{name}", "unknown knob or bad value"))
    if problems:
        raise AdminError(422, "invalid resilience settings", problems)
    repo = SettingsRepo(gw.db)
    for name, raw in body.settings.items():
        if raw is None:
            repo.delete(f"resilience.{name}")
        else:
            repo.set(f"resilience.{name}", json.dumps(raw))
    if body.providers is not None:
        repo.set("resilience.providers", json.dumps(body.providers))
    if gw.resilience is not None:
        gw.resilience.update_settings(gw.settings.with_db(repo.all()).resilience_settings())
    return _effective(gw)


class RoutingDefaultsIn(BaseModel):
    """The middle layers of the combo config cascade (built-in defaults → ``global`` → the
    combo's first target's provider → the combo's own config), in combo config keys."""

    global_: dict[str, Any] = Field(default_factory=dict, alias="global")
    providers: dict[str, dict[str, Any]] = Field(default_factory=dict)


@router.get("/routing/defaults", tags=["combos"])
async def get_routing_defaults(gw: GW) -> dict[str, Any]:
    repo = SettingsRepo(gw.db)
    return {
        "global": json.loads(repo.get("routing.comboDefaults") or "{}"),
        "providers": json.loads(repo.get("routing.providerComboDefaults") or "{}"),
    }


@router.put("/routing/defaults", tags=["combos"])
async def put_routing_defaults(body: RoutingDefaultsIn, gw: GW) -> dict[str, Any]:
    """Validated by building a combo config from the layers (422 naming the layer), then stored
    and applied to every combo at once (the registry is rebuilt)."""
    from fairgate.routing import ComboConfig

    problems: list[tuple[str, str]] = []
    for field_name, layer in [("global", body.global_)] + [
        (f"providers.{p}", layer) for p, layer in body.providers.items()
    ]:
        try:
            ComboConfig.from_layers(layer)
        except (ValueError, TypeError) as exc:
            problems.append((field_name, str(exc)))
    if problems:
        raise AdminError(422, "invalid routing defaults", problems)
    repo = SettingsRepo(gw.db)
    repo.set("routing.comboDefaults", json.dumps(body.global_))
    repo.set("routing.providerComboDefaults", json.dumps(body.providers))
    gw.reload()
    return await get_routing_defaults(gw)
