"""``fairgate serve --workers N``: N gateway processes behind one listening socket.

Why uvicorn's supervisor: the parent binds the port once and hands the socket to every worker
(the kernel spreads connections across them), restarts a worker that dies, and on SIGTERM or
Ctrl-C stops them all gracefully (each drains its requests within the shutdown timeout). Each
worker is a full gateway (its own event loop, registry snapshot and in-flight table) built by
:func:`worker_app` from the same config file and data directory. What must agree across them is
shared, not copied: quota counters in the SQLite quota file or Redis (admission is one
transaction or one Lua script, so limits stay exact), metadata in ``fairgate.sqlite`` or
PostgreSQL, whose change counter every worker follows (fairgate.db.watch), and resilience
state in the metadata DB or Redis. ``/metrics`` answers for the whole group, whichever worker
takes the scrape: each worker writes its counts to a file in a directory made here for the run
and removed with it (process/metrics.py).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import orjson
from starlette.applications import Starlette

from fairgate import environment
from fairgate.config import Config, load_config
from fairgate.process.http_protocol import server_options
from fairgate.process.http_settings import HttpSettings
from fairgate.process.logs import configure_from_settings
from fairgate.process.settings import METRICS_DIR_ENV, WORKER_SPEC_ENV, Settings
from fairgate.process.state import Gateway
from fairgate.server.app import create_app
from fairgate.testclock import process_clock

__all__ = ["MAX_WORKERS", "WORKER_SPEC_ENV", "config_secrets", "run_workers", "worker_app"]

#: The most workers one machine gets: more processes than this only add memory and contention.
MAX_WORKERS = 64


def config_secrets(cfg: Config, *more: str) -> list[str]:
    """The secrets a config file holds, so the log redactor masks them verbatim."""
    out = [c.secret for c in cfg.connections if c.secret]
    out += [k.secret for k in cfg.keys if k.secret]
    return out + [m for m in more if m]


def worker_spec(settings: Settings) -> dict[str, str]:
    """What the parent handed this worker (config path, data dir, bind address)."""
    if settings.worker_spec is None:
        raise RuntimeError(f"{WORKER_SPEC_ENV} is not set: not a serve --workers worker")
    spec: dict[str, str] = orjson.loads(settings.worker_spec)
    return spec


def worker_limits(settings: Settings) -> HttpSettings:
    """The edge's limits of a worker: its settings, for the address the parent binds."""
    return settings.http.limits(worker_spec(settings)["bind"])


def worker_app() -> Starlette:
    """uvicorn's app factory, run in each worker process (see module doc). The parent checked
    the settings strictly; a worker reads them leniently (a bad value: a warning)."""
    env = environment.snapshot()
    spec = worker_spec(Settings.load(env, strict=False))
    config_path = spec.get("config")
    cfg = load_config(Path(config_path), env) if config_path else Config.default()
    settings = Settings.load(env, cfg, strict=False)
    configure_from_settings(settings, config_secrets(cfg, settings.admin_key or ""))
    clock = process_clock(settings.test_clock)  # the parent checked it
    if clock.warning:
        logging.getLogger("fairgate.cli").warning(clock.warning)
    gw = Gateway(data_dir=Path(spec["data_dir"]), config=cfg, clock=clock.clock, settings=settings)
    return create_app(gw, http=worker_limits(settings))


def run_workers(
    workers: int,
    *,
    host: str,
    port: int,
    config_path: Path | None,
    data_dir: Path,
    drain_s: int = 30,
) -> None:
    """Serve with ``workers`` processes until stopped (blocks). Each worker gets the same HTTP
    edge limits, clock and drain timeout as a single process (process/http_protocol.py)."""
    import uvicorn

    spec = {
        "config": str(config_path.resolve()) if config_path else None,
        "data_dir": str(data_dir.resolve()),
        "bind": host,
    }
    environment.export(WORKER_SPEC_ENV, orjson.dumps(spec).decode())
    limits = worker_limits(Settings.load(environment.snapshot(), strict=False))
    if limits.key_rate_per_s > 0:
        # per process by design (docs/security.md): say what it adds up to
        logging.getLogger("fairgate.cli").info(
            "the per-key rate guard counts in each worker: a key may send up to %g requests a "
            "second (bursts of %d) to these %d workers together",
            limits.key_rate_per_s * workers,
            limits.key_rate_burst * workers,
            workers,
        )
    # the group's metric files: new for each run (a counter starts at 0 with its processes),
    # private (they name keys and connections), gone with the run
    metrics_dir = tempfile.mkdtemp(prefix="fairgate-metrics-")
    environment.export(METRICS_DIR_ENV, metrics_dir)
    try:
        uvicorn.run(
            "fairgate.server.workers:worker_app",
            factory=True,
            workers=workers,
            host=host,
            port=port,
            http="fairgate.server.worker_protocol:WorkerHttpProtocol",
            **server_options(limits, drain_s),
        )
    finally:
        environment.unset(METRICS_DIR_ENV)
        shutil.rmtree(metrics_dir, ignore_errors=True)
