"""Who may use what, at request time: a key's candidates filtered by ``Registry.denial``.

With ``server.require_allocation`` on, a key may use a pooled connection only with an
allocation in its pool, and a connection outside every pool only if the key lists it (or its
provider). A request whose every candidate is refused gets a 403 whose ``code`` is the reason
(``no_allocation`` or ``connection_not_allowed``): never a connection or pool id, which would
map the gateway's accounts for a tenant. Combo targets the key may not use are skipped, never
tried. Each check is a dict/set lookup on the snapshot, so this stays O(candidates).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey, Denial
from fairgate.process.errors import ApiError
from fairgate.snapshot import Registry

T = TypeVar("T")

_MESSAGES = {
    Denial.NO_ALLOCATION: "This API key has no allocation in the pool serving '{model}'; "
    "ask the gateway's admin for one",
    Denial.CONNECTION_NOT_ALLOWED: "This API key may not use the upstreams serving '{model}'; "
    "ask the gateway's admin to allow them",
}


def permitted(
    reg: Registry, key: ClientKey, items: Sequence[T], conn_of: Callable[[T], Connection]
) -> tuple[list[T], Denial | None]:
    """The items the key may use (``conn_of`` gives each one's connection), and why refused
    ones were refused (None when none was). ``no_allocation`` wins over
    ``connection_not_allowed``: it is the one an admin can act on per pool."""
    kept: list[T] = []
    reason: Denial | None = None
    for item in items:
        why = reg.denial(key, conn_of(item))
        if why is None:
            kept.append(item)
        elif reason is not Denial.NO_ALLOCATION:
            reason = why
    return kept, reason


def denied(reason: Denial, model: str) -> ApiError:
    """The client's 403: the reason as ``code``, a message naming only the model it asked."""
    return ApiError(
        403,
        _MESSAGES[reason].format(model=model),
        code=reason.value,
        type_="permission_error",
        param="model",
    )
