"""Run a Markdown page's code blocks as a reader would: in order, in one shell, in a throwaway
directory, so a page that stops working fails the suite.

Which blocks run is said in the page, by an HTML comment on the line before the block's fence
(Markdown keeps it out of the rendered page, and mkdocs renders the block as usual)::

    <!-- docs-test: run -->                  bash: run as is; python: run with python3
    <!-- docs-test: run background port=N --> a command that serves until stopped: started in
                                              the background, then waited for on port N
    <!-- docs-test: run stop-others -->      first stop what earlier blocks left running
    <!-- docs-test: run http-errors -->      the block shows an HTTP error on purpose
    <!-- docs-test: file NAME -->            the block is written to the file NAME
    <!-- docs-test: skip REASON -->          not run here, and why (systemd, a real login, …)

In a section the test runs, every block must carry one of these: a block added without one
fails the test, so nothing is left unrun by oversight. A line of a shell block that ends in
``&`` starts a server: it must name its ``--port``, and the next line waits until that port
answers HTTP (the process dying, or 180 s of silence on a host busy with other jobs, fails the
run). ``curl`` is run with ``--fail-with-body``, so an HTTP error of a documented call fails the
page (but in a block marked ``http-errors``, which shows one). The test states what it
substitutes (free ports for the documented ones, scratch directories, a database of the run)
and why; the text of each block is otherwise run as written.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+.-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
#: generous: a gateway starts in seconds on a quiet host and took over 30 s at load average 30
WAIT_S = 180


class DocsError(AssertionError):
    """A page the test cannot run as marked (an unmarked block, a bad marker, a server line
    without its port): a fault of the page, reported with its file and line."""


@dataclass(frozen=True)
class Directive:
    action: str  # run | file | skip
    background: bool = False
    stop_others: bool = False
    http_errors: bool = False  # the block shows an HTTP error on purpose: curl does not fail
    port: int | None = None
    file: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    section: tuple[str, ...]  # the headings above it, outermost first
    directive: Directive | None

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def parse_directive(raw: str, where: str) -> Directive:
    words = raw.split()
    if not words:
        raise DocsError(f"{where}: an empty docs-test marker")
    action, rest = words[0], words[1:]
    if action == "skip":
        if not rest:
            raise DocsError(f"{where}: 'docs-test: skip' needs a reason")
        return Directive("skip", reason=" ".join(rest))
    if action == "file":
        if len(rest) != 1:
            raise DocsError(f"{where}: 'docs-test: file NAME' names one file")
        return Directive("file", file=rest[0])
    if action != "run":
        raise DocsError(f"{where}: unknown docs-test action {action!r} (run, file or skip)")
    background = stop_others = http_errors = False
    port: int | None = None
    for word in rest:
        if word == "background":
            background = True
        elif word == "stop-others":
            stop_others = True
        elif word == "http-errors":
            http_errors = True
        elif word.startswith("port=") and word[5:].isdigit():
            port = int(word[5:])
        else:
            raise DocsError(f"{where}: unknown docs-test option {word!r}")
    return Directive(
        "run", background=background, stop_others=stop_others, http_errors=http_errors, port=port
    )


def blocks(page: str, text: str | None = None) -> list[Block]:
    """Every fenced block of ``docs/<page>`` with its section and its marker (the comment on
    the nearest non-blank line above the fence, if that line is one)."""
    lines = (text if text is not None else (DOCS / page).read_text()).splitlines()
    out: list[Block] = []
    headings: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        h = HEADING.match(lines[i])
        if h and not m:
            level = len(h.group(1))
            headings = [(lv, t) for lv, t in headings if lv < level] + [(level, h.group(2))]
            i += 1
            continue
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        above = start - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        marker = MARKER.match(lines[above]) if above >= 0 else None
        where = f"docs/{page}:{start + 1}"
        directive = parse_directive(marker.group(1), where) if marker else None
        out.append(
            Block(
                page,
                start + 1,
                lang.lower(),
                "\n".join(body) + "\n",
                tuple(t for _, t in headings),
                directive,
            )
        )
    return out


def section_blocks(page: str, section: str | None, text: str | None = None) -> list[Block]:
    """The blocks under the heading ``section`` (its sub-sections included), or the whole page;
    each must carry a marker."""
    chosen = [b for b in blocks(page, text) if section is None or section in b.section]
    if not chosen:
        raise DocsError(f"docs/{page}: no code block under the heading {section!r}")
    unmarked = [b.where for b in chosen if b.directive is None]
    if unmarked:
        raise DocsError(
            "blocks without a docs-test marker (run, file NAME or skip REASON): "
            + ", ".join(unmarked)
        )
    return chosen


@dataclass
class Substitution:
    """A documented value the test must change (a port another job may hold, a path outside the
    scratch directory): ``pattern`` (a regex) becomes ``replacement`` in every block."""

    pattern: str
    replacement: str
    why: str
    #: the replacement refers to the match's groups (``\1``); otherwise it is taken literally
    template: bool = False

    def apply(self, text: str) -> str:
        if self.template:
            return re.sub(self.pattern, self.replacement, text)
        return re.sub(self.pattern, lambda _: self.replacement, text)


CURL_FAILS = 'curl() { command curl --fail-with-body "$@"; }'

PRELUDE = f"""\
set -eo pipefail
__docs_wait() {{  # pid port: until the port answers HTTP; the process dying or {WAIT_S} s fail
  local pid=$1 port=$2 deadline=$((SECONDS + {WAIT_S}))
  until command curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$port/"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "docs-test: the server for port $port exited" >&2; return 1
    fi
    if (( SECONDS >= deadline )); then
      echo "docs-test: nothing answers on port $port after {WAIT_S} s" >&2; return 1
    fi
    sleep 0.2
  done
}}
__docs_stop() {{  # stop what earlier blocks left running (a reader's Ctrl-C; background
  local pids; pids=$(jobs -p)  # jobs of a script ignore SIGINT, so SIGTERM: the same drain)
  if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null || true; wait $pids 2>/dev/null || true; fi
}}
{CURL_FAILS}
"""


def _server_lines(block: Block, text: str) -> str:
    """The block's shell text with a wait after every line that starts a server (``… &``)."""
    out: list[str] = []
    heredoc: str | None = None
    logical = ""
    for raw in text.splitlines():
        out.append(raw)
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        logical += raw
        if raw.endswith("\\"):
            logical = logical[:-1]
            continue
        line, logical = logical, ""
        h = HEREDOC.search(line)
        if h:
            heredoc = h.group(2)
        code = line.split(" #", 1)[0].rstrip()
        if code.endswith("&") and not code.endswith("&&"):
            port = re.search(r"--port[ =](\d+)", code)
            if port is None:
                raise DocsError(f"{block.where}: a server started with '&' must name its --port")
            out.append(f"__docs_wait $! {port.group(1)}")
    return "\n".join(out) + "\n"


def script_of(
    chosen: Sequence[Block],
    subs: Sequence[Substitution],
    *,
    before: str = "",
    after: str = "",
) -> str:
    """One bash script running the chosen blocks in page order, each announced by its place in
    the page (so a failure points at the line to fix). ``before`` and ``after`` are the test's
    own steps around the page (what a page assumes, such as a running gateway, and the checks
    of what it promised), run in the same shell."""
    parts = [PRELUDE]
    if before:
        parts += ["echo '=== docs-test: the test sets up what the page assumes'", before]
    for b in chosen:
        d = b.directive
        assert d is not None
        if d.action == "skip":
            continue
        text = b.text
        for s in subs:
            text = s.apply(text)
        parts.append(f"echo {shlex.quote(f'=== docs-test: {b.where} ({b.lang})')}")
        if d.action == "file":
            assert d.file is not None
            parts.append(f"cat > {shlex.quote(d.file)} <<'__DOCS_FILE__'\n{text}__DOCS_FILE__")
            continue
        if d.stop_others:
            parts.append("__docs_stop")
        if d.http_errors:
            parts.append("unset -f curl")
        if b.lang == "python":
            parts.append(f"python3 - <<'__DOCS_PY__'\n{text}__DOCS_PY__")
        elif b.lang in ("bash", "sh", "shell"):
            if d.background:
                commands = [ln for ln in text.splitlines() if ln.strip()]
                if len(commands) != 1 or d.port is None:
                    raise DocsError(f"{b.where}: 'run background' wants one command and port=N")
                code = commands[0].split(" #", 1)[0].rstrip()
                port = str(d.port)
                for s in subs:  # the marker names the documented port, as the text does
                    port = s.apply(port)
                parts.append(f"{code} &\n__docs_wait $! {port}")
            else:
                parts.append(_server_lines(b, text))
            if d.http_errors:
                parts.append(CURL_FAILS)
        else:
            raise DocsError(f"{b.where}: a '{b.lang}' block can be a file or skipped, not run")
    if after:
        parts += ["echo '=== docs-test: the test checks what the page promised'", after]
    return "\n".join(parts) + "\n"


@dataclass
class Run:
    returncode: int
    output: str
    script: str = field(repr=False)

    def tail(self, lines: int = 150) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def clean_env(extra: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment of a reader's fresh shell: none of the suite's own fairgate, quota store
    or tracing settings, this Python's scripts (``fairgate``, ``python3``) first on the PATH,
    wide output (tables are not wrapped into the middle of a secret)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FAIRGATE_", "QUOTA_", "OTEL_", "RESILIENCE_"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(home)
    env["COLUMNS"] = "200"
    env.pop("VIRTUAL_ENV", None)
    env.update(extra)
    return env


def run_script(script: str, workdir: Path, env: Mapping[str, str], timeout_s: float) -> Run:
    """Run the script in its own process group and stop everything it left running (servers
    started in the background) when it ends, whatever happened."""
    path = workdir / "docs-test.sh"
    path.write_text(script)
    log = workdir / "docs-test.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(path)],
            cwd=workdir,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            _stop_group(proc.pid)
    text = log.read_text(errors="replace")
    if code == -1:
        text += f"\ndocs-test: the page did not finish within {timeout_s:.0f} s"
    return Run(code, text, script)


def _stop_group(pgid: int) -> None:
    """SIGTERM the script's process group (the servers drain and exit), then SIGKILL what is
    still there after a bounded wait."""
    for sig, wait_s in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
