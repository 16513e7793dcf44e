"""context-relay and context-optimized: route by whether the conversation fits.

"Fits" means prompt estimate + expected output ≤ the target's context window (a target with no
known window fits). Targets that do not fit are never dropped — the estimate can be wrong and
the executor handles a real overflow — but they come last, largest window first, because the
largest is the one most likely to cope.
"""

from __future__ import annotations

from fairgate.routing.context import RouteInput
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_partition
from fairgate.routing.state import StrategyState

__all__ = ["context_optimized", "context_relay"]


def _too_small(inp: RouteInput) -> list[Target]:
    small = [t for t in inp.targets if not inp.fits(t)]
    small.sort(key=lambda t: -(t.context_window or 0))  # stable: ties keep configured order
    return small


def context_relay(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Configured (priority) order among the targets that fit, then the ones that do not,
    largest window first. As a conversation grows past the smaller windows they stop
    fitting, so its requests relay to the larger-context targets without any configuration
    beyond the windows themselves."""
    fitting = [t for t in inp.targets if inp.fits(t)]
    return soft_partition(fitting, inp.penalized) + soft_partition(_too_small(inp), inp.penalized)


def context_optimized(inp: RouteInput, state: StrategyState) -> list[Target]:
    """The smallest window that fits first (unknown windows after known ones), so the
    big-context targets stay free for the requests that need them; then the ones that do not
    fit, largest first."""
    fitting = [t for t in inp.targets if inp.fits(t)]
    fitting.sort(key=lambda t: (t.context_window is None, t.context_window or 0))
    return soft_partition(fitting, inp.penalized) + soft_partition(_too_small(inp), inp.penalized)
