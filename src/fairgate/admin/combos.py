"""Admin routes of combos (SPEC §8): ``/combos`` CRUD.

User combos live in the metadata DB (:class:`~fairgate.db.combos.ComboRepo`); every change
reloads the registry so the next request routes by it. The ``qtSd/<pool>/<model>`` quota-share
combos are minted by the registry from the pools: they are listed with ``?internal=true`` and
readable by name, but a PUT or DELETE on one is a 409 — editing them would be undone by the next
reload, and their strategy is not user-selectable anyway.

Why the checks are where they are: the body model refuses what it can see alone (an unknown
strategy, ``quota-share``, a ``qtSd/`` name, bad numbers) with a 422 naming the field; the
repository refuses, in its transaction, what needs the DB (a target provider with no connection:
``targets.<i>.provider``) and the routing layer's own rules. A refused request writes nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from fairgate.admin.common import ERROR_RESPONSES, GW, AdminError, invalid
from fairgate.admin.models import ComboIn, ComboOut, ComboReplace
from fairgate.config import ComboSettingsSpec, ComboSpec, ComboTargetSpec
from fairgate.db.combos import ComboRecord, ComboRepo
from fairgate.process.state import Gateway
from fairgate.routing.combo import Combo
from fairgate.routing.quota_share import is_internal, parse_qtsd

router = APIRouter(responses=ERROR_RESPONSES)


def _user_out(rec: ComboRecord) -> ComboOut:
    spec = rec.spec
    return ComboOut(
        name=spec.name,
        strategy=spec.strategy,
        targets=spec.targets,
        config=spec.config,
        internal=False,
        created_ms=rec.created_ms,
        updated_ms=rec.updated_ms,
    )


def _internal_out(combo: Combo) -> ComboOut:
    parsed = parse_qtsd(combo.name)
    return ComboOut(
        name=combo.name,
        strategy=combo.strategy,
        targets=[ComboTargetSpec.of(t) for t in combo.targets],
        config=ComboSettingsSpec(),
        internal=True,
        pool=None if parsed is None else parsed[0],
    )


def _read_only(name: str) -> AdminError:
    return AdminError(
        409,
        f"combo '{name}' is an internal quota-share combo, minted from its pool: it is "
        "read-only (change the pool or its connections instead)",
    )


def _internal(gw: Gateway, name: str) -> Combo:
    reg = gw.registry
    combo = reg.internal_combos.get(name) or reg.wildcard_combos.get(name)
    if combo is None:
        raise AdminError(404, f"combo '{name}' not found")
    return combo


@router.get("/combos", tags=["combos"])
async def list_combos(
    gw: GW,
    internal: Annotated[
        bool, Query(description="Also list the minted qtSd/<pool>/<model> combos (read-only)")
    ] = False,
) -> list[ComboOut]:
    out = [_user_out(rec) for rec in ComboRepo(gw.db, gw.clock).all()]
    if internal:
        # with those of wildcard pools, minted at their model's first request
        minted = {**gw.registry.wildcard_combos, **gw.registry.internal_combos}
        out.extend(_internal_out(minted[name]) for name in sorted(minted))
    return out


@router.post("/combos", status_code=201, tags=["combos"])
async def create_combo(body: ComboIn, gw: GW) -> ComboOut:
    """Creates a combo; 409 if the name is taken, 422 naming the field otherwise."""
    rec = ComboRepo(gw.db, gw.clock).create(body)
    gw.reload()
    return _user_out(rec)


@router.get("/combos/{name:path}", tags=["combos"])
async def get_combo(name: str, gw: GW) -> ComboOut:
    if is_internal(name):
        return _internal_out(_internal(gw, name))
    return _user_out(ComboRepo(gw.db, gw.clock).get(name))


@router.put("/combos/{name:path}", tags=["combos"])
async def replace_combo(name: str, body: ComboReplace, gw: GW) -> ComboOut:
    """Replaces strategy, targets and config (settings left out follow the defaults again)."""
    if is_internal(name):
        _internal(gw, name)  # 404 when no such combo, 409 when it exists
        raise _read_only(name)
    repo = ComboRepo(gw.db, gw.clock)
    repo.get(name)  # 404 first: the path's name is then known to be a valid one
    if body.name is not None and body.name != name:
        raise invalid([("name", f"must be the combo's name '{name}' (renaming is not supported)")])
    spec = ComboSpec(name=name, strategy=body.strategy, targets=body.targets, config=body.config)
    rec = repo.replace(spec)
    gw.reload()
    return _user_out(rec)


@router.delete("/combos/{name:path}", status_code=204, tags=["combos"])
async def delete_combo(name: str, gw: GW) -> Response:
    if is_internal(name):
        _internal(gw, name)
        raise _read_only(name)
    ComboRepo(gw.db, gw.clock).delete(name)
    gw.reload()
    return Response(status_code=204)
