"""``fairgate keys|pools|connections|combos|config|health``: day-to-day admin from a terminal.

Every command but ``config check`` (which reads the config file and the metadata DB itself)
talks to a running gateway's admin API: the URL comes from ``--url`` or ``FAIRGATE_URL``, the
admin key from ``FAIRGATE_ADMIN_KEY``, a file (``--admin-key @PATH`` or
``FAIRGATE_ADMIN_KEY_FILE``), or ``--admin-key KEY``, which works but warns: a command line is
visible to every user of the machine (``ps``).
Tables are for people; ``--json`` prints the API's answer as is, for scripts. Any failure prints
one clear message on stderr and exits 2 (``health`` exits 1 for a gateway that answers but is
degraded, so a probe can tell "down" from "limping").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from fairgate import environment
from fairgate.admin_cli import render
from fairgate.admin_cli.client import DEFAULT_URL, AdminClient, AdminCliError, quote
from fairgate.admin_cli.credentials import login_fields
from fairgate.domain.units import Unit
from fairgate.quota.model import Policy

if TYPE_CHECKING:
    from fairgate.process.settings import Settings

__all__ = ["register"]

out = Console()
err = Console(stderr=True)

Url = Annotated[
    str,
    typer.Option("--url", envvar="FAIRGATE_URL", help="The gateway's base URL.", show_default=True),
]
AdminKey = Annotated[
    str | None,
    typer.Option(
        "--admin-key",
        envvar="FAIRGATE_ADMIN_KEY",
        help="The admin key, or @PATH to read it from a file (a key given here is visible to "
        "other users in the process list: prefer FAIRGATE_ADMIN_KEY or a file).",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the API's JSON answer (for scripts).")]


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings this command reads (the admin key, its file, the data dir, the metadata
    DB), from one snapshot of the environment; leniently, since a client command must not
    refuse to run over a gateway setting it does not use (a bad value: a warning)."""
    from fairgate.process.settings import Settings

    return Settings.load(environment.snapshot() if env is None else env, strict=False)


def _admin_key(given: str | None) -> str | None:
    """The admin key to send: ``@PATH`` (or ``FAIRGATE_ADMIN_KEY_FILE``) reads it from a file;
    a key typed on the command line is used, with a warning (issue 43, N18: ``ps`` shows it)."""
    settings = _settings()
    env_key = settings.admin_key
    key_file = settings.admin_key_file
    path = str(key_file) if given is None and key_file is not None else None
    if given is not None and given.startswith("@"):
        path = given[1:]
    elif given is not None and given != env_key:
        err.print(
            "[yellow]warning:[/] --admin-key on the command line is visible to other users of "
            "this machine (ps); use FAIRGATE_ADMIN_KEY or --admin-key @FILE",
            highlight=False,
            soft_wrap=True,
        )
    if not path:
        return given
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        _fail(f"cannot read the admin key file {path}: {exc.strerror or exc}")
    if not key:
        _fail(f"the admin key file {path} is empty")
    return key


def _call(url: str, admin_key: str | None, fn: Callable[[AdminClient], Any]) -> Any:
    try:
        return fn(AdminClient(url, _admin_key(admin_key)))
    except AdminCliError as exc:
        _fail(str(exc))


def _show(data: Any, as_json: bool, view: Callable[[Any], RenderableType]) -> None:
    if as_json:
        out.print_json(json.dumps(data))
    else:
        shown = view(data)
        out.print(shown, soft_wrap=isinstance(shown, str))  # a sentence is not cut at 80 columns


# -- keys -------------------------------------------------------------------------------------

keys_app = typer.Typer(no_args_is_help=True, help="Client keys: create, list, revoke, rotate.")


@keys_app.command("list")
def keys_list(url: Url = DEFAULT_URL, admin_key: AdminKey = None, as_json: AsJson = False) -> None:
    """Every client key: what it may use, when this gateway last accepted it (never a secret)."""
    _show(_call(url, admin_key, lambda c: c.get("/api/keys")), as_json, render.keys_table)


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="A name people recognise.")] = "",
    key_id: Annotated[
        str | None, typer.Option("--id", help="The key's id (default: key-<8 hex>).")
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", help="An allowed model (repeat; none = any model)."),
    ] = None,
    provider: Annotated[
        list[str] | None,
        typer.Option(
            "--provider",
            help="A provider whose connections outside every pool the key may use (repeat).",
        ),
    ] = None,
    connection: Annotated[
        list[str] | None,
        typer.Option(
            "--connection", help="A connection outside every pool the key may use (repeat)."
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Create a key; its secret is printed this once. Pooled connections need an allocation
    in their pool (dashboard or admin API); --provider / --connection open unpooled ones."""
    body: dict[str, Any] = {
        "name": name,
        "allowedModels": model or [],
        "allowedProviders": provider or [],
        "allowedConnections": connection or [],
    }
    if key_id:
        body["id"] = key_id
    created = _call(url, admin_key, lambda c: c.post("/api/keys", body))
    _show(created, as_json, lambda k: render.secret_panel(k, "created"))


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id.")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Delete a key: it stops working at once and its allocations go with it."""
    _call(url, admin_key, lambda c: c.delete(f"/api/keys/{quote(key_id)}"))
    _show({"id": key_id, "revoked": True}, as_json, lambda _: f"Key {key_id} revoked.")


@keys_app.command("rotate")
def keys_rotate(
    key_id: Annotated[str, typer.Argument(help="The key's id.")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """A new secret for a key (printed this once); the old one stops working at once."""
    created = _call(url, admin_key, lambda c: c.post(f"/api/keys/{quote(key_id)}/rotate"))
    _show(created, as_json, lambda k: render.secret_panel(k, "rotated"))


# -- pools ------------------------------------------------------------------------------------

pools_app = typer.Typer(
    no_args_is_help=True, help="Quota pools: who may use them, and who is using them."
)


@pools_app.command("list")
def pools_list(url: Url = DEFAULT_URL, admin_key: AdminKey = None, as_json: AsJson = False) -> None:
    """Every pool: members, enforced limits, allocations."""
    _show(_call(url, admin_key, lambda c: c.get("/api/quota/pools")), as_json, render.pools_table)


@pools_app.command("usage")
def pools_usage(
    pool_id: Annotated[str, typer.Argument(help="The pool's id.")],
    watch: Annotated[bool, typer.Option("--watch", help="Refresh in place until Ctrl-C.")] = False,
    interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between refreshes with --watch.")
    ] = 2.0,
    count: Annotated[
        int, typer.Option(min=0, hidden=True, help="Stop after this many refreshes (0: never).")
    ] = 0,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Each key's consumption against its fair share, per dimension (live with --watch)."""
    path = f"/api/quota/pools/{quote(pool_id)}/usage"
    usage = _call(url, admin_key, lambda c: c.get(path))
    if not watch:
        _show(usage, as_json, render.usage_view)
        return
    if as_json:  # one JSON document per line, for a pipe
        _fail("--watch prints tables; for a script poll without --watch and --json")
    shown = 1
    try:
        with Live(render.usage_view(usage), console=out, auto_refresh=False) as live:
            while count == 0 or shown < count:
                time.sleep(interval)
                usage = _call(url, admin_key, lambda c: c.get(path))
                live.update(render.usage_view(usage), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass


def _allocation_body(
    pool: dict[str, Any],
    key_id: str,
    weight: float | None,
    policy: Policy | None,
    cap: tuple[float | None, Unit | None, bool],
) -> dict[str, Any]:
    """The key's whole allocation for ``PUT …/allocations/{key}``: what the options give, the
    rest as the key has it now (a new allocation: hard, no cap), so changing one thing about
    an allocation keeps the others (its per-model caps too)."""
    cap_value, cap_unit, no_cap = cap
    old = next((a for a in pool.get("allocations", []) if a["key"] == key_id), None)
    if old is None and weight is None:
        _fail(
            f"key '{key_id}' has no allocation in pool '{pool['id']}' yet: give its share "
            "with --weight (percent of the pool)"
        )
    if no_cap and (cap_value is not None or cap_unit is not None):
        _fail("--no-cap removes the cap: give it without --cap / --cap-unit")
    body: dict[str, Any] = {
        "weight": weight if weight is not None else old["weight"] if old else 0.0,
        "policy": str(policy) if policy is not None else old["policy"] if old else "hard",
        "capValue": None if no_cap else old.get("capValue") if old else None,
        "capUnit": None if no_cap else old.get("capUnit") if old else None,
        "modelCaps": old.get("modelCaps", []) if old else [],
    }
    if cap_value is not None:
        body["capValue"] = cap_value
    if cap_unit is not None:
        body["capUnit"] = str(cap_unit)
    if (body["capValue"] is None) != (body["capUnit"] is None):
        _fail("a cap needs both --cap VALUE and --cap-unit (requests, tokens, usd or percent)")
    return body


def _allocations_line(pool: dict[str, Any]) -> str:
    allocs = pool.get("allocations", [])
    total = sum(a["weight"] for a in allocs)
    listed = ", ".join(f"{a['key']} {a['weight']:g} % {a['policy']}" for a in allocs) or "none"
    line = f"Allocations of pool {pool['id']}: {listed} ({total:g} % in all)."
    if total > 100:
        line += " Over 100 %: the shares promise more than the pool's limit, which still caps it."
    return line


@pools_app.command("allow")
def pools_allow(
    pool_id: Annotated[str, typer.Argument(help="The pool's id.")],
    key_id: Annotated[str, typer.Argument(help="The client key's id.")],
    weight: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=100,
            help="The key's share of the pool's limits, in percent (required for a key that "
            "has no allocation in the pool yet).",
        ),
    ] = None,
    policy: Annotated[
        Policy | None,
        typer.Option(
            help="At its share in a strict pool: hard blocks, soft deprioritises, burst passes "
            "(default: the key's current policy, else hard)."
        ),
    ] = None,
    cap: Annotated[
        float | None,
        typer.Option("--cap", min=0, help="An absolute cap, in --cap-unit, per window."),
    ] = None,
    cap_unit: Annotated[Unit | None, typer.Option("--cap-unit", help="The cap's unit.")] = None,
    no_cap: Annotated[bool, typer.Option("--no-cap", help="Remove the key's cap.")] = False,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Give a key an allocation in a pool, or change the one it has; the pool's other
    allocations are left as they are. Options not given keep the key's current values."""
    path = f"/api/quota/pools/{quote(pool_id)}"
    pool = _call(url, admin_key, lambda c: c.get(path))
    body = _allocation_body(pool, key_id, weight, policy, (cap, cap_unit, no_cap))
    had = any(a["key"] == key_id for a in pool.get("allocations", []))
    res = _call(url, admin_key, lambda c: c.put(f"{path}/allocations/{quote(key_id)}", body))
    verb = "updated in" if had else "added to"
    _show(res, as_json, lambda p: f"Key {key_id} {verb} pool {pool_id}. {_allocations_line(p)}")


@pools_app.command("disallow")
def pools_disallow(
    pool_id: Annotated[str, typer.Argument(help="The pool's id.")],
    key_id: Annotated[str, typer.Argument(help="The client key's id.")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Take a key's allocation out of a pool (the key itself stays). Where allocations are
    required (server.require_allocation), it can no longer use the pool's connections."""
    path = f"/api/quota/pools/{quote(pool_id)}/allocations/{quote(key_id)}"
    _call(url, admin_key, lambda c: c.delete(path))  # 204, as every delete: the pool is a GET
    res = _call(url, admin_key, lambda c: c.get(f"/api/quota/pools/{quote(pool_id)}"))
    _show(
        res,
        as_json,
        lambda p: f"Key {key_id} has no allocation in pool {pool_id} now. {_allocations_line(p)}",
    )


# -- connections ------------------------------------------------------------------------------

conns_app = typer.Typer(no_args_is_help=True, help="Upstream connections.")


@conns_app.command("list")
def conns_list(url: Url = DEFAULT_URL, admin_key: AdminKey = None, as_json: AsJson = False) -> None:
    """Every connection (secrets are never shown: only whether one is set)."""
    _show(
        _call(url, admin_key, lambda c: c.get("/api/connections")),
        as_json,
        render.connections_table,
    )


@conns_app.command("test")
def conns_test(
    connection_id: Annotated[str, typer.Argument(help="The connection's id.")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """One cheap upstream call (list models) with the connection's secret, and its reading.
    Exits 2 when the upstream refused or did not answer."""
    res = _call(url, admin_key, lambda c: c.post(f"/api/connections/{quote(connection_id)}/test"))
    _show(res, as_json, render.connection_test)
    if not res["ok"]:
        raise typer.Exit(2)


@conns_app.command("login")
def conns_login(
    connection_id: Annotated[str, typer.Argument(help="The connection's id (authType oauth).")],
    token_url: Annotated[
        str, typer.Option("--token-url", help="The provider's OAuth token endpoint.")
    ],
    client_id: Annotated[str, typer.Option("--client-id", help="The OAuth client id.")] = "",
    credentials: Annotated[
        Path | None,
        typer.Option(
            "--credentials",
            help="A Codex auth.json or Claude .credentials.json to take the tokens from.",
        ),
    ] = None,
    code: Annotated[
        str | None, typer.Option("--code", help="A PKCE login's one-time authorization code.")
    ] = None,
    code_verifier: Annotated[
        str | None, typer.Option("--code-verifier", help="The PKCE verifier of --code.")
    ] = None,
    redirect_uri: Annotated[
        str | None, typer.Option("--redirect-uri", help="The redirect URI of --code.")
    ] = None,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Log an OAuth connection in: tokens from a credentials file, or a PKCE code the gateway
    trades at the token endpoint. Tokens are sent once to the gateway (stored sealed) and never
    printed."""
    body: dict[str, Any] = {"tokenUrl": token_url, "clientId": client_id}
    if (credentials is None) == (code is None):
        _fail("give exactly one of --credentials or --code")
    if credentials is not None:
        try:
            body.update(login_fields(json.loads(credentials.read_text())))
        except OSError as exc:
            _fail(f"cannot read {credentials}: {exc.strerror}")
        except ValueError as exc:  # JSON errors included; the message names no token
            _fail(f"{credentials}: {exc}")
    else:
        body.update(authorizationCode=code, codeVerifier=code_verifier, redirectUri=redirect_uri)
    path = f"/api/connections/{quote(connection_id)}/oauth"
    res = _call(url, admin_key, lambda c: c.post(path, body))
    _show(res, as_json, render.oauth_login)


# -- combos -----------------------------------------------------------------------------------

combos_app = typer.Typer(no_args_is_help=True, help="Combos (routing over several targets).")


@combos_app.command("list")
def combos_list(
    internal: Annotated[
        bool, typer.Option(help="Also the qtSd/<pool>/<model> combos fairgate mints.")
    ] = False,
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """Every combo: strategy and targets."""
    query = {"internal": "true"} if internal else None
    _show(
        _call(url, admin_key, lambda c: c.get("/api/combos", query)), as_json, render.combos_table
    )


@combos_app.command("show")
def combos_show(
    name: Annotated[str, typer.Argument(help="The combo's name.")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKey = None,
    as_json: AsJson = False,
) -> None:
    """One combo: settings, and per target its success rate, p50/p95 latency and breaker
    state over the last 15 minutes, with the fallbacks and their reasons."""
    path = f"/api/combos/{quote(name, safe='/')}"

    def both(c: AdminClient) -> dict[str, Any]:
        return {"combo": c.get(path), "stats": c.get(path + "/stats")}

    data = _call(url, admin_key, both)
    _show(data, as_json, lambda d: render.combo_detail(d["combo"], d["stats"]))


# -- config -----------------------------------------------------------------------------------

config_app = typer.Typer(no_args_is_help=True, help="The YAML config file.")


@config_app.command("check")
def config_check(
    file: Annotated[Path, typer.Argument(help="The YAML config file.")],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="The data directory whose database to compare with (FAIRGATE_DATA_DIR; "
            "FAIRGATE_DATABASE_URL names a PostgreSQL one)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Validate a config file without starting anything: every problem with its field path
    (``pools.0.allocations.1.weight: …``); exit 2 when there is any. A valid file is then
    compared with the metadata database a start would use (read only): the mode
    (``server.config_mode``), what each pool will enforce, the pools that would enforce nothing
    or whose weights do not sum near 100, and, per object, what differs and what a start does
    about it."""
    from fairgate.config import ConfigError, load_config, weight_warnings
    from fairgate.db.inspection import compare_database

    env = environment.snapshot()
    try:
        cfg = load_config(file, env)
    except ConfigError as exc:
        if as_json:
            problems = [{"field": p, "message": m} for p, m in exc.problems]
            out.print_json(json.dumps({"ok": False, "file": str(file), "problems": problems}))
        else:
            err.print(f"[red]{file}: {len(exc.problems)} problem(s)[/]", highlight=False)
            for path, message in exc.problems:
                err.print(f"  {path or '(file)'}: {message}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    settings = _settings(env)
    compared = compare_database(
        cfg,
        data_dir or settings.data_dir,
        database=settings.database_url,
        secret_key=settings.secret_key,
    )
    summary = {
        "ok": True,
        "file": str(file),
        "connections": len(cfg.connections),
        "keys": len(cfg.keys),
        "pools": len(cfg.pools),
        "combos": len(cfg.combos),
        "mode": cfg.server.config_mode,
        # a newcomer's silent gaps: pools that would enforce nothing (no limits known), and
        # weights read as relative parts (they are percentages of the limit)
        "warnings": compared.warnings(cfg) + [f"{p}: {m}" for p, m in weight_warnings(cfg)],
        # the limits each pool will enforce, as every surface will show them (issue 48)
        "enforced": compared.enforced(cfg),
        "database": compared.as_json(),
    }
    _show(summary, as_json, lambda s: render.config_check(str(file), s))


# -- health -----------------------------------------------------------------------------------


def health(url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Is the gateway up, its metadata DB and quota store reachable? Names each degraded part.
    Exit 0 ok, 1 degraded, 2 unreachable."""
    data = _call(url, None, lambda c: c.get("/health"))
    _show(data, as_json, render.health_view)
    if data.get("status") != "ok":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the admin command groups to the ``fairgate`` command line."""
    app.add_typer(keys_app, name="keys")
    app.add_typer(pools_app, name="pools")
    app.add_typer(conns_app, name="connections")
    app.add_typer(combos_app, name="combos")
    app.add_typer(config_app, name="config")
    app.command("health")(health)
