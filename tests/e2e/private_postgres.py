"""A PostgreSQL server of the test's own, to stop and start at will (the machine's shared server
is used by other test runs and must never be stopped).

``initdb`` + ``pg_ctl`` from the installed PostgreSQL (``pg_config --bindir``, else the newest
``/usr/lib/postgresql/*/bin``) in a temporary directory, listening on a free loopback port, trust
authentication, no fsync (a test server: nothing here has to survive a power cut). PostgreSQL
refuses to run as root, so under root the commands run as the ``postgres`` user (``runuser``),
as the Debian packages set it up."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path


def _bindir() -> Path | None:
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], check=False, capture_output=True, text=True)
        path = Path(out.stdout.strip())
        if (path / "initdb").exists():
            return path
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unavailable_reason() -> str | None:
    """Why no private server can be started here (None: it can)."""
    if _bindir() is None:
        return "PostgreSQL's initdb/pg_ctl are not installed"
    if os.geteuid() == 0:
        if not shutil.which("runuser"):
            return "running as root without runuser: cannot start PostgreSQL as another user"
        if subprocess.run(["id", "postgres"], check=False, capture_output=True).returncode != 0:
            return "running as root and there is no 'postgres' user to run PostgreSQL"
    return None


class PrivatePostgres:
    """``start()``/``stop()`` a throwaway server; ``close()`` stops it and removes its files."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, unavailable_reason()
        self._bin = bindir
        self._root = Path(tempfile.mkdtemp(prefix="fg-pg-"))
        self._data = self._root / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._frozen: list[int] = []
        if os.geteuid() == 0:
            shutil.chown(self._root, "postgres", "postgres")
        self._run("initdb", "-D", str(self._data), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self._bin / tool), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=120, cwd=self._root
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        """Start and wait until it accepts connections (``pg_ctl -w``)."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self._root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        log = str(self._root / "server.log")
        self._run("pg_ctl", "-D", str(self._data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        """A fast shutdown: connections are cut, as when an operator stops the service."""
        self._run("pg_ctl", "-D", str(self._data), "-m", "fast", "-w", "stop")

    def _pids(self) -> list[int]:
        """The postmaster and its children (backends, background workers)."""
        master = int((self._data / "postmaster.pid").read_text().split()[0])
        kids = subprocess.run(
            ["pgrep", "-P", str(master)], check=False, capture_output=True, text=True
        )
        return [master, *(int(p) for p in kids.stdout.split())]

    def freeze(self) -> None:
        """Stop every server process (SIGSTOP): the server hangs instead of refusing, as a
        host that stalls or a network that drops packets looks from a client (the kernel still
        accepts connections; nothing answers on them)."""
        self._frozen = self._pids()
        for pid in self._frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    def close(self) -> None:
        self.thaw()
        with contextlib.suppress(RuntimeError):  # already stopped
            self._run("pg_ctl", "-D", str(self._data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self._root, ignore_errors=True)
