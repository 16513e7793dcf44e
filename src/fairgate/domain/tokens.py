"""A subscription account's OAuth tokens: what the token stores keep and the refresher trades.

A record of the ground floor because three floors hold it: the OAuth refresher (providers), the
token stores of the metadata database and of Redis (db), and the admin surfaces that show its
expiry. The secrets never leave through ``repr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenSet:
    """One connection's OAuth state; ``expires_at_ms`` None = the provider did not say."""

    access_token: str = field(repr=False)
    refresh_token: str = field(repr=False)
    expires_at_ms: int | None = None
    account_id: str | None = None
    #: when the token endpoint issued it (None: unknown, e.g. tokens from the config)
    issued_at_ms: int | None = None
