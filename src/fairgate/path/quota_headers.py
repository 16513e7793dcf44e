"""An admission's ``x-ratelimit-*`` headers (SPEC §4) as the bytes an answer sends.

Written by the edge (:mod:`fairgate.path.render`) on an answer, and put on a quota refusal's
error by the executor (the error's headers are rendered by the edge too); kept apart from both
so that neither imports the other. Names and limits are encoded once per dimension, not per
request (a governed answer carries ten of these headers).
"""

from __future__ import annotations

import functools

from fairgate.quota.outcomes import Admission

__all__ = ["quota_headers", "quota_raw_headers"]


@functools.lru_cache(maxsize=4096)
def _quota_header_names(key: str, unit: str) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """The header names of one dimension, encoded once per dimension, not per request:
    limit, reset and remaining by dimension, then limit and remaining by unit."""
    suffix = key.replace("/", "-").replace(":", "-")
    return (
        f"x-ratelimit-limit-{suffix}".encode("latin-1"),
        f"x-ratelimit-reset-{suffix}".encode("latin-1"),
        f"x-ratelimit-remaining-{suffix}".encode("latin-1"),
        f"x-ratelimit-limit-{unit}".encode("latin-1"),
        f"x-ratelimit-remaining-{unit}".encode("latin-1"),
    )


def _count_text(value: float) -> bytes:
    """A count as a rate-limit header value: a whole number in digits (``2000000``, as OpenAI
    and Anthropic send them, which clients read with ``int()``), a fraction (a percent plan's
    share, fractional token estimates) with up to 15 significant digits. ``%g`` would write
    ``2e+06`` for a 2M-token limit and round a remaining ``1999872`` to ``2e+06``."""
    if value % 1 == 0 and abs(value) < 1e18:  # not inf or nan; an int limit from config too
        return b"%d" % value
    return b"%.15g" % value


@functools.lru_cache(maxsize=4096)
def _limit_text(limit: float) -> bytes:
    return _count_text(limit)


_UNAVAILABLE = (b"x-fairgate-quota", b"unavailable")


def quota_raw_headers(adm: Admission) -> list[tuple[bytes, bytes]]:
    """``x-ratelimit-*`` per dimension (SPEC §4), as the (name, value) bytes an ASGI answer
    sends: a governed answer carries ten of them, and the names and limits are encoded once
    per dimension instead of per request. When the store could not be read (fail-open) the
    limits and resets are still sent, the remaining counts are not, and
    ``x-fairgate-quota: unavailable`` says why (README, "Quota headers"). The unsuffixed names
    SDK users know come from the first dimension of each unit."""
    out: list[tuple[bytes, bytes]] = []
    by_unit: set[bytes] = set()
    unavailable = False
    for st in adm.status:
        limit_h, reset_h, remaining_h, unit_limit_h, unit_remaining_h = _quota_header_names(
            st.key, st.unit
        )
        limit = _limit_text(st.limit)
        out.append((limit_h, limit))
        out.append((reset_h, b"%ds" % -(-st.reset_ms // 1000)))  # whole seconds, rounded up
        if unit_limit_h not in by_unit:
            by_unit.add(unit_limit_h)
            out.append((unit_limit_h, limit))
        if st.remaining is None:
            unavailable = True
            continue
        remaining = _count_text(st.remaining)
        out.append((remaining_h, remaining))
        if unit_remaining_h not in by_unit:
            by_unit.add(unit_remaining_h)
            out.append((unit_remaining_h, remaining))
    if unavailable:
        out.append(_UNAVAILABLE)
    return out


def quota_headers(adm: Admission) -> dict[str, str]:
    """:func:`quota_raw_headers` as a dict of text (an error answer's headers)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in quota_raw_headers(adm)}
