"""Scenario files: the on-off pattern's own ``on``/``off`` fields need no quoting (issue 18's
YAML trap), ``0m`` is an offset, and data that fell into the trap elsewhere is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fairgate.sim.scenario import ScenarioError, load_scenario, parse_scenario

TEXT = """\
name: trap
duration: 2h
pool: {dimensions: [{unit: requests, window: hourly, limit: 300}]}
keys:
  - id: research
    demand: {kind: on_off, rate: 100, on: 20m, off: 70m, phase: 0m}
"""


def test_unquoted_on_off_and_a_zero_phase_with_a_unit(tmp_path: Path) -> None:
    f = tmp_path / "trap.yaml"
    f.write_text(TEXT)
    demand = load_scenario(f).keys[0].demand
    assert (demand.on, demand.off, demand.phase) == (20 * 60_000, 70 * 60_000, 0)  # type: ignore[union-attr]


def test_booleans_are_still_booleans_where_they_are_values(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(TEXT.replace("keys:", "flag: true\nkeys:"))
    with pytest.raises(ScenarioError, match="flag"):  # an unknown field, read as a bool value
        load_scenario(f)


def test_data_loaded_as_yaml_1_1_names_the_trap() -> None:
    data = yaml.safe_load(TEXT)  # on/off → True/False
    with pytest.raises(ScenarioError, match=r"keys\.0\.demand\.True: a key read as a boolean"):
        parse_scenario(data)
