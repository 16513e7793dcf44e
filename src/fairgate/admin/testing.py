"""Admin route of the test clock: read it, move it forward (see :mod:`fairgate.testclock`).

It exists only on a gateway started with ``FAIRGATE_TESTING=1`` and a test clock: anywhere else
it answers 404, as a route that does not exist would, and it is left out of the OpenAPI schema.
Admin-only like the rest of ``/api``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from fairgate.admin.common import GW, AdminError
from fairgate.process.state import Gateway
from fairgate.testclock import ShiftedClock, TestClockError, advance_ms_of, clock_view

router = APIRouter(include_in_schema=False)


def _test_clock(gw: Gateway) -> ShiftedClock:
    clock = gw.clock
    if not isinstance(clock, ShiftedClock):
        raise AdminError(404, "Not Found")
    return clock


@router.get("/testing/clock")
async def get_clock(gw: GW) -> dict[str, Any]:
    """The test clock now, its start, anchor and rate, and how far it was moved."""
    return clock_view(_test_clock(gw))


@router.post("/testing/clock")
async def advance_clock(gw: GW, request: Request) -> dict[str, Any]:
    """Move the test clock forward by ``advanceMs`` milliseconds (``{"advanceMs": 3600000}``)."""
    clock = _test_clock(gw)
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise AdminError(422, "the body must be a JSON object", [("advanceMs", "required")])
    try:
        clock.advance(advance_ms_of(body))
    except TestClockError as exc:
        raise AdminError(422, str(exc), [("advanceMs", str(exc))]) from None
    return clock_view(clock)
