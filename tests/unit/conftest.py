"""Fixtures of the unit tests: plain data for the pure modules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from fairgate.sim.fairness import Metrics

#: a simulated run that meets every target of active mode (fairgate.sim.targets)
_GOOD_RUN = Metrics(
    jain=0.999,
    jain_worst_window=0.97,
    jain_window_mean=0.99,
    utilisation=0.99,
    overshoot={"requests/hourly": 0.0, "tokens/hourly": 0.0},
    blocked={},
    dropped={},
    admitted={"a": 10.0, "b": 20.0},
    ideal={"a": 10.0, "b": 20.0},
    demand={"a": 10.0, "b": 30.0},
    ratio={"a": 1.0, "b": 1.0},
    well_behaved=[],
)


@pytest.fixture
def sim_metrics() -> Callable[..., Metrics]:
    """A simulated run's metrics: one that meets every target, with the given fields changed."""

    def make(**changes: object) -> Metrics:
        return dataclasses.replace(_GOOD_RUN, **changes)  # type: ignore[arg-type]

    return make
