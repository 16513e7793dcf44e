"""What the request path reads of the process: a narrow view instead of the service container.

The request path used to take :class:`fairgate.process.state.Gateway` itself (and through it
reached most of the house: the metadata DB, the watcher, the secret box, the store factory).
It reads only these: the registry snapshot, the clock and timer, the quota engine, the
resilience manager, the OAuth accounts (the credential gate), the quota settings, the shared
slot leases, the server's limits from the configuration, and the key-last-used map it writes.
Each is read live at the moment of use: the admin API swaps the registry and the settings, and
a store switch replaces the engine and the slot leases, so a frozen copy would go stale. The
gateway state satisfies this protocol as it is (tests may pass anything that does).

The rest of the path's dependencies (upstream port, provider signals, prices, slots, metrics,
the event hook) are held by :class:`fairgate.path.call.Services`, which the app builds once.
"""

from __future__ import annotations

from typing import Protocol

from fairgate.clock import Clock
from fairgate.config import Config
from fairgate.process.oauth_service import OAuthAccounts
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.ports import SlotLeases
from fairgate.quota.settings import QuotaSettings
from fairgate.resilience.manager import RateLimitManager
from fairgate.snapshot import Registry
from fairgate.timers import Timer

__all__ = ["PathState"]


class PathState(Protocol):
    """The process state the request path reads (each attribute live, at the moment of use)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def timer(self) -> Timer: ...

    @property
    def engine(self) -> QuotaEngine: ...

    @property
    def resilience(self) -> RateLimitManager | None: ...

    @property
    def oauth(self) -> OAuthAccounts | None: ...

    @property
    def quota_settings(self) -> QuotaSettings: ...

    @property
    def slot_leases(self) -> SlotLeases | None: ...

    @property
    def config(self) -> Config: ...

    @property
    def key_last_used(self) -> dict[str, int]: ...
