"""What the tests of the ``fairgate`` command as its own process (integration and e2e) share:
running it and checking how it refuses to start."""

from __future__ import annotations

import subprocess
import sys


def refused_at_start(args: list[str], env: dict[str, str] | None = None) -> str:
    """Run ``python -m fairgate ARGS`` (``env``: its whole environment, else this one) and
    check it refuses to start as bad input does, exit 2 and no traceback; return what it
    printed, for the test to check the message names the problem."""
    run = subprocess.run(
        [sys.executable, "-m", "fairgate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert "Traceback" not in out
    return out
