"""Plan catalog and resolver (SPEC §1)."""

from __future__ import annotations

from fairgate.domain.units import Unit, Window
from fairgate.quota.catalog import CATALOG, resolve_plan
from fairgate.quota.model import Dimension


def dims(provider: str) -> list[str]:
    return [f"{d.unit}/{d.window}/{d.limit:g}" for d in resolve_plan(provider).dimensions]


def test_catalog_entries() -> None:
    assert dims("codex") == ["percent/5h/100", "percent/weekly/100"]
    assert dims("claude") == ["percent/5h/100", "percent/weekly/100"]
    assert dims("bailian") == ["percent/5h/100", "percent/weekly/100", "percent/monthly/100"]
    assert dims("kimi") == ["requests/hourly/1500"]
    assert dims("alibaba") == ["requests/monthly/90000"]
    assert dims("glm") == ["tokens/5h/0", "tokens/weekly/0"]
    assert dims("minimax") == dims("kimi-coding") == dims("glm")
    assert dims("deepseek") == ["usd/monthly/0"]
    assert dims("xiaomi-mimo") == ["tokens/monthly/4.1e+09"]
    assert dims("grok-cli") == [
        "requests/daily/864",
        "tokens/daily/1.8e+07",
        "requests/weekly/6048",
        "tokens/weekly/1.26e+08",
    ]


def test_openai_and_anthropic_need_manual_plans() -> None:
    assert "openai" not in CATALOG
    assert resolve_plan("openai").source == "empty"
    assert resolve_plan("anthropic").dimensions == ()


def test_override_wins_then_catalog_then_empty() -> None:
    override = [Dimension(Unit.REQUESTS, Window.DAILY, 10)]
    assert resolve_plan("kimi", override).source == "override"
    assert resolve_plan("kimi", override).dimensions == tuple(override)
    assert resolve_plan("kimi", []).source == "catalog"  # an empty override does not count
    assert resolve_plan(" KIMI ").source == "catalog"
    assert resolve_plan("unknown-provider").source == "empty"


def test_unknown_limits_are_shown_not_enforced() -> None:
    plan = resolve_plan("glm")
    assert plan.dimensions
    assert not any(d.known for d in plan.dimensions)
