"""Schema migrations of the metadata DB, in order. Append only; never edit a shipped one."""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
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
)
