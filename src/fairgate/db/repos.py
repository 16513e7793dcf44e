"""The repositories of the metadata DB, seeding from the config file and building the registry.

One repository per table lives in its own module (``connections``, ``keys``, ``plans``,
``pools``, ``combos``); this module gathers them, re-exports the seeding from the config file
(``fairgate.db.seeding``) and builds the registry, the operation that reads them all.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fairgate.db.base import Database
from fairgate.db.combos import ComboRecord, ComboRepo
from fairgate.db.common import Conflict, Invalid, NotFound, RepoError, transaction
from fairgate.db.connections import ConnectionRepo
from fairgate.db.keys import KeyRepo
from fairgate.db.plans import PlanRepo
from fairgate.db.pools import PoolRecord, PoolRepo, resolve_pool
from fairgate.db.reconcile import Reconciliation
from fairgate.db.seeding import (
    allocation_from_config,
    compare_with_config,
    connection_from_config,
    dimension_from_config,
    key_from_config,
    pool_record_from_config,
    seed_from_config,
)
from fairgate.db.settings import SettingsRepo, access_policy, model_aliases
from fairgate.routing.aliases import ModelAlias, ModelAliases
from fairgate.routing.model import ComboConfig
from fairgate.secretbox import SecretBox
from fairgate.snapshot import Registry

log = logging.getLogger("fairgate.db")

__all__ = [
    "ComboRecord",
    "ComboRepo",
    "Conflict",
    "ConnectionRepo",
    "Invalid",
    "KeyRepo",
    "NotFound",
    "PlanRepo",
    "PoolRecord",
    "PoolRepo",
    "Reconciliation",
    "RepoError",
    "allocation_from_config",
    "compare_with_config",
    "connection_from_config",
    "dimension_from_config",
    "key_from_config",
    "load_registry",
    "pool_record_from_config",
    "seed_from_config",
    "transaction",
]


# -- registry ---------------------------------------------------------------------------------


def load_registry(
    conn: Database,
    default_provider: str | None = None,
    *,
    box: SecretBox,
    version: int = 0,
    require_allocation: bool | None = None,
    aliases: tuple[ModelAlias, ...] = (),
) -> Registry:
    """Read every table once and build the hot path's snapshot (pool dimensions resolved).
    ``require_allocation``: the config file's ``server.require_allocation`` (None: not set);
    ``aliases``: the config file's ``model_aliases``, unless the admin API stored its own."""
    overrides = PlanRepo(conn).all()
    settings = SettingsRepo(conn).all()
    global_layer, provider_layers = _combo_layers(settings)
    return Registry.build(
        ConnectionRepo(conn, box=box).all(),
        KeyRepo(conn).all(),
        [resolve_pool(r, overrides) for r in PoolRepo(conn).records()],
        default_provider=default_provider,
        version=version,
        combos=ComboRepo(conn).combos(global_layer, provider_layers),
        routing_defaults=_routing_defaults(global_layer),
        require_allocation=access_policy(settings, require_allocation).required,
        aliases=ModelAliases.of(model_aliases(settings, aliases)),
    )


def _routing_defaults(global_layer: Mapping[str, object]) -> ComboConfig:
    """The global layer as a config (what plain models use); unusable → built-in defaults
    (the admin API validates the layer before storing it)."""
    try:
        return ComboConfig.from_layers(global_layer)
    except (ValueError, TypeError):
        log.warning("routing defaults unusable; using the built-in ones")
        return ComboConfig()


def _combo_layers(
    settings: Mapping[str, str],
) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    """The cascade's middle layers from DB settings: ``routing.comboDefaults`` (JSON, every
    combo) and ``routing.providerComboDefaults`` (JSON by provider). Unreadable → ignored."""

    def load(key: str) -> dict[str, Any]:
        try:
            value = json.loads(settings.get(key) or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    providers = {
        p: v for p, v in load("routing.providerComboDefaults").items() if isinstance(v, dict)
    }
    return load("routing.comboDefaults"), providers
