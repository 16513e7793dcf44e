"""The config file compared with a metadata DB from outside the gateway (``fairgate config
check``): found the way ``serve`` finds it, read without creating, migrating or writing anything.

Why read-only: the check runs before a restart (``ExecStartPre``), possibly beside a running
gateway of an older version; it must not create a data dir, a key file or a database, nor
migrate one. A DB of the previous version is compared as the next start will see it (no records
yet); an older one is not compared.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import psycopg

from fairgate.config import Config
from fairgate.db.common import MetadataUnavailable, RepoError
from fairgate.db.engine import DATABASE_URL_ENV, database_url, open_database, schema_version
from fairgate.db.reconcile import Reconciliation
from fairgate.db.schema import PROVENANCE_VERSION
from fairgate.db.seeding import compare_with_config, declared_objects, pools_of
from fairgate.quota.model import unenforced_pools
from fairgate.secretbox import SecretKeyError, load_box

__all__ = ["Comparison", "compare_database"]

#: The oldest schema compared: the version before the records (issue 49), read as having none.
OLDEST_COMPARED = PROVENANCE_VERSION - 1


@dataclass(frozen=True, slots=True)
class Comparison:
    """``where``: the DB compared (a path, or the variable naming PostgreSQL: never the URL,
    which may hold a password); ``result``: the comparison, or None with ``note`` saying why."""

    where: str
    result: Reconciliation | None = None
    note: str | None = None

    def warnings(self, config: Config) -> list[str]:
        """The pools that would enforce nothing: as a start leaves the database when it was
        compared (the pools the admin API made count too), else as the file declares them."""
        objects = self.result.after if self.result is not None else declared_objects(config)
        return unenforced_pools(pools_of(objects))

    def enforced(self, config: Config) -> list[dict[str, object]]:
        """What each pool will enforce (the pools :meth:`warnings` looks at): per dimension the
        pool's whole limit, how it was written (the pool's own, or one connection's × the
        connections) and whether it is known; what ``GET /api/quota/pools`` will say."""
        objects = self.result.after if self.result is not None else declared_objects(config)
        return [
            {
                "pool": p.id,
                "connections": len(p.connections),
                "dimensions": [
                    {
                        "key": d.key,
                        "unit": d.unit.value,
                        "window": d.window.value,
                        "limit": d.limit,
                        "enforced": d.known,
                        "basis": p.basis(d).value,
                        "writtenLimit": p.written_limit(d),
                    }
                    for d in p.dimensions
                ],
            }
            for p in pools_of(objects)
        ]

    def as_json(self) -> dict[str, object]:
        return {
            "where": self.where,
            "compared": self.result is not None,
            "note": self.note,
            "differences": None
            if self.result is None
            else [d.as_json() for d in self.result.differences],
        }


def compare_database(
    config: Config, data_dir: Path, *, database: str | None, secret_key: str | None
) -> Comparison:
    """Compare ``config`` with the metadata DB ``serve`` would open with these settings
    (``database``: the settings' ``database_url``, unchecked; ``secret_key``: their
    ``secret_key``) and ``data_dir``; every failure is a :class:`Comparison` with a note (the
    file itself is valid, so the check still passes)."""
    try:
        url = database_url(database)
    except ValueError as exc:
        return Comparison(DATABASE_URL_ENV, note=str(exc))
    path = data_dir / "fairgate.sqlite"
    where = f"PostgreSQL ({DATABASE_URL_ENV})" if url is not None else str(path)
    if url is None and not path.exists():
        return Comparison(
            where, note="no database yet: the first start creates everything the file declares"
        )
    try:
        box, _ = load_box(data_dir, secret_key, shared_db=url is not None, create=False)
        db = open_database(url, path, migrate=False)
    except (SecretKeyError, MetadataUnavailable) as exc:
        return Comparison(where, note=f"not compared: {exc}")
    try:
        version = schema_version(db)
        if version < OLDEST_COMPARED:
            return Comparison(
                where,
                note=f"not compared: the database is of an older version (schema {version}); "
                "the next start migrates it",
            )
        return Comparison(where, compare_with_config(db, config, box=box))
    except (SecretKeyError, MetadataUnavailable, RepoError) as exc:
        return Comparison(where, note=f"not compared: {exc}")
    except (sqlite3.Error, psycopg.Error) as exc:
        return Comparison(where, note=f"not compared: the database cannot be read ({exc})")
    finally:
        db.close()
