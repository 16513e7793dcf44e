"""``fairgate serve`` and ``demo`` resolve the one settings object at start: a bad value in any
source stops them with one line naming the variable and exit 2, before anything is opened."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairgate.cli import app


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("QUOTA_SATURATION_THRESHOLD", "1.5"),
        ("QUOTA_LEASE_MS", "soon"),
        ("FAIRGATE_PORT", "http"),
        ("FAIRGATE_SHUTDOWN_TIMEOUT_S", "-1"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_bad_setting_stops_the_start_naming_it(
    tmp_path: Path, command: str, var: str, value: str
) -> None:
    data = tmp_path / "data"
    res = CliRunner().invoke(
        app, [command, "--data-dir", str(data)], env={var: value, "FAIRGATE_ADMIN_KEY": ""}
    )
    assert res.exit_code == 2, res.output
    assert f"error: {var}: " in res.output
    assert value not in res.output.split(f"{var}: ", 1)[1]  # the message, not an echo
    assert not data.exists()  # nothing was opened


def test_a_bad_port_in_the_config_file_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "fairgate.yaml"
    cfg.write_text("server:\n  port: 0\n")
    res = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--data-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "server.port" in res.output
