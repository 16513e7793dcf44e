"""Upstream secrets sealed at rest: the start-up check of the key and the sealing of old rows.

Why at start and not in a SQL migration: Fernet runs in Python, and the key lives outside the
DB. ``prepare_secrets`` runs once per start, after the SQL migrations and before the registry is
read, and is idempotent (two workers starting at once are both safe):

1. **The key check.** ``secret_check`` holds one known value sealed under the key that first
   sealed this DB. A key that cannot open it (the variable unset after a key file was lost, a
   typo, a replica given another key) is refused with :class:`SecretKeyError` naming what to do
   — never silently: the gateway would send undecryptable bytes upstream, or seal new secrets
   under a second key and strand the old ones.
2. **Sealing.** Every connection secret still in clear (a DB from before sealing, or a row
   written by hand) is sealed, each with a compare-and-swap so a concurrent writer wins.
"""

from __future__ import annotations

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database
from fairgate.db.common import transaction
from fairgate.secretbox import ENV_VAR, KEY_FILE, PREFIX, SecretBox, SecretKeyError

__all__ = ["CHECK_PLAINTEXT", "prepare_secrets", "reseal_all"]

#: What the check row opens to under the right key (not a secret: a known value).
CHECK_PLAINTEXT = "fairgate-secret-check-v1"


def _check_key(db: Database, box: SecretBox, now_ms: int) -> None:
    db.execute(
        "INSERT INTO secret_check (id, token, created_ms) VALUES (1, ?, ?) ON CONFLICT DO NOTHING",
        (box.seal(CHECK_PLAINTEXT), now_ms),
    )
    token = str(db.execute("SELECT token FROM secret_check WHERE id = 1").fetchone()[0])
    try:
        ok = box.open(token) == CHECK_PLAINTEXT
    except SecretKeyError:
        ok = False
    if not ok:
        raise SecretKeyError(
            "the metadata DB's secrets were sealed with another key than this gateway's: set "
            f"{ENV_VAR} to the key they were sealed with (or restore <data dir>/{KEY_FILE}); "
            "when rotating, give the new key first and the old one after it, comma separated"
        )


def prepare_secrets(db: Database, box: SecretBox, clock: Clock = SYSTEM_CLOCK) -> int:
    """Check the key against the DB, then seal the clear connection secrets; the number
    sealed. Raises :class:`SecretKeyError` (no secret in its text) on a wrong key."""
    _check_key(db, box, clock.now_ms())
    rows = db.execute(
        "SELECT id, secret FROM connections WHERE secret != '' AND secret NOT LIKE ?",
        (PREFIX + "%",),
    ).fetchall()
    sealed = 0
    with transaction(db):
        for row in rows:
            cur = db.execute(
                "UPDATE connections SET secret = ? WHERE id = ? AND secret = ?",
                (box.seal(str(row[1])), row[0], row[1]),
            )
            sealed += max(cur.rowcount, 0)
    return sealed


def reseal_all(db: Database, box: SecretBox, clock: Clock = SYSTEM_CLOCK) -> int:
    """Key rotation: every connection secret (and the config file's record of it) and the key
    check sealed again under ``box``'s first key, in one transaction (the old keys must still
    be in ``box`` to open them); the number of secrets resealed. Raises
    :class:`SecretKeyError` if a value opens with none."""
    _check_key(db, box, clock.now_ms())
    n = 0
    with transaction(db):
        token = str(db.execute("SELECT token FROM secret_check WHERE id = 1").fetchone()[0])
        db.execute("UPDATE secret_check SET token = ? WHERE id = 1", (box.reseal(token),))
        for cid, stored in db.execute(
            "SELECT id, secret FROM connections WHERE secret != ''"
        ).fetchall():
            db.execute(
                "UPDATE connections SET secret = ? WHERE id = ?", (box.reseal(str(stored)), cid)
            )
            n += 1
        # the config file's last written secrets (db/applied.py): sealed the same way
        for kind, ident, stored in db.execute(
            "SELECT kind, id, secret FROM config_applied WHERE secret != ''"
        ).fetchall():
            db.execute(
                "UPDATE config_applied SET secret = ? WHERE kind = ? AND id = ?",
                (box.reseal(str(stored)), kind, ident),
            )
    return n
