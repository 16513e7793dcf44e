"""Fixtures for end-to-end tests; the helpers live in ``e2e_support`` so tests can import them."""

from __future__ import annotations

import pytest
from e2e_support import TEST_CLOCK, ClockPlan, mock_upstream, start_gateway
from outage_support import cpu_burners, throwaway_redis

__all__ = ["cpu_burners", "e2e_test_clock", "mock_upstream", "start_gateway", "throwaway_redis"]


@pytest.fixture(scope="module", autouse=True)
def e2e_test_clock() -> ClockPlan:
    """One test-clock timeline per module, started before the module's first process."""
    TEST_CLOCK.restart()
    return TEST_CLOCK


@pytest.fixture(autouse=True)
def e2e_test_clock_pinned(e2e_test_clock: ClockPlan) -> ClockPlan:
    """With ``FAIRGATE_E2E_CLOCK_START`` set (the boundary guard), every test starts its own
    timeline, frozen at that instant until the test moves it across the boundary."""
    if e2e_test_clock.pinned:
        e2e_test_clock.restart()
    return e2e_test_clock
