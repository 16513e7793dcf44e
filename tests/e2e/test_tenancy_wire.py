"""Who may use what, where it needs a process: a config that puts a password in a URL or gives
a connection no models is refused at start with exit code 2 (docs/security.md, "Tenancy").
The tenancy decisions themselves run in-process: ``tests/inproc/test_tenancy_wire_inproc.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _serve_exit(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(config_text)
    return subprocess.run(
        [sys.executable, "-m", "fairgate", "serve", "--config", str(cfg), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FAIRGATE_DATA_DIR": str(tmp_path / "data")},
        check=False,
    )


def test_a_url_password_and_an_empty_model_list_are_refused_at_start(tmp_path: Path) -> None:
    good = "  - {id: c, provider: mock, base_url: 'http://127.0.0.1:9/v1', models: '*'}\n"
    out = _serve_exit(tmp_path, "connections:\n" + good.replace("http://", "http://u:pw-x1@"))
    assert out.returncode == 2
    assert "connections.0.base_url" in out.stderr + out.stdout
    assert "pw-x1" not in out.stderr + out.stdout
    out = _serve_exit(tmp_path, "connections:\n" + good.replace("'*'", "[]"))
    assert out.returncode == 2
    assert "connections.0.models" in out.stderr + out.stdout
    out = _serve_exit(tmp_path, "connections:\n" + good.replace(", models: '*'", ""))
    assert out.returncode == 2
    assert "connections.0.models" in out.stderr + out.stdout
