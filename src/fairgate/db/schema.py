"""Schema migrations of the metadata DB, in order. Append only; never edit a shipped one.

One list serves both engines. A plain string is portable SQL, written for SQLite and translated
for PostgreSQL by :func:`fairgate.db.postgres.translate_ddl` (64-bit integers, double floats,
byte-order text); a :class:`PerEngine` entry gives each engine its own text where the two cannot
share one (triggers). Statements are separated by ``;`` at the end of a line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Engine = Literal["sqlite", "postgres"]


@dataclass(frozen=True, slots=True)
class PerEngine:
    """A migration whose SQL differs by engine (applied as the same version on both)."""

    sqlite: str
    postgres: str


#: Tables the registry and the quota settings are built from: a write to any of them bumps
#: ``meta_version`` (and, on PostgreSQL, notifies ``fairgate_meta``), which is how every
#: replica or worker learns that its snapshot is stale (fairgate.db.watch).
REGISTRY_TABLES: tuple[str, ...] = (
    "settings",
    "provider_plans",
    "connections",
    "client_keys",
    "pools",
    "pool_connections",
    "allocations",
    "combos",
)

#: The channel PostgreSQL notifies on each change to the registry tables.
NOTIFY_CHANNEL = "fairgate_meta"


def _sqlite_version_triggers() -> str:
    return ";\n".join(
        f"CREATE TRIGGER IF NOT EXISTS meta_bump_{t}_{op.lower()} AFTER {op} ON {t} "
        "BEGIN UPDATE meta_version SET version = version + 1 WHERE id = 1; END"
        for t in REGISTRY_TABLES
        for op in ("INSERT", "UPDATE", "DELETE")
    )


def _postgres_version_triggers() -> str:
    function = (
        "CREATE OR REPLACE FUNCTION fairgate_meta_bump() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "DECLARE v BIGINT; BEGIN "
        "UPDATE meta_version SET version = version + 1 WHERE id = 1 RETURNING version INTO v; "
        f"PERFORM pg_notify('{NOTIFY_CHANNEL}', v::text); RETURN NULL; END $$"
    )
    triggers = (
        f"CREATE OR REPLACE TRIGGER meta_bump_{t} AFTER INSERT OR UPDATE OR DELETE ON {t} "
        "FOR EACH STATEMENT EXECUTE FUNCTION fairgate_meta_bump()"
        for t in REGISTRY_TABLES
    )
    return ";\n".join((function, *triggers))


_META_VERSION = """
    CREATE TABLE IF NOT EXISTS meta_version (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
    INSERT INTO meta_version (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING;
"""

MIGRATIONS: tuple[str | PerEngine, ...] = (
    # 1: settings (DB settings win over env and config file)
    """
    CREATE TABLE IF NOT EXISTS settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS provider_plans (
        connection_id TEXT PRIMARY KEY,
        dimensions TEXT NOT NULL,
        updated_ms INTEGER NOT NULL DEFAULT 0
    )
    """,
    # 2: the metadata the registry is built from. JSON columns hold small lists; ids follow
    # config.ID_PATTERN. A connection belongs to at most one pool (UNIQUE(connection_id)), and
    # ``position`` keeps the member order (the first member's plan is the pool's default).
    """
    CREATE TABLE IF NOT EXISTS connections (
        id TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        base_url TEXT NOT NULL,
        secret TEXT NOT NULL DEFAULT '',
        protocol TEXT,
        auth_type TEXT NOT NULL DEFAULT 'apikey',
        weight REAL NOT NULL DEFAULT 1,
        max_concurrent INTEGER,
        models TEXT NOT NULL DEFAULT '[]',
        enabled INTEGER NOT NULL DEFAULT 1,
        created_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS client_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL DEFAULT '',
        key_hash TEXT NOT NULL UNIQUE,
        prefix TEXT NOT NULL DEFAULT '',
        enabled INTEGER NOT NULL DEFAULT 1,
        allowed_models TEXT NOT NULL DEFAULT '[]',
        created_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS pools (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL DEFAULT '',
        provider TEXT NOT NULL,
        share_mode TEXT NOT NULL DEFAULT 'static',
        active_window_ms INTEGER NOT NULL DEFAULT 900000,
        dimensions TEXT NOT NULL DEFAULT '[]',
        created_ms INTEGER NOT NULL DEFAULT 0,
        updated_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS pool_connections (
        pool_id TEXT NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
        connection_id TEXT NOT NULL UNIQUE REFERENCES connections(id) ON DELETE CASCADE,
        position INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (pool_id, connection_id)
    );
    CREATE TABLE IF NOT EXISTS allocations (
        pool_id TEXT NOT NULL REFERENCES pools(id) ON DELETE CASCADE,
        key_id TEXT NOT NULL REFERENCES client_keys(id) ON DELETE CASCADE,
        weight REAL NOT NULL DEFAULT 0,
        cap_value REAL,
        cap_unit TEXT,
        policy TEXT NOT NULL DEFAULT 'hard',
        model_caps TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (pool_id, key_id)
    );
    CREATE INDEX IF NOT EXISTS allocations_by_key ON allocations (key_id)
    """,
    # 3: resilience state that must survive a restart (resilience/persistence.py): active
    # cooldowns (kind 'cooldown'), model lockouts ('lockout'), open breakers ('breaker') with
    # their absolute deadline, and permanent blocks ('permanent', until_ms NULL) that only an
    # admin clears. ``scope`` is the entry's unique name; expired rows are pruned lazily.
    """
    CREATE TABLE IF NOT EXISTS resilience_state (
        scope TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        provider TEXT NOT NULL DEFAULT '',
        connection_id TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        until_ms INTEGER,
        level INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '',
        permanent INTEGER NOT NULL DEFAULT 0,
        data TEXT NOT NULL DEFAULT '{}',
        updated_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS resilience_state_expiry ON resilience_state (permanent, until_ms)
    """,
    # 4: user combos (db/combos.py). ``targets`` and ``config`` are JSON as the admin API shows
    # them (camelCase); ``config`` holds only the settings the combo sets itself, so the others
    # keep following the defaults below it. The minted qtSd/ combos are never stored.
    """
    CREATE TABLE IF NOT EXISTS combos (
        name TEXT PRIMARY KEY,
        strategy TEXT NOT NULL,
        targets TEXT NOT NULL,
        config TEXT NOT NULL DEFAULT '{}',
        created_ms INTEGER NOT NULL DEFAULT 0,
        updated_ms INTEGER NOT NULL DEFAULT 0
    )
    """,
    # 5: tenancy (docs/security.md). Keys name the connections outside every pool they may use
    # (by id or provider); a connection lists the client headers it forwards. No character of a
    # client key is kept: the display prefix is blanked (the column stays, unused). A connection
    # with no model list served any model; it must now say so, so existing rows get ["*"] and
    # keep serving what they served. A DB that already holds connections or keys predates
    # server.require_allocation: it is marked, and keeps open access (with a warning at start)
    # until the setting is chosen; a new DB enforces allocations.
    """
    ALTER TABLE client_keys ADD COLUMN allowed_connections TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE client_keys ADD COLUMN allowed_providers TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE connections ADD COLUMN forward_headers TEXT NOT NULL DEFAULT '[]';
    UPDATE client_keys SET prefix = '' WHERE prefix != '';
    UPDATE connections SET models = '["*"]' WHERE models IN ('', '[]');
    INSERT OR IGNORE INTO settings (key, value)
        SELECT 'access.legacyOpen', '1'
        WHERE EXISTS (SELECT 1 FROM client_keys) OR EXISTS (SELECT 1 FROM connections)
    """,
    # 6: the change counter every replica polls (fairgate.db.watch): one row, bumped by a
    # trigger on each write to a registry table, so a write by any process (another replica, a
    # second worker, the CLI) is seen, not only the admin API's.
    PerEngine(
        sqlite=_META_VERSION + _sqlite_version_triggers(),
        postgres=_META_VERSION + _postgres_version_triggers(),
    ),
    # 7: upstream secrets sealed at rest (db/sealing.py). SQL cannot run Fernet, so this step
    # only adds the key check: one value sealed under the key that sealed the DB, so a
    # gateway started with a missing or wrong FAIRGATE_SECRET_KEY stops with a clear error
    # instead of sending garbage upstream. The clear secrets of older DBs are sealed by
    # ``db.sealing.prepare_secrets`` at the next start, before anything reads them.
    """
    CREATE TABLE IF NOT EXISTS secret_check (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        token TEXT NOT NULL,
        created_ms INTEGER NOT NULL DEFAULT 0
    )
    """,
    # 8: the config file against the database (issue 49; db/seeding.py). ``config_applied``
    # holds, per object the file wrote (kind: connection, key, plan, pool, allocations, combo),
    # the form it wrote as JSON: while the object still has that form nobody changed it since
    # and the file may update it; once it differs the admin API (or the CLI, the dashboard,
    # another replica) changed it and a start keeps it. A connection's secret is in ``secret``,
    # sealed like the connection's own. ``retired_key_hashes``: the hash of every client key
    # secret rotated away or revoked (db/keys.py), never stored for a key again, whatever the
    # config file says. A DB of an earlier version starts with both empty: what equals the
    # file is adopted at the next start, what differs is kept.
    """
    CREATE TABLE IF NOT EXISTS config_applied (
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        applied TEXT NOT NULL,
        secret TEXT NOT NULL DEFAULT '',
        applied_ms INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (kind, id)
    );
    CREATE TABLE IF NOT EXISTS retired_key_hashes (
        key_hash TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        retired_ms INTEGER NOT NULL DEFAULT 0
    )
    """,
    # 9: the billing-relevant body fields (service_tier, store) a connection lets clients set
    # (issue 43, N13; registry.BILLING_FIELDS). Existing connections get none: a tenant's
    # service_tier: priority no longer reaches a shared account unless an admin allows it.
    """
    ALTER TABLE connections ADD COLUMN billing_fields TEXT NOT NULL DEFAULT '[]'
    """,
    # 10: a pool's admission setting (issue 45, item 1; quota/hold.py): refuse or hold a
    # request that does not fit, its patience and the queue limits, as one JSON object.
    # Existing pools get '{}': refuse, as before.
    """
    ALTER TABLE pools ADD COLUMN admission TEXT NOT NULL DEFAULT '{}'
    """,
)

#: The schema version that added ``config_applied`` and ``retired_key_hashes`` (a reader of an
#: older DB, such as ``fairgate config check`` before the first start, finds them empty).
PROVENANCE_VERSION = 8
#: The schema version that added ``connections.billing_fields``.
BILLING_FIELDS_VERSION = 9


def statements(migration: str | PerEngine, engine: Engine) -> list[str]:
    """The migration's statements for ``engine`` (PostgreSQL DDL still to translate when the
    entry is a portable string: see :func:`fairgate.db.postgres.translate_ddl`)."""
    text = migration if isinstance(migration, str) else getattr(migration, engine)
    return [stmt for stmt in text.split(";\n") if stmt.strip()]
