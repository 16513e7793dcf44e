"""The admin CLI's renderings of ``/health`` (``fairgate health``): the config file's mode and
differences, and the pools that enforce nothing (issue 49), shown to people."""

from __future__ import annotations

from rich.console import Console

from fairgate.admin_cli.render import health_view

HEALTH = {
    "status": "ok",
    "store": {"driver": "sqlite", "reachable": True},
    "failOpen": 0,
    "inflight": 0,
    "warnings": ["pool team: no limits: provider 'openai' has no plan in the catalogue"],
    "configFile": {
        "mode": "seed",
        "differences": [{"kind": "key", "id": "alice", "action": "kept", "fields": ["secret"]}],
    },
}


def _text(h: dict[str, object]) -> str:
    console = Console(record=True, width=200)
    console.print(health_view(h))
    return console.export_text()


def test_health_shows_the_config_mode_its_differences_and_the_warnings() -> None:
    text = _text(HEALTH)
    assert "seed mode, 1 difference(s) from the database" in text
    assert "pool team: no limits: provider 'openai'" in text
    older = {k: v for k, v in HEALTH.items() if k not in ("configFile", "warnings")}
    assert "config file" not in _text(older)  # a gateway of an earlier version
