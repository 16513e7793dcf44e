"""The plan of the house holds: import-linter's contracts (``[tool.importlinter]`` in
pyproject.toml) are kept, and the check can fail.

``make test`` runs ``lint-imports`` before the suite; this test runs it too, so a plain
``pytest`` catches a broken floor, and it proves the check is live by planting a violation of
each kind in a copy of the source: an arrow up the floors, a lazy import inside a function, a
fairgate import on the ground floor, aiohttp outside the upstream adapter, Starlette, an HTTP
answer or the service container in the request path below its edge.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fairgate

SRC = Path(fairgate.__file__).resolve().parent
ROOT = SRC.parent.parent
LINT = Path(sys.executable).parent / "lint-imports"
#: the request path's edge contract, as its name reads
EDGE = "request path imports no Starlette"


def lint(project: Path, src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=project,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_contracts_hold() -> None:
    done = lint(ROOT, SRC.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # the quota core reaching up to the metadata database: against the floors (up to the
        # server would break the path's edge fence too, through the path's imports of quota)
        ("quota/model.py", "from fairgate.db import schema\n", "Floors"),
        # the same arrow hidden in a function still counts
        ("routing/combo.py", "def _f():\n    from fairgate.db import base\n", "Floors"),
        # the ground floor importing anything of fairgate's
        ("domain/units.py", "from fairgate.clock import Clock\n", "ground floor"),
        # aiohttp outside the upstream adapter and the mock
        ("path/relay.py", "import aiohttp\n", "aiohttp"),
        # the request path below its edge rendering HTTP itself, or reaching the container
        (
            "path/attempt.py",
            "from starlette.responses import Response\n",
            "request path imports no",
        ),
        (
            "path/combos.py",
            "from fairgate.process.state import Gateway\n",
            "request path imports no",
        ),
        (
            "path/executor.py",
            "from fairgate.process.client_http import Answer\n",
            "request path imports no",
        ),
        # indirectly: the error the path raises taking Starlette in again
        (
            "process/errors.py",
            "from starlette.responses import Response\n",
            "request path imports no",
        ),
    ],
)
def test_each_kind_of_violation_is_caught(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(SRC, src / "fairgate", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = src / "fairgate" / module
    target.write_text(target.read_text(encoding="utf-8") + "\n" + line, encoding="utf-8")
    done = lint(tmp_path, src)
    assert done.returncode != 0
    broken = [ln for ln in done.stdout.splitlines() if " BROKEN" in ln]
    assert len(broken) == 1, done.stdout
    assert contract in broken[0]
