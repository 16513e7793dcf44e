"""Browser tests: Debian's Chromium driven by Playwright, and a stdlib PNG check for screenshots.

Playwright never downloads a browser here: it drives ``/usr/bin/chromium`` (``make test`` and
``.ci/run`` install the ``chromium`` package when it is missing). Without a browser the tests skip
locally and fail under CI (``CI`` set), like the Redis tests.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("FAIRGATE_TEST_CHROMIUM") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _unavailable(msg: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module (contexts per test keep the tests apart)."""
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install -e '.[dev]'")
    if not Path(CHROMIUM).exists():
        _unavailable(
            f"no Chromium at {CHROMIUM}: `apt-get install chromium` "
            "(make test and .ci/run do it when run as root)"
        )
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def collect_problems(page: Any, problems: list[str], timeout_ms: int) -> Any:
    """``page`` with its console errors and uncaught script errors appended to ``problems`` (a
    test asserts it empty at the end: a CSP violation or a script error shows up there) and its
    default timeout set. Failed requests the page expects (a wrong key's 401, a missing optional
    endpoint's 404) are logged by Chromium as resource errors: those are left out."""
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.set_default_timeout(timeout_ms)
    return page


# -- PNG ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixels(self, step: int = 1) -> Iterator[bytes]:
        c = self.channels
        for row in self.rows[::step]:
            for x in range(0, len(row), c * step):
                yield row[x : x + c]


def _add_bytes(a: bytes, b: bytes) -> bytes:
    """Bytewise (a + b) mod 256 on whole rows at once, with big-int SWAR arithmetic."""
    n = len(a)
    low7 = int.from_bytes(b"\x7f" * n, "big")
    high1 = int.from_bytes(b"\x80" * n, "big")
    x, y = int.from_bytes(a, "big"), int.from_bytes(b, "big")
    return (((x & low7) + (y & low7)) ^ ((x ^ y) & high1)).to_bytes(n, "big")


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> Image:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG (what Chromium's screenshots are)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = depth = color = interlace = -1
    while pos < len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif ctype == b"IDAT":
            idat.append(chunk)
        elif ctype == b"IEND":
            break
    assert depth == 8, f"bit depth {depth}"
    assert interlace == 0, "interlaced"
    assert color in (2, 6), f"color type {color}"
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytes(stride)
    rows: list[bytes] = []
    for y in range(height):
        start = y * (stride + 1)
        ftype, line = raw[start], raw[start + 1 : start + 1 + stride]
        if ftype == 0:
            out = bytes(line)
        elif ftype == 2:
            out = _add_bytes(line, prev)
        elif ftype == 1:
            buf = bytearray(stride)
            for ch in range(bpp):
                buf[ch::bpp] = bytes(accumulate(line[ch::bpp], lambda s, v: (s + v) & 0xFF))
            out = bytes(buf)
        else:
            buf = bytearray(stride)
            for i in range(stride):
                left = buf[i - bpp] if i >= bpp else 0
                up = prev[i]
                if ftype == 3:
                    buf[i] = (line[i] + ((left + up) >> 1)) & 0xFF
                else:
                    upleft = prev[i - bpp] if i >= bpp else 0
                    buf[i] = (line[i] + _paeth(left, up, upleft)) & 0xFF
            out = bytes(buf)
        rows.append(out)
        prev = out
    return Image(width, height, bpp, rows)


def assert_not_blank(png: bytes, *, min_colors: int = 16, max_dominant: float = 0.97) -> Image:
    """The screenshot shows something: many colours, and no single colour fills it."""
    img = decode_png(png)
    assert img.width > 100
    assert img.height > 100
    counts: dict[bytes, int] = {}
    total = 0
    for px in img.pixels(step=2):
        counts[px] = counts.get(px, 0) + 1
        total += 1
    dominant = max(counts.values()) / total
    assert len(counts) >= min_colors, f"only {len(counts)} colours: a blank page?"
    assert dominant <= max_dominant, f"one colour covers {dominant:.1%} of the page"
    return img
