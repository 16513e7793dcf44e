"""What the configuration tests (``test_config.py``, ``test_config_combos.py``) both do: break
one field of a valid configuration, named by its dotted path, to see the problem name it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def set_at(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets the field at ``path`` (dots between mapping keys and list indexes,
    e.g. ``pools.0.allocations.0.weight``) to ``value``; the table of cases stays one line each."""

    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate
