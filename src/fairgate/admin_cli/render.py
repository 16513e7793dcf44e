"""Rich renderings of admin API answers: pure functions from the API's JSON to renderables.

Kept apart from the commands so the same table serves a one-off listing and the live view of
``pools usage --watch``, and so they can be checked without a terminal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

__all__ = [
    "combo_detail",
    "combos_table",
    "config_check",
    "connection_test",
    "connections_table",
    "degraded_parts",
    "health_view",
    "keys_table",
    "pools_table",
    "secret_panel",
    "usage_view",
]

JSON = Mapping[str, Any]


def when(ms: int | None) -> str:
    if not ms:
        return "—"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _models(models: Sequence[str]) -> str:
    return ", ".join(models) if models else "any"


def keys_table(keys: Sequence[JSON]) -> Table:
    t = Table(title=f"Client keys ({len(keys)})")
    for col in ("id", "name", "enabled", "allowed models", "allowed upstreams", "last used"):
        t.add_column(col)
    for k in keys:
        upstreams = [*k.get("allowedProviders", []), *k.get("allowedConnections", [])]
        t.add_row(
            k["id"],
            k["name"],
            "yes" if k["enabled"] else "[red]no[/]",
            _models(k["allowedModels"]),
            ", ".join(upstreams) if upstreams else "any",
            when(k.get("lastUsedMs")),
        )
    return t


def secret_panel(created: JSON, verb: str) -> Group:
    """The one time a secret is shown: say so next to it."""
    return Group(
        Text(f"Key {created['id']} {verb}.", style="bold"),
        Text(created["secret"], style="bold green"),
        Text("Store this secret now: it is shown once and cannot be recovered.", style="yellow"),
    )


def pools_table(pools: Sequence[JSON]) -> Table:
    t = Table(title=f"Pools ({len(pools)})")
    for col in ("id", "name", "provider", "connections", "dimensions", "keys"):
        t.add_column(col)
    for p in pools:
        dims = ", ".join(
            enforced_dimension(d, len(p["connections"])) for d in p.get("effectiveDimensions", [])
        )
        t.add_row(
            p["id"],
            p.get("name") or "",
            p.get("provider", ""),
            ", ".join(p["connections"]),
            dims or "—",
            ", ".join(
                f"{a['key']} {a['weight']:g}% {a['policy']}" for a in p.get("allocations", [])
            ),
        )
    return t


def enforced_dimension(d: JSON, connections: int) -> str:
    """``200 requests/hourly (100 per connection × 2)``: the limit the pool enforces, the
    number ``pools usage`` and the dashboard show, and where it comes from when it is not the
    pool's own as written."""
    text = f"{d['limit']:g} {d['unit']}/{d['window']}"
    if d.get("basis") == "per-connection" and connections > 1:
        text += f" ({d['writtenLimit']:g} per connection × {connections})"
    return text


def usage_view(usage: JSON) -> Group:
    """One table per dimension: a bar per key of its consumption against its fair share."""
    parts: list[RenderableType] = [
        Text(f"Pool {usage['poolId']} at {when(usage['atMs'])}", style="bold")
    ]
    for d in usage["dimensions"]:
        mode = "strict" if d["strict"] else "generous"
        title = (
            f"{d['unit']}/{d['window']}: {d['total']:,.0f} of {d['limit']:,.0f} "
            f"({d['usedFraction'] * 100:.1f} %, {mode})"
        )
        t = Table(title=title, title_justify="left")
        for col in ("key", "weight", "policy", "consumed", "fair share", "use of share", ""):
            t.add_column(col)
        for k in d["keys"]:
            share = k["fairShare"]
            frac = k["consumed"] / share if share > 0 else (1.0 if k["consumed"] else 0.0)
            t.add_row(
                k["keyId"],
                f"{k['weight']:g} %",
                k["policy"],
                f"{k['consumed']:,.1f}",
                f"{share:,.1f}",
                ProgressBar(total=1.0, completed=min(frac, 1.0), width=30),
                Text(f"{frac * 100:.0f} %" + (" borrowing" if k["borrowing"] else "")),
            )
        if not d["keys"]:
            t.add_row("(no allocations)", "", "", "", "", "", "")
        parts.append(t)
    return Group(*parts)


def connections_table(conns: Sequence[JSON]) -> Table:
    t = Table(title=f"Connections ({len(conns)})")
    cols = ("id", "provider", "protocol", "base URL", "models", "pool", "enabled", "secret")
    for col in (*cols, "credential"):
        t.add_column(col)
    for c in conns:
        t.add_row(
            c["id"],
            c["provider"],
            c["protocol"],
            c["baseUrl"],
            _models(c["models"]),
            c.get("pool") or "—",
            "yes" if c["enabled"] else "[red]no[/]",
            "set" if c["hasSecret"] else "[yellow]none[/]",
            _credential(c.get("credential")),
        )
    return t


def _credential(cred: JSON | None) -> str:
    """The credential gate's word on a connection: ok, or what an admin must do about it
    (``log in again``) and why; requests skip the connection until then."""
    if not cred or cred.get("usable", True):
        return "ok"
    return f"[red]{cred.get('action')}[/] ({cred.get('problem')})"


def connection_test(res: JSON) -> Table:
    ok = "[green]ok[/]" if res["ok"] else "[red]failed[/]"
    t = Table(title=f"Connection {res['connectionId']}: {ok}", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("status", str(res["status"]) if res["status"] is not None else "no answer")
    t.add_row("latency", f"{res['latencyMs']:.0f} ms")
    t.add_row("models listed", str(len(res["models"])))
    rl = res.get("rateLimit")
    if rl:
        for unit in ("requests", "tokens"):
            if rl.get(f"{unit}Limit") is not None:
                t.add_row(
                    f"{unit} remaining",
                    f"{rl.get(f'{unit}Remaining')} of {rl[f'{unit}Limit']}"
                    f" (resets {when(rl.get(f'{unit}ResetMs'))})",
                )
    if res.get("error"):
        t.add_row("error", res["error"])
    return t


def oauth_login(res: JSON) -> str:
    """One sentence: the login's outcome (no token is in the answer)."""
    exp = res.get("expiresAtMs")
    until = f", access token until {when(exp)}" if exp else ", access token refreshed on first use"
    acct = f" (account {res['accountId']})" if res.get("accountId") else ""
    reason = f": {res['reason']}" if res.get("reason") else ""
    return f"Connection {res['connectionId']} logged in{acct}: {res['state']}{reason}{until}"


def _target(t: JSON) -> str:
    conn = f" via {t['connection']}" if t.get("connection") else ""
    return f"{t['provider']}/{t['model']}{conn}"


def combos_table(combos: Sequence[JSON]) -> Table:
    t = Table(title=f"Combos ({len(combos)})")
    for col in ("name", "strategy", "targets", "kind"):
        t.add_column(col)
    for c in combos:
        kind = f"internal (pool {c.get('pool')})" if c["internal"] else "user"
        t.add_row(c["name"], c["strategy"], ", ".join(_target(x) for x in c["targets"]), kind)
    return t


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v * 100:.1f} %"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f} ms"


def combo_detail(combo: JSON, stats: JSON | None) -> Group:
    settings = {k: v for k, v in (combo.get("config") or {}).items() if v is not None}
    head = Text(f"Combo {combo['name']} — strategy {combo['strategy']}", style="bold")
    parts: list[RenderableType] = [head]
    if settings:
        parts.append(Text("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items())))
    window = (stats or {}).get("windowMinutes", 15)
    t = Table(title=f"Targets (last {window} minutes)")
    for col in ("target", "weight", "requests", "success", "p50", "p95", "state"):
        t.add_column(col)
    rows = (stats or {}).get("targets") or []
    for s in rows:
        t.add_row(
            s["key"],
            f"{s['weight']:g}",
            str(s["requests"]),
            _pct(s["successRate"]),
            _ms(s["p50Ms"]),
            _ms(s["p95Ms"]),
            s["state"],
        )
    if not rows:
        for x in combo["targets"]:
            t.add_row(_target(x), f"{x.get('weight', 1):g}", "0", "—", "—", "—", "no connection")
    parts.append(t)
    fallbacks = (stats or {}).get("fallbacks") or {}
    if fallbacks:
        ft = Table(title=f"Fallbacks (last {window} minutes)")
        ft.add_column("reason")
        ft.add_column("count")
        for reason, n in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
            ft.add_row(reason, str(n))
        parts.append(ft)
    return Group(*parts)


def degraded_parts(h: JSON) -> list[str]:
    """What makes ``/health`` say ``degraded``, one line per part, from the fields it reports.

    Why: ``status: degraded`` alone names nothing, and the table's other rows (a reachable
    quota store, no fail-open admissions) can all look fine while, say, the metadata DB is
    down; the operator must not have to read the JSON to learn which part is wrong. A status
    this function cannot explain (a newer gateway's reason) still gets a line, never none."""
    parts: list[str] = []
    if h.get("metadata") == "down":
        parts.append(
            "metadata DB unreachable: serving the last registry snapshot "
            f"(version {h.get('metadataVersion', '?')}); admin writes are refused (503) until "
            "it is back"
        )
    store = h.get("store") or {}
    outage = store.get("outage") or {}
    driver = store.get("driver", "?")
    if store.get("reachable") is False or outage.get("down"):
        pending = (outage.get("journal") or {}).get("pending")
        journal = f", {pending} usage record(s) journaled for replay" if pending else ""
        why = "unreachable" if store.get("reachable") is False else "in outage"
        parts.append(f"quota store ({driver}) {why}: admissions fail open{journal}")
    if not parts and h.get("status", "ok") != "ok":
        parts.append(f"status {h.get('status')!s} with no reason this CLI knows (see --json)")
    return parts


def health_view(h: JSON) -> Table:
    """``fairgate health``: a title naming what is degraded, a row per degraded part (red),
    then the state of each part."""
    store = h.get("store", {})
    status = h.get("status", "?")
    parts = degraded_parts(h)
    colour = "green" if status == "ok" else "yellow"
    title = f"Gateway: [{colour}]{status}[/]"
    if parts and status != "ok":
        title += " (" + escape(", ".join(p.split(":", 1)[0] for p in parts)) + ")"
    t = Table(title=title, show_header=False)
    t.add_column("what")
    t.add_column("value")
    for part in parts:
        t.add_row("[red]degraded[/]", f"[red]{escape(part)}[/]")
    if "metadata" in h:  # a gateway of an earlier version does not report it
        metadata = "reachable" if h.get("metadata") == "ok" else "[red]unreachable[/]"
        t.add_row("metadata DB", metadata)
    reachable = "reachable" if store.get("reachable") else "[red]unreachable[/]"
    t.add_row("quota store", f"{store.get('driver')} ({reachable})")
    t.add_row("fail-open admissions", str(h.get("failOpen", 0)))
    t.add_row("requests in flight", str(h.get("inflight", 0)))
    gc_error = (h.get("gc") or {}).get("lastError")
    if gc_error:
        t.add_row("retention GC", f"[yellow]last run failed ({escape(str(gc_error))})[/]")
    config = h.get("configFile")
    if config:
        diffs = config.get("differences")
        compared = "not compared" if diffs is None else f"{len(diffs)} difference(s)"
        t.add_row("config file", f"{config.get('mode')} mode, {compared} from the database")
    for warning in h.get("warnings", ()):
        t.add_row("warning", escape(str(warning)))
    return t


#: What each ``server.config_mode`` means, in a line.
CONFIG_MODES: Mapping[str, str] = {
    "seed": "the file creates what the database lacks; what the admin API, the CLI or the "
    "dashboard changed is kept",
    "authoritative": "every start sets what the file declares to the file's, overwriting "
    "what the admin API changed; a revoked key or a rotated-away secret never comes back",
}


def config_check(file: str, s: JSON) -> str:
    """The result of ``fairgate config check`` for a valid file: the summary, the mode, and
    the comparison with the database (names of objects and fields only)."""
    mode = str(s.get("mode", "seed"))
    lines = [
        f"[green]{escape(file)} is valid[/]: {s['connections']} connection(s), {s['keys']} "
        f"key(s), {s['pools']} pool(s), {s['combos']} combo(s)",
        f"mode: {mode} (server.config_mode): {CONFIG_MODES.get(mode, '')}",
    ]
    for pool in s.get("enforced", ()):
        dims = [
            enforced_dimension(d, int(pool["connections"]))
            + ("" if d["enforced"] else " (unknown: not enforced)")
            for d in pool["dimensions"]
        ]
        lines.append(
            f"pool {escape(str(pool['pool']))} enforces: {escape(', '.join(dims) or 'nothing')}"
        )
    lines.extend(f"[yellow]warning:[/] {escape(str(w))}" for w in s.get("warnings", ()))
    db = s.get("database") or {}
    where = escape(str(db.get("where", "")))
    diffs = db.get("differences")
    if not db.get("compared"):
        lines.append(f"database {where}: {escape(str(db.get('note') or ''))}")
    elif not diffs:
        lines.append(f"database {where}: holds what the file declares")
    else:
        lines.append(f"database {where}: {len(diffs)} difference(s)")
        lines.extend(f"  {escape(str(d['message']))}" for d in diffs)
    return "\n".join(lines)
