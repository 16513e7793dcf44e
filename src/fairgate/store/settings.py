"""The quota store's settings: which driver, where Redis is, how the SQLite file is written.

Declared here, beside the code they configure, as the ``store`` area of the one settings object
(``fairgate.process.settings``, which reads the sources: DB setting > environment > default).
Every knob is lenient: a value that does not validate is named in a warning and the next source
used, never a stop at start: a gateway that refuses to start over its counter cache's tuning
would turn a typo into an outage. One value falls back on purpose to the stricter choice: a bad
``QUOTA_SQLITE_MODE`` means ``transactional`` (never a silently longer loss window).
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from fairgate.setting_source import From
from fairgate.store.sqlite.memory import DEFAULT_FLUSH_MS
from fairgate.store.sqlite.store import DEFAULT_MODE, MAX_FLUSH_MS, MODES

__all__ = ["DEFAULT_REDIS_TIMEOUT_MS", "DRIVERS", "StoreSettings"]

log = logging.getLogger("fairgate.store")

DRIVERS = ("sqlite", "redis")
#: how long one Redis command may take before the store counts as down (the connect timeout is
#: half of it); bounds what a request waits when Redis hangs
DEFAULT_REDIS_TIMEOUT_MS = 1_000


def _driver(value: object) -> object:
    if isinstance(value, str):
        name = value.strip().lower()
        if name not in DRIVERS:
            raise ValueError(f"not a quota store driver ({' or '.join(DRIVERS)})")
        return name
    return value


def _mode(value: object) -> object:
    """An unknown mode means the stricter one, ``transactional``, said in a warning."""
    if isinstance(value, str):
        mode = value.strip().lower()
        if mode not in MODES:
            log.warning(
                "QUOTA_SQLITE_MODE=%r is not one of %s; using transactional",
                mode[:64],
                "/".join(MODES),
            )
            return "transactional"
        return mode
    return value


def _upper(value: object) -> object:
    return value.strip().upper() if isinstance(value, str) else value


class StoreSettings(BaseModel):
    """Which quota store, and its drivers' knobs (see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver: Annotated[
        Literal["sqlite", "redis"],
        From(db="quotaStore.driver", env="QUOTA_STORE_DRIVER", lenient=True),
        BeforeValidator(_driver),
    ] = Field(
        default="sqlite",
        description="`sqlite` or `redis`; another value is ignored with a warning naming it "
        "(Redis unusable at start: SQLite, with a warning)",
    )
    redis_url: Annotated[
        str | None, From(db="quotaStore.redisUrl", env="QUOTA_STORE_REDIS_URL", lenient=True)
    ] = Field(
        default=None,
        repr=False,
        description="The Redis URL for the `redis` driver (also where the resilience state and "
        "the admission log go); unreachable at start: SQLite, with a warning",
    )
    redis_timeout_ms: Annotated[int, From(env="QUOTA_STORE_REDIS_TIMEOUT_MS", lenient=True)] = (
        Field(
            default=DEFAULT_REDIS_TIMEOUT_MS,
            ge=50,
            le=30_000,
            description="A Redis command without a reply for this long (event-loop lag not "
            "counted) and an unanswered out-of-loop PING is an outage; admissions then fail open "
            "at once and usage is journaled and replayed when Redis is back",
        )
    )
    redis_prefix: Annotated[str, From(env="QUOTA_STORE_REDIS_PREFIX")] = Field(
        default="fairgate",
        min_length=1,
        description="Key prefix in Redis: several gateways or test runs can share one server "
        "without touching each other's counters",
    )
    sqlite_synchronous: Annotated[
        Literal["OFF", "NORMAL", "FULL"],
        From(env="QUOTA_SQLITE_SYNCHRONOUS", lenient=True),
        BeforeValidator(_upper),
    ] = Field(
        default="OFF",
        description="Quota counters survive process crashes either way; `NORMAL` adds "
        "power-loss durability at the cost of a checkpoint fsync stall under load",
    )
    sqlite_mode: Annotated[
        Literal["memory", "transactional"],
        From(env="QUOTA_SQLITE_MODE", lenient=True),
        BeforeValidator(_mode),
    ] = Field(
        default=DEFAULT_MODE,  # type: ignore[arg-type]
        description="`memory`: counters in memory, written behind (a `kill -9` loses at most "
        "the last flush interval); `transactional`: a transaction per admission and settle; "
        "another value: `transactional`, with a warning",
    )
    sqlite_flush_ms: Annotated[int, From(env="QUOTA_SQLITE_FLUSH_MS", lenient=True)] = Field(
        default=DEFAULT_FLUSH_MS,
        ge=1,
        le=MAX_FLUSH_MS,
        description="Memory mode: milliseconds between two write-behind commits, the bound on "
        "what a crash can lose",
    )
