"""Guard: the end-to-end window tests pass when a bucket boundary passes under them.

Issue 21: a run that crossed 15:00 UTC failed because hourly counts started to fade
(``prev × (1 − elapsed/W)``) under a test that compared them exactly. The suite now runs every
process on a test clock that starts mid-bucket; this guard runs the window tests again with
``FAIRGATE_E2E_CLOCK_START`` pinned 1 s before an hourly, a 5-hour, a daily and a weekly
boundary: each test's gateway reads that instant once it is ready, so its traffic straddles the
boundary. A test that compares window counts with a literal fails here, and the guard checks
that counters of the boundary's window were indeed compared across it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import CLOCK_START_ENV, CROSSINGS_ENV
from outage_support import report

from fairgate.domain.units import Window
from fairgate.testclock import parse_instant

E2E = Path(__file__).parent
#: each boundary is one of its own window and of no longer window (a weekly one is also daily)
BOUNDARIES = {
    "hourly": "2026-06-24T11:00:00Z",
    "5h": "2026-06-24T13:00:00Z",
    "daily": "2026-06-24T00:00:00Z",
    "weekly": "2026-06-25T00:00:00Z",  # epoch weeks turn on Thursdays
}
#: the window tests: counts per key and pool, settles after a stop and a disconnect (requests
#: counted in hourly, 5-hour, daily and weekly windows), and the test of the original report.
#: (Admission at a share across an hourly boundary runs in-process, on an injected clock:
#: tests/inproc/test_fair_sharing_inproc.py; so do the metrics gauges, on a clock that stands
#: still: tests/inproc/test_observability_inproc.py.)
WINDOW_TESTS = [
    "test_shutdown.py::test_sigterm_lets_in_flight_requests_finish",
    "test_stream_disconnect.py",
    "test_hostile_faults.py::"
    "test_stream_silent_before_its_first_content_is_cut_at_the_upstream_timeout",
]


def test_boundaries_are_what_they_claim() -> None:
    longer = {"hourly": "5h", "5h": "daily", "daily": "weekly", "weekly": "monthly"}
    for window, iso in BOUNDARIES.items():
        at = parse_instant(iso)
        assert at % Window(window).ms == 0, window
        assert at % Window(longer[window]).ms != 0, window


@pytest.mark.slow
@pytest.mark.parametrize("window", list(BOUNDARIES))
def test_window_tests_pass_one_second_before_a_boundary(
    window: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start_ms = parse_instant(BOUNDARIES[window]) - 1_000
    crossings = tmp_path / "crossings.txt"
    env = {**os.environ, CLOCK_START_ENV: str(start_ms), CROSSINGS_ENV: str(crossings)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--no-header",
            "--rootdir",
            str(E2E.parent.parent),
            "--basetemp",
            str(tmp_path / "t"),
            *(str(E2E / t) for t in WINDOW_TESTS),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        cwd=E2E.parent.parent,
    )
    out = run.stdout + run.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    crossed = crossings.read_text().splitlines() if crossings.exists() else []
    of_window = [c for c in crossed if c.split()[0] == window]
    report(
        capsys,
        f"window tests 1 s before a {window} boundary",
        {
            "result": summary,
            "counts checked across a boundary": len(crossed),
            f"of which {window} counters": len(of_window),
        },
    )
    assert run.returncode == 0, out[-10_000:]
    assert " passed" in summary
    # the boundary really passed between traffic and the counts the tests compared
    assert of_window, crossed
