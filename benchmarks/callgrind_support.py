"""What the callgrind benchmarks share: the instruction total of a callgrind file, the Redis a
run uses and cleans up after, the command line and the request body the load generators send
(``proxy_overhead`` too). Kept free of heavy imports: the scripts' children run under valgrind
and import this too."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path


def arg_parser(doc: str | None, *, compare: bool = False) -> argparse.ArgumentParser:
    """A benchmark's command line, its docstring as the help (as written: it holds the run
    lines); ``compare`` adds ``--compare NAME=SRC`` (repeatable), another source tree measured
    the same way."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if compare:
        ap.add_argument("--compare", action="append", default=[], metavar="NAME=SRC")
    return ap


def chat_body(stream: bool, text: str = "count me", max_tokens: int = 8) -> dict[str, object]:
    """The Chat Completions request the load generators send, one user message of ``text``."""
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def instruction_total(out: Path, fields: str = "summary|totals") -> int:
    """The first ``summary:`` or ``totals:`` line of a callgrind file (``fields`` narrows it:
    with instrumentation toggled, ``summary`` is what was counted at the first toggle)."""
    found = re.search(rf"^(?:{fields}):\s+(\d+)", out.read_text(errors="replace"), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(found.group(1))


def redis_url() -> str:
    return os.environ.get("FAIRGATE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


def drop_prefix(url: str, prefix: str) -> None:
    """Delete every key a run wrote under its prefix."""
    import redis  # only the Redis runs need the client

    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])
    finally:
        client.close()


def instrument(pid: int, switch: str) -> None:
    """Switch callgrind's instrumentation of process ``pid`` "on" or "off" (the benchmarks
    count only the requests, not the start-up and warm-up before them)."""
    subprocess.run(
        ["callgrind_control", "-i", switch, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run_instrumented(
    cmd: list[str], env: dict[str, str], steps: tuple[tuple[str, str], ...], timeout_s: float
) -> int:
    """Run ``cmd`` (under ``valgrind --tool=callgrind --instr-atstart=no``), a process that
    prints each step's word when it gets there and then waits for a line on stdin: switch the
    instrumentation as the step says ("on"/"off") and let it go on. Returns its exit code."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        for word, switch in steps:
            line = proc.stdout.readline().strip()
            if line != word:
                raise RuntimeError(f"the measured process said {line!r}, expected {word!r}")
            instrument(proc.pid, switch)
            proc.stdin.write("\n")
            proc.stdin.flush()
        return proc.wait(timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
