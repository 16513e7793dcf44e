"""The gateway's runtime state, shared by the ``/v1`` proxy and the ``/api`` admin app.

Why one object: the proxy reads an immutable :class:`~fairgate.snapshot.Registry` snapshot per
request (no DB query on the hot path), the admin API writes the metadata DB and then calls
:meth:`Gateway.reload` to swap in a fresh snapshot. The engine, the store choice and the settings
live here too so that a settings change (say, a new Redis URL) takes effect without a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from fairgate import environment
from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.config import Config, ConfigError
from fairgate.db.base import Database
from fairgate.db.common import MetadataUnavailable, RepoError
from fairgate.db.connections import ConnectionRepo
from fairgate.db.engine import database_url, open_database
from fairgate.db.postgres import STATEMENT_DEADLINE_S, PgDatabase
from fairgate.db.reconcile import start_log
from fairgate.db.repos import compare_with_config, load_registry, seed_from_config
from fairgate.db.sealing import prepare_secrets
from fairgate.db.settings import SettingsRepo, access_policy
from fairgate.db.watch import READ_TIMEOUT_S, ChangeWatcher, MetadataProbe
from fairgate.files import private_dir
from fairgate.process.http_settings import ADMIN_KEY_MIN_LENGTH
from fairgate.process.oauth_service import OAuthAccounts
from fairgate.process.settings import Settings
from fairgate.quota.engine import QuotaEngine, SignalSource
from fairgate.quota.model import Pool, unenforced_pools
from fairgate.quota.ports import SlotLeases, SlotLeaseSource
from fairgate.quota.retention import RetentionGc
from fairgate.quota.settings import QuotaSettings
from fairgate.resilience.factory import build_manager
from fairgate.resilience.manager import RateLimitManager
from fairgate.routing.fallbacks import FallbackCounts
from fairgate.routing.metrics import TargetMetrics
from fairgate.secretbox import ENV_VAR, KEY_FILE, SecretBox, SecretKeyError, load_box
from fairgate.snapshot import Registry
from fairgate.store.admission_log import (
    MAX_AGE_MS,
    LogBackend,
    RedisLogBackend,
    SharedPoolLog,
    SqliteLogBackend,
)
from fairgate.store.factory import StoreChoice, create_store
from fairgate.timers import SystemTimer, Timer

log = logging.getLogger("fairgate.server")

#: How long a stop waits for each background task it cancelled. A task that outlives it (a
#: library that swallowed the cancel, a read stuck on a hung server) is logged and left to the
#: loop's own shutdown: a stop must never hang the process or a test.
STOP_TASK_TIMEOUT_S = 5.0


async def _cancel_within(task: asyncio.Task[None], timeout_s: float) -> None:
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        log.warning("background task %s did not stop within %g s", task.get_name(), timeout_s)
    elif not task.cancelled() and task.exception() is not None:
        log.warning("background task %s ended with %r", task.get_name(), task.exception())


class Gateway:
    """Runtime state. Construct, ``await start()``, use, ``await stop()``.

    ``registry``, ``engine``, ``db``, ``store_choice`` and ``quota_settings`` exist after
    :meth:`start`; ``registry`` is an empty snapshot before it.
    """

    registry: Registry
    engine: QuotaEngine
    retention: RetentionGc
    store_choice: StoreChoice
    quota_settings: QuotaSettings
    db: Database
    #: seals the upstream secrets and OAuth tokens at rest (``FAIRGATE_SECRET_KEY`` or the
    #: data dir's key file; see fairgate.secretbox)
    box: SecretBox
    #: the admission log of every pool, shared like the quota counters (store/admission_log.py)
    pool_log: SharedPoolLog

    def __init__(
        self,
        *,
        data_dir: Path,
        config: Config | None = None,
        env: Mapping[str, str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        admin_key: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config = config if config is not None else Config.default()
        #: the process settings the CLI resolved at start (else resolved here from ``env``, by
        #: default a snapshot of the environment, as strictly: a bad value raises
        #: SettingsError naming the variable)
        self.settings = settings or Settings.load(
            environment.snapshot() if env is None else env, self.config
        )
        self.clock = clock
        #: waits of the request path (fall-through pauses, cooldown waits, slot queues) on
        #: ``clock``; tests swap in a ManualTimer that shares their ManualClock
        self.timer: Timer = SystemTimer(clock)
        self.admin_key: str | None = admin_key or self.settings.admin_key
        #: key id → when this process last authenticated it (epoch ms), for the Keys page;
        #: one entry per key, so bounded by the key table, and never written on the hot path
        #: to the database
        self.key_last_used: dict[str, int] = {}
        self.signals_source: SignalSource | None = None
        #: the percent a request of so many tokens is expected to cost on a connection (the
        #: provider signals' robust ratio): admission and the preview price it alike
        self.percent_estimator: Callable[[str, float], float] | None = None
        #: the proxy's per-target metrics (set by the app at startup), read by the admin API's
        #: combo statistics; None before the app has started
        self.target_metrics: TargetMetrics | None = None
        #: the proxy's windowed fallback counts per combo and reason (set likewise)
        self.fallback_counts: FallbackCounts | None = None
        #: cooldowns, lockouts, breakers (built at start; shared through Redis when the quota
        #: store is Redis, persisted in the metadata DB so a restart keeps them)
        self.resilience: RateLimitManager | None = None
        #: concurrency slots shared by the replicas (set at start when the quota store can;
        #: None: each process enforces ``max_concurrent`` on its own traffic)
        self.slot_leases: SlotLeases | None = None
        self.registry = Registry(default_provider=self.config.server.default_provider)
        self.quota_settings = self._settings_from({})
        self._store_lock = asyncio.Lock()
        self._started = False
        self._replay_task: asyncio.Task[None] | None = None
        self._gc_task: asyncio.Task[None] | None = None
        #: follows the metadata DB's change counter (writes by other replicas or workers)
        self.watcher: ChangeWatcher[_Snapshot] | None = None
        #: the watcher thread's own connection to the metadata DB (opened there, on first use)
        self._reader: Database | None = None
        #: bumped by each :meth:`reload` (this process's own writes): a snapshot the watcher's
        #: thread began reading before it is older than the registry in use and is not applied
        self._reload_generation = 0
        #: asks PostgreSQL whether it answers before an admin call uses the loop's connection
        self._probe: MetadataProbe | None = None
        self._db_url: str | None = None
        #: the OAuth connections' tokens and logins (set by the app at start)
        self.oauth: OAuthAccounts | None = None
        #: called after each registry rebuild with the DB's settings as read with it (the OAuth
        #: side adopts other replicas' logins); on the event loop, so no I/O
        self.reload_hooks: list[Callable[[Mapping[str, str]], None]] = []
        self._watch_task: asyncio.Task[None] | None = None
        self._log_task: asyncio.Task[None] | None = None
        #: what differs between the config file and the database, as last compared (None: not
        #: compared yet, or the comparison failed every time so far)
        self._config_differences: list[dict[str, object]] | None = None

    @property
    def db_path(self) -> Path:
        return self.data_dir / "fairgate.sqlite"

    @property
    def quota_store_path(self) -> Path:
        return self.data_dir / "quota.sqlite"

    async def start(self) -> None:
        """Open the DB, seed it from the config file, open the quota store, build the registry.

        Raises :class:`ConfigError` when the config file cannot be seeded (for example it puts a
        connection in a pool while the DB has it in another, moved there by the admin API)."""
        private_dir(self.data_dir)
        try:
            db_url = database_url(self.settings.database_url)
            poll_s = self._metadata_poll_s()
        except ValueError as exc:
            raise ConfigError([("", str(exc))]) from None
        self.box = self._secret_box(shared_db=db_url is not None)
        # used on the event loop: a statement to a hung server is cut (db/postgres.py)
        self.db = open_database(db_url, self.db_path, statement_deadline_s=STATEMENT_DEADLINE_S)
        try:
            try:
                sealed = prepare_secrets(self.db, self.box, self.clock)
            except SecretKeyError as exc:
                raise ConfigError([("", str(exc))]) from None
            if sealed:
                log.info("sealed %d upstream secret(s) stored in clear by an older version", sealed)
            try:
                report = seed_from_config(self.db, self.config, self.clock, box=self.box)
            except RepoError as exc:
                # the file is valid but disagrees with what the admin API stored meanwhile
                raise ConfigError(
                    [("", f"the config file conflicts with the database: {exc}")]
                ) from None
            for level, message in start_log(report):
                log.log(level, message)
            db_settings = SettingsRepo(self.db).all()
            policy = access_policy(db_settings, self.config.server.require_allocation)
            if policy.source == "legacy":
                log.warning(
                    "server.require_allocation is not set and this data dir predates it: every "
                    "client key may still use every connection, with or without an allocation. "
                    "Set it to true (config file or PUT /api/settings) to enforce allocations "
                    "(docs/security.md), or to false to keep open access and silence this warning"
                )
            self.quota_settings = self._settings_from(db_settings)
            current = self.settings.with_db(db_settings)
            store, self.store_choice = await create_store(self.quota_store_path, current.store)
        except BaseException:
            self.db.close()
            raise
        self.slot_leases = _slot_leases(store)
        self.engine = QuotaEngine(
            store,
            clock=self.clock,
            settings=self.quota_settings,
            signals=self.pool_signals,
            timer=self.timer,
        )
        self.resilience = await build_manager(
            settings=current.resilience_settings(),
            clock=self.clock,
            redis_url=current.store.redis_url if self.store_choice.driver == "redis" else None,
            redis_prefix=self.redis_prefix,
            # a connection of its own, on a thread of its own (resilience/writer.py); the
            # migrations ran when self.db was opened
            db=lambda: open_database(db_url, self.db_path, migrate=False),
        )
        self.pool_log = SharedPoolLog(self._log_backend(db_settings))
        loop = asyncio.get_running_loop()
        # probes a store that went down and replays the usage journaled meanwhile
        self._replay_task = loop.create_task(self.engine.run_replay(), name="fairgate-quota-replay")
        self._log_task = loop.create_task(self.pool_log.run(), name="fairgate-admission-log")
        # retention GC: shortly after start, then hourly (fairgate.quota.retention)
        self.retention = RetentionGc(self.engine, pool_log=self.pool_log)
        self._gc_task = loop.create_task(self.retention.run_forever(), name="fairgate-quota-gc")
        self._started = True
        self._db_url = db_url
        self._probe = MetadataProbe(db_url) if db_url is not None else None
        self.watcher = ChangeWatcher(
            self.db, self._read_snapshot, self._apply_snapshot, url=db_url, poll_s=poll_s
        )
        self.watcher.start_version()
        self.reload()
        self._warn_about_silent_gaps()
        self._watch_task = asyncio.get_running_loop().create_task(
            self.watcher.run(), name="fairgate-metadata-watch"
        )

    def _warn_about_silent_gaps(self) -> None:
        """What a newcomer would otherwise not notice: a pool that enforces nothing (no limits
        known), and an admin API that refuses everything because no admin key is set."""
        for warning in unenforced_pools(self.registry.pools.values()):
            log.warning(warning)
        if not self.admin_key:
            log.warning(
                "the admin API is off: FAIRGATE_ADMIN_KEY is not set, so /api, the dashboard "
                "and the admin commands (fairgate keys, pools, ...) refuse every call; to turn "
                f"it on, set FAIRGATE_ADMIN_KEY to a secret of at least {ADMIN_KEY_MIN_LENGTH} "
                "characters (python3 -c 'import secrets; print(secrets.token_urlsafe(32))') and "
                "restart"
            )

    async def stop(self) -> None:
        """Close the quota store and the DB; safe to call twice."""
        if not self._started:
            return
        self._started = False
        try:
            for task in (self._watch_task, self._gc_task, self._replay_task, self._log_task):
                if task is not None:
                    await _cancel_within(task, STOP_TASK_TIMEOUT_S)
            self._watch_task = self._gc_task = self._replay_task = self._log_task = None
            await self.pool_log.close()
            await self._flush_journal()
            if self.resilience is not None:
                await self.resilience.close()
            await self.engine.store.close()
            if self._probe is not None:
                await self._probe.close()
        finally:
            self.db.close()
            if self.watcher is not None:
                self.watcher.close()
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    async def _flush_journal(self, timeout_s: float = 2.0) -> None:
        """Last chance for usage journaled during a store outage: one bounded replay. What is
        still pending after it is lost with the process (logged), see fairgate.quota.journal."""
        engine = self.engine
        if not len(engine.journal):
            return
        engine.circuit.reset()  # try once now, whatever the circuit's wait says
        try:
            await asyncio.wait_for(engine.replay_journal(), timeout_s)
        except Exception as exc:
            log.warning("replaying the quota journal at shutdown failed (%s)", type(exc).__name__)
        if len(engine.journal):
            log.error(
                "quota store unavailable at shutdown: %d journaled writes lost",
                len(engine.journal),
            )

    @property
    def redis_prefix(self) -> str:
        """Key prefix in Redis (``QUOTA_STORE_REDIS_PREFIX``): several gateways or test runs can
        share one server without touching each other's counters."""
        return self.settings.store.redis_prefix

    def percent_estimate(self, pool: Pool, tokens: float) -> float:
        """The percent a request of ``tokens`` is expected to cost in ``pool``: the most any of
        its connections would (admission prices the connection it tries; the preview, which
        names none, the dearest, so it never allows what admission would refuse)."""
        est = self.percent_estimator
        if est is None or tokens <= 0:
            return 0.0
        return max((est(c, tokens) for c in pool.connections), default=0.0)

    def pool_signals(self, pool: Pool) -> Mapping[str, float]:
        """Provider saturation per dimension key, from ``signals_source`` when one is set."""
        source = self.signals_source
        return source(pool) if source is not None else {}

    def _secret_box(self, *, shared_db: bool) -> SecretBox:
        """The key of the secrets at rest; a generated key file is logged once (losing it
        loses the stored secrets). Unusable → :class:`ConfigError` (the CLI exits 2)."""
        try:
            box, created = load_box(self.data_dir, self.settings.secret_key, shared_db=shared_db)
        except SecretKeyError as exc:
            raise ConfigError([("", str(exc))]) from None
        if created:
            log.warning(
                "generated the key that seals upstream secrets and OAuth tokens at rest: %s "
                "(back it up with the data dir, or set %s)",
                self.data_dir / KEY_FILE,
                ENV_VAR,
            )
        return box

    def connections(self) -> ConnectionRepo:
        """The connections table, sealing and opening secrets with this gateway's key."""
        return ConnectionRepo(self.db, self.clock, box=self.box)

    def reload(self) -> None:
        """Rebuild the registry from the DB and swap it in (one assignment: readers see the old
        or the new snapshot, never a mix). This process's own admin writes call it, on the
        loop; another process's writes reach it through the watcher, off the loop."""
        self._reload_generation += 1
        self.registry = self._load_registry(self.db)
        settings = SettingsRepo(self.db).all()
        differences = self._compare_config(self.db)
        if differences is not None:
            self._config_differences = differences
        for hook in self.reload_hooks:
            hook(settings)

    def _load_registry(self, db: Database) -> Registry:
        return load_registry(
            db,
            self.config.server.default_provider,
            box=self.box,
            version=self.registry.version + 1,
            require_allocation=self.config.server.require_allocation,
            aliases=tuple(a.alias() for a in self.config.model_aliases),
        )

    def config_report(self) -> dict[str, object]:
        """The config file's mode and what differs between it and the database (names of
        objects and fields, never a value), for ``/health``: as compared with the last snapshot
        read (at start, then on the watcher's thread with each rebuild), never here: ``/health``
        must not wait on the database (a hung server held the loop 3-5 s per call, issue 48).
        ``differences`` is null until a comparison succeeded."""
        return {"mode": self.config.server.config_mode, "differences": self._config_differences}

    async def ensure_metadata_answers(self) -> None:
        """Before an admin call uses the metadata DB on the event loop: on PostgreSQL, ask the
        server (asynchronously, bounded) whether it answers; it does not → the synchronous
        connection refuses statements until the watcher reads from it again, and the call
        raises :class:`MetadataUnavailable` (a 503) without having held the loop."""
        db = self.db
        if self._probe is None or not isinstance(db, PgDatabase) or not db.reachable:
            return  # SQLite is a local file; an unreachable server is refused at once anyway
        if not await self._probe.answers():
            db.set_reachable(False)
            raise MetadataUnavailable(
                "the metadata database is unreachable (it did not answer within "
                f"{READ_TIMEOUT_S:g} s)"
            )

    def _compare_config(self, db: Database) -> list[dict[str, object]] | None:
        try:
            result = compare_with_config(db, self.config, box=self.box)
        except (MetadataUnavailable, RepoError, SecretKeyError) as exc:
            log.warning("comparing the config file with the database failed (%s)", exc)
            return None
        return [d.as_json() for d in result.differences]

    def _log_backend(self, db_settings: Mapping[str, str]) -> LogBackend:
        """Where the admission log lives: with the counters, so it is shared as widely."""
        url = self.settings.with_db(db_settings).store.redis_url
        if self.store_choice.driver == "redis" and url:
            return RedisLogBackend(url, self.redis_prefix, max_age_ms=self._log_max_age_ms())
        return SqliteLogBackend(self.data_dir / "admission_log.sqlite")

    def _log_max_age_ms(self) -> int:
        """``FAIRGATE_ADMISSION_LOG_MAX_AGE_S``: how old an event of a Redis admission log may
        get before it is trimmed, and how long the stream of a pool nobody admits to lives
        (default 7 days, at least 60 s)."""
        age_s = self.settings.admission_log_max_age_s
        return MAX_AGE_MS if age_s is None else max(60, age_s) * 1000

    def _read_snapshot(self) -> _Snapshot:
        """Another process (a replica, a worker, the CLI) wrote the metadata DB: read the new
        snapshot and the settings. On the watcher's thread, over its own connection: the event
        loop never waits on the database for it (db/watch.py)."""
        db = self._reader
        if db is None:
            db = self._reader = open_database(
                self._db_url, self.db_path, statement_deadline_s=STATEMENT_DEADLINE_S, migrate=False
            )
        if isinstance(db, PgDatabase):
            db.set_reachable(True)  # the watcher has just read from the server
        generation = self._reload_generation
        return _Snapshot(
            self._load_registry(db),
            SettingsRepo(db).all(),
            self._compare_config(db),
            generation=generation,
        )

    def _apply_snapshot(self, snap: _Snapshot) -> bool:
        """Swap in what :meth:`_read_snapshot` read, as this process's own admin API does after
        a write; on the loop, with no I/O.

        A snapshot whose read began before this process's own last :meth:`reload` is dropped:
        the write that reload followed may not be in it, and swapping it in would undo the
        write here; the watcher reads again at its next check."""
        if snap.generation != self._reload_generation:
            return False
        self.registry = snap.registry
        if snap.differences is not None:
            self._config_differences = snap.differences
        for hook in self.reload_hooks:
            hook(snap.settings)
        self.quota_settings = self._settings_from(snap.settings)
        self.engine.settings = self.quota_settings
        if self.resilience is not None:
            self.resilience.update_settings(
                self.settings.with_db(snap.settings).resilience_settings()
            )
        return True

    def _metadata_poll_s(self) -> float | None:
        """``FAIRGATE_METADATA_POLL_MS``: how often the change counter is read (default 250 ms
        on SQLite; 1 s on PostgreSQL, where notifications arrive first)."""
        poll_ms = self.settings.metadata_poll_ms
        return None if poll_ms is None else max(10, poll_ms) / 1000

    def refresh_settings(self) -> QuotaSettings:
        """Re-read the quota knobs (DB > env > default) into ``quota_settings`` and the engine."""
        self.quota_settings = self._settings_from(SettingsRepo(self.db).all())
        self.engine.settings = self.quota_settings
        return self.quota_settings

    async def reload_store(self) -> StoreChoice:
        """Re-choose the quota store from the current DB settings and swap it into the engine,
        then close the old one: the Redis URL or the driver can change without a restart.

        A request admitted on the old store and settled on the new one settles a reservation the
        new store does not know; the store contract treats that like an expired lease.
        """
        async with self._store_lock:
            store, choice = await create_store(
                self.quota_store_path, self.settings.with_db(SettingsRepo(self.db).all()).store
            )
            old = self.engine.store
            self.engine.store = store
            self.slot_leases = _slot_leases(store)
            self.store_choice = choice
            self.refresh_settings()
            try:
                await old.close()
            except Exception as exc:  # the old store may be the one that broke
                log.warning("closing the previous quota store failed (%s)", type(exc).__name__)
            return choice

    def _settings_from(self, db_settings: Mapping[str, str]) -> QuotaSettings:
        return self.settings.with_db(db_settings).quota()


@dataclasses.dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a rebuild reads from the metadata DB: the registry and the settings table."""

    registry: Registry
    settings: Mapping[str, str]
    #: the config file compared with the database (None: the comparison failed)
    differences: list[dict[str, object]] | None = None
    #: the gateway's reload generation when the read began (see ``Gateway._apply_snapshot``)
    generation: int = 0


def _slot_leases(store: object) -> SlotLeases | None:
    """The one place that decides how concurrency slots are kept (path/slots.py): shared
    with the counters when the quota store can (Redis), else per process (SQLite)."""
    return store.slot_leases() if isinstance(store, SlotLeaseSource) else None
