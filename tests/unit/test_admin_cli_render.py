"""The admin CLI's renderings of ``/health`` (``fairgate health``): the config file's mode and
differences, and the pools that enforce nothing (issue 49), shown to people."""

from __future__ import annotations

import re

from rich.console import Console

from fairgate.admin_cli.render import degraded_parts, health_view

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


# -- degraded: which part (issue 48, item 8) -----------------------------------------------------

METADATA_DOWN = {
    **HEALTH,
    "status": "degraded",
    "metadata": "down",
    "metadataVersion": 41,
    "store": {"driver": "redis", "reachable": True, "outage": {"down": False}},
    "configFile": {"mode": "seed", "differences": None},
}


def test_a_metadata_outage_is_named_in_the_title_and_its_own_row() -> None:
    # before: "Gateway: degraded" over a table in which every row looked fine
    text = _text(METADATA_DOWN)
    assert "Gateway: degraded (metadata DB unreachable)" in text
    assert "metadata DB unreachable: serving the last registry snapshot (version 41)" in text
    assert "admin writes are refused" in text
    assert re.search(r"│ metadata DB\s+│ unreachable", text)
    assert degraded_parts(METADATA_DOWN) == [
        "metadata DB unreachable: serving the last registry snapshot (version 41); admin "
        "writes are refused (503) until it is back"
    ]


def test_a_quota_store_outage_says_admissions_fail_open_and_what_is_journaled() -> None:
    h = {
        **HEALTH,
        "status": "degraded",
        "metadata": "ok",
        "store": {
            "driver": "redis",
            "reachable": False,
            "outage": {"down": True, "journal": {"pending": 12}},
        },
    }
    assert degraded_parts(h) == [
        "quota store (redis) unreachable: admissions fail open, 12 usage record(s) journaled "
        "for replay"
    ]
    assert "Gateway: degraded (quota store (redis) unreachable)" in _text(h)
    # in outage while a ping got through (the engine still counts it down): named as such
    h["store"] = {"driver": "redis", "reachable": True, "outage": {"down": True}}
    assert degraded_parts(h) == ["quota store (redis) in outage: admissions fail open"]


def test_both_parts_down_are_both_named() -> None:
    h = {**METADATA_DOWN, "store": {"driver": "sqlite", "reachable": False, "outage": {}}}
    parts = degraded_parts(h)
    assert [p.split(":", 1)[0] for p in parts] == [
        "metadata DB unreachable",
        "quota store (sqlite) unreachable",
    ]


def test_a_degraded_status_without_a_known_reason_is_never_silent() -> None:
    h = {**HEALTH, "status": "degraded", "metadata": "ok"}
    assert degraded_parts(h) == ["status degraded with no reason this CLI knows (see --json)"]


def test_ok_names_nothing() -> None:
    assert degraded_parts({**HEALTH, "metadata": "ok"}) == []
    assert "degraded" not in _text({**HEALTH, "metadata": "ok"})
