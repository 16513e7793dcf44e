"""Fixtures for end-to-end tests; the helpers live in ``e2e_support`` so tests can import them."""

from __future__ import annotations

from e2e_support import mock_upstream, start_gateway
from outage_support import throwaway_redis

__all__ = ["mock_upstream", "start_gateway", "throwaway_redis"]
