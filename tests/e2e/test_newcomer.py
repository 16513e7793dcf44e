"""The README's first command, as a new user runs it: `make demo` on a fresh copy of the tree.

Why a test of its own: `make test` installs every extra, so a module that needs one (an
unconditional ``import redis`` once) kept the suite green while `make demo`, which installs the
package without extras, failed for everyone. This test copies the tree as a clone would have it
(no ``.venv``, nothing ignored), runs `make demo` there on a free port, which builds its own
venv with the base install only, reads the curl command the demo prints, runs that command
with the real curl, and expects 200 with the ``x-ratelimit-*`` headers. Then it stops the demo
the way its banner says (Ctrl-C) and expects a clean exit.

It installs from the package registry's cache like any user (a minute or two on a busy
machine), hence ``slow``.
"""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from e2e_support import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: Generous bounds for a busy 2-core machine; they end a hang, they measure nothing.
INSTALL_AND_START_S = 900.0
STOP_S = 60.0


def _fresh_copy(dest: Path) -> None:
    """The tree as a clone holds it: tracked files and new files not ignored (so an unsaved
    working tree is what is tested), never the developer's ``.venv`` or caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree but still tracked
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _newcomer_env(port: int) -> dict[str, str]:
    """The environment of a user who has just cloned: nothing of this test run's venv,
    fairgate settings or test clock leaks into the demo."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FAIRGATE_", "QUOTA_", "PYTEST", "VIRTUAL_ENV", "PYTHON"))
    }
    venv_bin = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["FAIRGATE_PORT"] = str(port)
    return env


def _reader(stream: object, lines: queue.Queue[str | None]) -> None:
    for raw in stream:  # type: ignore[attr-defined]
        lines.put(raw.decode(errors="replace").rstrip("\n"))
    lines.put(None)


def _wait_for_banner(lines: queue.Queue[str | None], log: list[str]) -> str:
    """The curl line the demo prints, once it says it is serving."""
    deadline = time.monotonic() + INSTALL_AND_START_S
    curl = ""
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=5)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail("make demo ended before serving:\n" + "\n".join(log[-60:]))
        log.append(line)
        if line.startswith("curl ") and "/v1/chat/completions" in line:
            curl = line
        if "Ctrl-C stops it." in line:
            assert curl, "the demo printed no chat curl:\n" + "\n".join(log)
            return curl
    pytest.fail("make demo did not serve in time:\n" + "\n".join(log[-60:]))


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    """The banner comes just before the server binds its port; a user pasting at once would
    retry, and so does this (bounded)."""
    deadline = time.monotonic() + INSTALL_AND_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail("the demo never listened on its port")


def _run_printed_curl(curl: str) -> tuple[int, dict[str, str], str]:
    """The printed command as the user pastes it, with -i to see the answer's head."""
    argv = shlex.split(curl)
    argv[1:1] = ["-sS", "-i", "--max-time", "120"]
    out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    head, _, body = out.stdout.replace("\r\n", "\n").partition("\n\n")
    status_line, *header_lines = head.split("\n")
    headers = {}
    for h in header_lines:
        name, _, value = h.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def test_make_demo_on_a_fresh_copy_serves_the_printed_curl(tmp_path: Path) -> None:
    if shutil.which("make") is None or shutil.which("curl") is None:
        pytest.fail("make and curl are needed (a new user has them)")
    tree = tmp_path / "fairgate"
    _fresh_copy(tree)
    assert not (tree / ".venv").exists()
    port = free_port()
    proc = subprocess.Popen(
        ["make", "demo"],
        cwd=tree,
        env=_newcomer_env(port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C goes to the whole group, as from a terminal
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    log: list[str] = []
    try:
        curl = _wait_for_banner(lines, log)
        assert f"127.0.0.1:{port}/v1/chat/completions" in curl
        _wait_listening(port, proc)
        status, headers, body = _run_printed_curl(curl)
        assert status == 200, body
        assert '"choices"' in body
        ratelimit = sorted(h for h in headers if h.startswith("x-ratelimit-"))
        assert "x-ratelimit-limit-requests" in ratelimit, headers
        assert "x-ratelimit-remaining-requests" in ratelimit, headers
        # the demo's venv is the base install: no extra came along
        venv_py = tree / ".venv" / "bin" / "python"
        probe = subprocess.run(
            [
                str(venv_py),
                "-c",
                "import importlib.util as u; "
                "print([m for m in ('matplotlib', 'opentelemetry.sdk', 'pytest') "
                "if u.find_spec(m.split('.')[0]) and u.find_spec(m)])",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert probe.stdout.strip() == "[]"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail("the demo did not stop on Ctrl-C:\n" + "\n".join(log[-40:]))
    while (line := lines.get(timeout=STOP_S)) is not None:
        log.append(line)
    assert proc.stdout is not None
    proc.stdout.close()
    # make reports the interrupt of its recipe (2); the demo itself must not crash on the way out
    tail = "\n".join(log[-20:])
    assert "Traceback" not in tail, tail
