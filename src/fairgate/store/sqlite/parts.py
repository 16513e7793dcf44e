"""Shapes shared by the SQLite store's two modes (transactional and in-memory): what a
reservation holds and what a reclaim sees. Its own module so the in-memory counters
(:mod:`fairgate.store.sqlite.memory`) need nothing from :mod:`fairgate.store.sqlite.store`."""

from __future__ import annotations

import orjson

#: A part of a reservation: (counter, window_ms, bucket, amount, scope).
Part = tuple[str, int, int, float, str]
#: An expired reservation: (reservation id, pool id, key id, parts).
Expired = tuple[str, str, str, list[Part]]


def dump_parts(parts: list[Part]) -> str:
    return orjson.dumps(parts).decode()


def load_parts(raw: str | bytes) -> list[Part]:
    return [(str(k), int(w), int(b), float(a), str(s)) for k, w, b, a, s in orjson.loads(raw)]
