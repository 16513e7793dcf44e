"""Process-independent hashing for sticky routing.

Python's ``hash()`` of a string is salted per process, so two replicas (or one replica after a
restart) would send the same session to different targets. Sticky strategies hash with BLAKE2b
instead, which is stable everywhere.
"""

from __future__ import annotations

import hashlib

__all__ = ["stable_index", "stable_unit"]

_SCALE = float(1 << 64)


def _digest(parts: tuple[str, ...]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big")


def stable_unit(*parts: str) -> float:
    """A uniform number in (0, 1], the same for the same parts in every process."""
    return (_digest(parts) + 1) / _SCALE


def stable_index(n: int, *parts: str) -> int:
    """A stable index in ``range(n)`` (``n`` ≥ 1)."""
    return _digest(parts) % n
