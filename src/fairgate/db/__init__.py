"""The metadata database: connections, client keys, pools, plans, combos and settings.

One set of repositories (``connections``, ``keys``, ``pools``, ``plans``, ``combos``,
``settings``) over SQLite or PostgreSQL (``base``, ``engine``, ``postgres``, ``schema``), the
config file reconciled against what is stored (``reconcile``, ``seeding``, ``applied``,
``inspection``), secrets sealed at rest (``sealing``), OAuth token stores (``oauth_tokens``,
``oauth_redis``) and the change watcher that makes every process rebuild its snapshot
(``watch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.db.base import Database
    from fairgate.db.combos import ComboRecord, ComboRepo
    from fairgate.db.common import (
        Conflict,
        Invalid,
        MetadataUnavailable,
        NotFound,
        RepoError,
        transaction,
    )
    from fairgate.db.connections import ConnectionRepo
    from fairgate.db.engine import database_url, open_database
    from fairgate.db.inspection import compare_database
    from fairgate.db.keys import KeyRepo
    from fairgate.db.oauth_redis import RedisRefreshLock, RedisTokenStore
    from fairgate.db.oauth_tokens import FileRefreshLock, FileTokenStore
    from fairgate.db.plans import PlanRepo
    from fairgate.db.pools import PoolRecord, PoolRepo, resolve_pool
    from fairgate.db.postgres import STATEMENT_DEADLINE_S, PgDatabase
    from fairgate.db.reconcile import start_log
    from fairgate.db.repos import compare_with_config, load_registry, seed_from_config
    from fairgate.db.sealing import prepare_secrets, reseal_all
    from fairgate.db.settings import MODEL_ALIASES, REQUIRE_ALLOCATION, SettingsRepo, access_policy
    from fairgate.db.watch import READ_TIMEOUT_S, ChangeWatcher, MetadataProbe
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "MODEL_ALIASES",
    "READ_TIMEOUT_S",
    "REQUIRE_ALLOCATION",
    "STATEMENT_DEADLINE_S",
    "ChangeWatcher",
    "ComboRecord",
    "ComboRepo",
    "Conflict",
    "ConnectionRepo",
    "Database",
    "FileRefreshLock",
    "FileTokenStore",
    "Invalid",
    "KeyRepo",
    "MetadataProbe",
    "MetadataUnavailable",
    "NotFound",
    "PgDatabase",
    "PlanRepo",
    "PoolRecord",
    "PoolRepo",
    "RedisRefreshLock",
    "RedisTokenStore",
    "RepoError",
    "SettingsRepo",
    "access_policy",
    "compare_database",
    "compare_with_config",
    "database_url",
    "load_registry",
    "open_database",
    "prepare_secrets",
    "reseal_all",
    "resolve_pool",
    "seed_from_config",
    "start_log",
    "transaction",
]
