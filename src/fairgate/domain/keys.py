"""Client keys of the gateway: the record, why a key is refused a connection, and the hash kept.

Only the SHA-256 of a key's secret is stored or held in memory: the hot path looks a request's
key up by its hash (one dict hit), so nothing needs the clear secret after it was shown once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class ClientKey:
    """A gateway API key. Only the SHA-256 of the secret is kept (no character of it: the key
    is shown by its id).

    ``allowed_connections`` / ``allowed_providers`` open connections outside every pool to the
    key when ``server.require_allocation`` is on (a pooled connection needs an allocation in
    its pool instead); frozensets so the hot path's check is a set lookup."""

    id: str
    name: str
    key_hash: str
    enabled: bool = True
    allowed_models: tuple[str, ...] = ()  # empty = any
    allowed_connections: frozenset[str] = frozenset()
    allowed_providers: frozenset[str] = frozenset()


class Denial(StrEnum):
    """Why a key may not use a connection (the reason code a client sees in its 403)."""

    NO_ALLOCATION = "no_allocation"  # a pooled connection; the key has no allocation there
    CONNECTION_NOT_ALLOWED = "connection_not_allowed"  # outside every pool, not in the key's lists


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()
