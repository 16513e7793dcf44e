"""Admin routes of the model aliases (issue 42, item 8).

``GET /api/model-aliases`` gives the aliases in force and where they come from (``db``: set
here; ``config``: the config file's ``model_aliases``); ``PUT`` replaces them all (the order
matters: wildcard patterns are tried in it), ``DELETE`` drops the stored ones so the config
file's apply again. Stored as one DB setting, like every setting: DB > config file > none. A
change reloads the registry at once (and reaches other replicas through the settings' change
feed, like the access setting).
"""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Response
from pydantic import Field

from fairgate.admin.common import ERROR_RESPONSES, GW, STORE_RESPONSES
from fairgate.admin.models import ApiModel
from fairgate.config import ModelAliasConfig
from fairgate.db.common import transaction
from fairgate.db.settings import MODEL_ALIASES, SettingsRepo
from fairgate.process.state import Gateway

router = APIRouter(responses=ERROR_RESPONSES)


class ModelAliasesIn(ApiModel):
    aliases: list[ModelAliasConfig] = Field(
        description="Exact names first, then patterns with * in this order; the first match wins"
    )


class ModelAliasesOut(ApiModel):
    aliases: list[ModelAliasConfig]
    source: Literal["db", "config"] = Field(
        description="db: set through this API; config: the config file's model_aliases"
    )


def _out(gw: Gateway) -> ModelAliasesOut:
    stored = SettingsRepo(gw.db).get(MODEL_ALIASES) is not None
    aliases = gw.registry.aliases.aliases
    return ModelAliasesOut(
        aliases=[ModelAliasConfig(pattern=a.pattern, target=a.target) for a in aliases],
        source="db" if stored else "config",
    )


@router.get("/model-aliases", tags=["models"])
async def get_model_aliases(gw: GW) -> ModelAliasesOut:
    return _out(gw)


@router.put("/model-aliases", tags=["models"], responses=STORE_RESPONSES)
async def put_model_aliases(body: ModelAliasesIn, gw: GW) -> ModelAliasesOut:
    """Replace the aliases (an empty list: no alias, whatever the config file says)."""
    value = json.dumps([{"pattern": a.pattern, "target": a.target} for a in body.aliases])
    with transaction(gw.db):
        SettingsRepo(gw.db).set(MODEL_ALIASES, value)
    gw.reload()
    return _out(gw)


@router.delete("/model-aliases", status_code=204, tags=["models"], responses=STORE_RESPONSES)
async def delete_model_aliases(gw: GW) -> Response:
    """Drop the stored aliases: the config file's apply again."""
    with transaction(gw.db):
        SettingsRepo(gw.db).delete(MODEL_ALIASES)
    gw.reload()
    return Response(status_code=204)
