"""What the tests that run a store in a child Python process (``test_sqlite_forward.py``,
``test_sqlite_memory.py``) do when they are done with it, pass or fail."""

from __future__ import annotations

import subprocess


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill the child if it still runs, wait for it and close its pipe: a failed test leaves no
    process behind and no unclosed-file warning."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
