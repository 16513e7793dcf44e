"""The ``fairgate`` command line."""

from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from fairgate import __version__, environment
from fairgate.admin_cli import register as register_admin_commands
from fairgate.clock import Clock, ManualClock
from fairgate.config import Config
from fairgate.domain.units import Unit, Window
from fairgate.process.http_settings import HttpSettings, SettingsError, admin_key_problem
from fairgate.process.settings import Settings
from fairgate.quota.catalog import CATALOG
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.testclock import TestClockError, process_clock

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fairgate: an LLM gateway that shares upstream quota fairly.",
)
console = Console()


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"fairgate {__version__}")


@app.command()
def plans() -> None:
    """Show the built-in plan catalog (limit 0 = unknown: configure it per connection)."""
    table = Table(title="Known provider plans")
    table.add_column("provider")
    table.add_column("dimensions")
    for provider, dims in sorted(CATALOG.items()):
        table.add_row(
            provider,
            ", ".join(
                f"{d.unit}/{d.window}/{d.limit:g}" if d.known else f"{d.unit}/{d.window}/?"
                for d in dims
            ),
        )
    console.print(table)


@app.command("secret-key")
def secret_key() -> None:
    """Print a new key for FAIRGATE_SECRET_KEY (seals upstream secrets and OAuth tokens at
    rest). To rotate, set the new key first and the old one after it, comma separated."""
    from fairgate.secretbox import SecretBox

    typer.echo(SecretBox.generate_key().decode())


@app.command()
def reseal(
    data_dir: Annotated[
        Path | None, typer.Option(help="Data directory (FAIRGATE_DATA_DIR).")
    ] = None,
) -> None:
    """Rotate the key of the secrets at rest: reseal every connection secret and OAuth token
    file with the first key of FAIRGATE_SECRET_KEY (set it to NEW,OLD first, on every replica
    too). The metadata DB is FAIRGATE_DATABASE_URL's, else the data dir's SQLite file."""
    import sqlite3

    import psycopg

    from fairgate.db.engine import database_url, open_database
    from fairgate.db.oauth_tokens import FileTokenStore
    from fairgate.db.sealing import reseal_all
    from fairgate.secretbox import ENV_VAR, SecretKeyError, adopt_key_file, load_box

    settings = _settings(environment.snapshot())
    keys = settings.secret_key
    if not keys:
        _fail(f"set {ENV_VAR} to the new key, then the old one after it (NEW,OLD)")
    ddir = data_dir or settings.data_dir
    try:
        url = database_url(settings.database_url)
        if url is None and not (ddir / "fairgate.sqlite").is_file():
            # a typo must not create an empty data dir and report "resealed 0"
            _fail(f"{ddir} holds no fairgate data (no fairgate.sqlite): check --data-dir")
        box, _ = load_box(ddir, keys, shared_db=url is not None)
        db = open_database(url, ddir / "fairgate.sqlite")
        try:
            secrets_n = reseal_all(db, box)
        finally:
            db.close()
        files = FileTokenStore(ddir / "oauth", box).reseal()
        adopted = url is None and adopt_key_file(ddir, keys)
    except (ValueError, SecretKeyError) as exc:
        _fail(str(exc))
    except (OSError, sqlite3.Error, psycopg.Error) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _fail(f"cannot open the metadata DB: {reason}")
    typer.echo(f"resealed {secrets_n} connection secret(s) and {files} OAuth token file(s)")
    if adopted:
        typer.echo(
            f"{ddir / 'secret.key'} now holds the new key: a start without {ENV_VAR} opens "
            "what was resealed (keep the old key only until every replica has restarted)"
        )


@app.command("engine-demo")
def engine_demo(
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the demo's SQLite file goes (default: a temp dir).")
    ] = None,
) -> None:
    """Three keys share a 100 requests/hour pool; watch the engine decide (no HTTP)."""
    if data_dir is None:
        with tempfile.TemporaryDirectory(prefix="fairgate-demo-") as tmp:
            asyncio.run(_engine_demo(Path(tmp)))
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(_engine_demo(data_dir))


async def _engine_demo(data_dir: Path) -> None:
    from fairgate.store.sqlite.store import SqliteQuotaStore

    clock = ManualClock(1_700_002_800_000)
    store = SqliteQuotaStore(data_dir / "quota.sqlite")
    engine = QuotaEngine(store, clock=clock)
    pool = Pool(
        id="demo",
        name="demo pool",
        provider="mock",
        connections=("mock-1",),
        dimensions=(Dimension(Unit.REQUESTS, Window.HOURLY, 100),),
        allocations=(
            Allocation("alice", 50, policy=Policy.HARD),
            Allocation("bob", 30, policy=Policy.SOFT),
            Allocation("carol", 20, policy=Policy.HARD),
        ),
    )
    console.print(
        "[bold]Pool[/] 100 requests/hour shared by alice (50 %, hard), bob (30 %, soft), "
        "carol (20 %, hard); strict mode from 50 % pool use."
    )
    phases = [("alice", 70), ("bob", 40), ("carol", 25), ("alice", 10)]
    table = Table(title="Decisions (one minute apart per phase)")
    for col in ("phase", "key", "sent", "allowed", "penalised", "blocked", "first block"):
        table.add_column(col)
    for i, (key, n) in enumerate(phases, start=1):
        allowed = penalised = blocked = 0
        first = ""
        for _ in range(n):
            adm = await engine.admit(pool, key, {Unit.REQUESTS: 1})
            if adm.allowed:
                allowed += 1
                penalised += int(adm.penalized)
                await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
            else:
                blocked += 1
                if not first and adm.reason is not None:
                    secs = (adm.retry_after_ms or 0) / 1000
                    first = f"{adm.reason.value}, retry in {secs:,.0f}s"
        table.add_row(str(i), key, str(n), str(allowed), str(penalised), str(blocked), first)
        clock.advance(60_000)
    console.print(table)
    usage = await engine.usage(pool)
    dim = usage.dimensions[0]
    t2 = Table(
        title=f"Pool usage: {dim.total:.0f}/{dim.limit:.0f} {dim.key}"
        f" ({'strict' if dim.strict else 'generous'})"
    )
    for col in ("key", "weight", "policy", "consumed", "fair share", "surplus", "borrowing"):
        t2.add_column(col)
    for k in dim.keys:
        t2.add_row(
            k.key_id,
            f"{k.weight:g} %",
            k.policy,
            f"{k.consumed:.1f}",
            f"{k.fair_share:.0f}",
            f"{k.surplus:+.1f}",
            "yes" if k.borrowing else "",
        )
    console.print(t2)
    await store.close()


def _fail(message: str) -> NoReturn:
    """One line (never wrapped at the terminal's width, so a script can grep it) and exit 2."""
    console.print(f"[red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


def _port_free(host: str, port: int) -> bool:
    """Whether the server can listen on ``host:port``. The test bind sets ``SO_REUSEADDR`` as
    uvicorn and the mock do: a port held only by connections in TIME_WAIT (up to 60 s after any
    stop with clients connected) is free; one another process listens on is not."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _process_clock(settings: Settings) -> Clock:
    """The clock of this process, chosen in this one place for serve, demo and mock-upstream:
    the system's, or the test clock of :mod:`fairgate.testclock` under ``FAIRGATE_TESTING=1``
    (logged as a WARNING, so nobody runs on it unknowingly)."""
    try:
        chosen = process_clock(settings.test_clock)
    except TestClockError as exc:
        _fail(str(exc))
    if chosen.warning:
        logging.getLogger("fairgate.cli").warning(chosen.warning)
    return chosen.clock


def _secrets_of(cfg: object, *more: str) -> list[str]:
    """The secrets a config file holds, so the log redactor masks them verbatim."""
    from fairgate.config import Config
    from fairgate.server.workers import config_secrets

    assert isinstance(cfg, Config)
    return config_secrets(cfg, *more)


def _settings(env: Mapping[str, str], cfg: Config | None = None) -> Settings:
    """The process settings, resolved once at start (environment > config file > default; the
    DB settings join when the gateway opens its database): exit 2 naming the variable on a
    bad value, since a typo must not silently mean the default."""
    try:
        return Settings.load(env, cfg)
    except SettingsError as exc:
        _fail(str(exc))


def _limits(settings: Settings, bind: str, admin_key: str | None) -> HttpSettings:
    """The HTTP edge's limits for ``bind`` (exit 2 on an admin key too short to resist
    guessing; the settings themselves were checked when they were loaded)."""
    problem = admin_key_problem(admin_key)
    if problem is not None:
        _fail(problem)
    return settings.http.limits(bind)


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML config file (FAIRGATE_CONFIG).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (config server.host).")] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (FAIRGATE_PORT, config server.port).")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Data directory (FAIRGATE_DATA_DIR).")
    ] = None,
    workers: Annotated[
        int, typer.Option(help="Gateway processes sharing the port (docs/deploy.md).")
    ] = 1,
) -> None:
    """Run the gateway."""
    from fairgate.config import Config, ConfigError, load_config
    from fairgate.process.http_protocol import run as serve_http
    from fairgate.process.state import Gateway
    from fairgate.server.app import create_app
    from fairgate.server.workers import MAX_WORKERS, run_workers

    if not 1 <= workers <= MAX_WORKERS:
        _fail(f"--workers must be from 1 to {MAX_WORKERS}, not {workers}")
    env = environment.snapshot()
    path = config or _settings(env).config_path
    try:
        cfg = load_config(path, env) if path is not None else Config.default()
    except ConfigError as exc:
        _fail(f"invalid config {path}:\n{exc}")
    except OSError as exc:
        _fail(f"cannot read config {path}: {exc.strerror}")
    settings = _settings(env, cfg)
    bind = host or cfg.server.host
    limits = _limits(settings, bind, settings.admin_key)
    chosen = port or settings.port
    if not _port_free(bind, chosen):
        _fail(f"port {chosen} on {bind} is already in use (choose another with --port)")
    ddir = data_dir or settings.data_dir
    from fairgate.process.logs import configure_from_settings

    configure_from_settings(settings, _secrets_of(cfg, settings.admin_key or ""))
    gw = Gateway(data_dir=ddir, config=cfg, clock=_process_clock(settings), settings=settings)
    # one JSON event, like every other line this process writes
    logging.getLogger("fairgate.cli").info(
        "fairgate %s on http://%s:%s",
        __version__,
        bind,
        chosen,
        extra={"version": __version__, "url": f"http://{bind}:{chosen}", "data_dir": str(ddir)},
    )
    drain_s = settings.shutdown_timeout_s
    if workers > 1:
        run_workers(
            workers, host=bind, port=chosen, config_path=path, data_dir=ddir, drain_s=drain_s
        )
        return
    serve_http(create_app(gw, http=limits), bind, chosen, limits, drain_s)


@app.command("mock-upstream")
def mock_upstream(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9999,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    latency_ms: Annotated[float, typer.Option(help="Latency before the first byte.")] = 0.0,
    completion_tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 16,
    stream_chunks: Annotated[int, typer.Option(help="Content chunks per stream.")] = 4,
    secret: Annotated[str | None, typer.Option(help="Require this upstream API key.")] = None,
) -> None:
    """Run the built-in mock LLM provider (OpenAI and Anthropic wire formats, fault injection)."""
    from fairgate.mock.server import MockConfig, run_mock_upstream

    if not _port_free(host, port):
        _fail(f"port {port} on {host} is already in use")
    run_mock_upstream(
        host,
        port,
        MockConfig(
            latency_ms=latency_ms,
            completion_tokens=completion_tokens,
            stream_chunks=stream_chunks,
            secret=secret,
        ),
        # leniently: the mock uses only the test clock of the gateway's settings
        clock=_process_clock(Settings.load(environment.snapshot(), strict=False)),
    )


DEMO_KEYS = (("alice", 50, "hard"), ("bob", 30, "soft"), ("carol", 20, "burst"))


def demo_config_yaml(mock_url: str, upstream_secret: str, keys: dict[str, str]) -> str:
    """The demo's config: one mock connection per wire format, a pool, three keys. Allocations
    are required: each key has one in the pool and may use the Anthropic-format connection,
    which is outside every pool, because it lists it. Model aliases send Claude Code's and
    Codex's default model names to the demo's models, so both work without ``--model``."""
    lines = [
        "server: {default_provider: mock, require_allocation: true}",
        "connections:",
        f"  - {{id: mock-1, provider: mock, base_url: '{mock_url}/v1',",
        f"      secret: '{upstream_secret}', models: [gpt-4o-mini, mock-large]}}",
        f"  - {{id: mock-claude, provider: mock-anthropic, protocol: anthropic,"
        f" base_url: '{mock_url}/v1', secret: '{upstream_secret}', models: [claude-sonnet-4]}}",
        "keys:",
        *(
            f"  - {{id: {k}, name: {k.title()}, secret: '{keys[k]}',"
            " allowed_connections: [mock-claude]}"
            for k, _, _ in DEMO_KEYS
        ),
        "pools:",
        "  - id: demo",
        "    name: Demo pool",
        "    connections: [mock-1]",
        "    dimensions:",
        "      - {unit: requests, window: hourly, limit: 100}",
        "      - {unit: tokens, window: hourly, limit: 200000}",
        "    allocations:",
        *(f"      - {{key: {k}, weight: {w}, policy: {p}}}" for k, w, p in DEMO_KEYS),
        # Claude Code and the Codex CLI ask for their own default models (claude-opus-…,
        # gpt-6…): every such name goes to a model the demo serves
        "model_aliases:",
        "  - {pattern: 'claude-*', target: claude-sonnet-4}",
        "  - {pattern: 'gpt-*', target: gpt-4o-mini}",
        "  - {pattern: 'codex-*', target: gpt-4o-mini}",
    ]
    return "\n".join(lines) + "\n"


def demo_identity(settings: Settings, data_dir: Path | None) -> tuple[Path, str]:
    """The demo's data directory and admin key: ``--data-dir``, else ``FAIRGATE_DATA_DIR``,
    else a fresh temp dir; ``FAIRGATE_ADMIN_KEY`` when set (a user who set it expects it to
    work), else a random one printed at start."""
    import secrets as _secrets

    named = settings.data_dir if settings.source_of("data_dir") != "default" else None
    ddir = data_dir or named or Path(tempfile.mkdtemp(prefix="fairgate-demo-"))
    return ddir, settings.admin_key or "fg-admin-" + _secrets.token_urlsafe(32)


@app.command()
def demo(
    port: Annotated[int | None, typer.Option(help="Gateway port (FAIRGATE_PORT, 20128).")] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Data directory (FAIRGATE_DATA_DIR; default: a fresh temp dir)."),
    ] = None,
) -> None:
    """Run the gateway on its embedded defaults: SQLite, the built-in mock upstream, a demo pool."""
    import secrets as _secrets

    from fairgate.config import load_config_text
    from fairgate.mock.server import MockConfig, MockUpstream
    from fairgate.process.http_protocol import run as serve_http
    from fairgate.process.state import Gateway
    from fairgate.server.app import create_app

    host = "127.0.0.1"
    env = environment.snapshot()
    settings = _settings(env)
    chosen = port or settings.port
    if not _port_free(host, chosen):
        _fail(f"port {chosen} is already in use (try: fairgate demo --port 20129)")
    ddir, admin_key = demo_identity(settings, data_dir)
    mock_port = _free_port()
    upstream_secret = "mock-upstream-" + _secrets.token_hex(8)
    keys = {k: "fg-demo-" + _secrets.token_urlsafe(18) for k, _, _ in DEMO_KEYS}
    cfg = load_config_text(demo_config_yaml(f"http://{host}:{mock_port}", upstream_secret, keys))

    async def start_mock() -> None:
        await mock.start(host, mock_port)

    from fairgate.process.logs import configure_from_settings

    # the demo prints its keys for the user on stdout; the logs (stderr) never show them
    configure_from_settings(settings, _secrets_of(cfg, admin_key, upstream_secret))
    clock = _process_clock(settings)
    mock = MockUpstream(
        MockConfig(secret=upstream_secret, latency_ms=20, completion_tokens=24), clock=clock
    )
    gw = Gateway(
        data_dir=ddir,
        config=cfg,
        admin_key=admin_key,
        clock=clock,
        settings=_settings(env, cfg),
    )
    limits = _limits(settings, host, admin_key)
    app_ = create_app(gw, on_startup=[start_mock], on_shutdown=[mock.stop], http=limits)
    base = f"http://{host}:{chosen}"
    table = Table(title="Demo client keys (pool 'demo': 100 requests/hour, 200k tokens/hour)")
    for col in ("key", "share", "policy", "API key"):
        table.add_column(col)
    for k, w, p in DEMO_KEYS:
        table.add_row(k, f"{w} %", p, keys[k])
    console.print(
        f"[bold]fairgate demo[/] on {base} (mock upstream on :{mock_port}, data in {ddir})"
    )
    console.print(table)
    console.print(f"admin key: {admin_key}")
    console.print(f"dashboard: {base}/dashboard")
    console.print("\n[bold]curl[/]")
    console.print(
        f"curl {base}/v1/chat/completions -H 'Authorization: Bearer {keys['alice']}' "
        "-H 'Content-Type: application/json' "
        '-d \'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}\'',
        soft_wrap=True,
    )
    console.print("\n[bold]python (openai SDK)[/]")
    console.print(
        "from openai import OpenAI\n"
        f"client = OpenAI(base_url='{base}/v1', api_key='{keys['bob']}')\n"
        "print(client.chat.completions.create(model='gpt-4o-mini',"
        " messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)",
        soft_wrap=True,
    )
    console.print(
        f"\npool usage: curl {base}/api/quota/pools/demo/usage "
        f"-H 'Authorization: Bearer {admin_key}'",
        soft_wrap=True,
    )
    console.print("\nCtrl-C stops it.")
    serve_http(app_, host, chosen, limits, settings.shutdown_timeout_s)


@app.command()
def simulate(
    scenario_file: Annotated[
        Path | None, typer.Argument(help="A YAML scenario file (see docs/fairness.md).")
    ] = None,
    builtin: Annotated[
        str | None,
        typer.Option("--builtin", help="A built-in scenario: steady, greedy, bursty, on-off, …"),
    ] = None,
    run_all: Annotated[bool, typer.Option("--all", help="Every built-in scenario.")] = False,
    driver: Annotated[str, typer.Option(help="Quota store for the engine: sqlite or redis.")] = (
        "sqlite"
    ),
    seed: Annotated[int, typer.Option(help="Workload seed (same seed, same figures).")] = 1,
    seeds: Annotated[
        str | None, typer.Option(help="Many seeds, e.g. 1-10 or 1,4,9: prints the spread.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where the PNGs and results.json go.")] = Path(
        "sim-results"
    ),
    duration: Annotated[
        str | None, typer.Option(help="Override the scenario's duration (e.g. 3h).")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Redis for --driver redis (QUOTA_STORE_REDIS_URL).")
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(help="Only these policies, e.g. active or active,static (default: all four)."),
    ] = None,
    jobs: Annotated[
        int, typer.Option(help="Runs (scenario × seed) at once, each in its own process.")
    ] = 1,
) -> None:
    """Replay a workload through the real engine under four sharing policies and compare them
    with the exact fair ideal (weighted max-min; dominant-resource-fair over several dimensions):
    Jain's index, utilisation, overshoot, refusals."""
    from fairgate.sim.command import run_simulate

    code = run_simulate(
        console,
        scenario_file=scenario_file,
        builtin_name=builtin,
        run_all=run_all,
        driver=driver,
        seed=seed,
        seeds=seeds,
        out=out,
        duration=duration,
        redis_url=redis_url,
        policies=policies,
        jobs=jobs,
    )
    if code:
        raise typer.Exit(code)


register_admin_commands(app)  # keys, pools, connections, combos, config, health


def main() -> None:
    app()
