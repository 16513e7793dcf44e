"""The suite's own rules that keep it independent of how busy the host is."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings


def test_property_tests_have_no_wall_clock_deadline() -> None:
    # A per-example deadline fails a correct property on a loaded host (DeadlineExceeded, then
    # Flaky): seen in tests/unit/test_sim_ideal.py while seven other sessions shared the cores.
    assert settings().deadline is None
    assert HealthCheck.too_slow in settings().suppress_health_check


def test_every_test_has_a_timeout(pytestconfig: pytest.Config) -> None:
    # pytest-timeout turns a hang into a failure naming the test, instead of a CI run that never
    # ends (a hang on a lost wake-up was seen once in a full run).
    assert float(pytestconfig.getini("timeout")) > 0
