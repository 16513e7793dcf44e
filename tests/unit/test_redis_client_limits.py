"""The quota store's Redis client gives up fast (an outage must not hold requests for seconds):
the timeout knob, and what the store's own client is built with. No server is needed."""

from __future__ import annotations

import pytest

from fairgate.process.settings import Settings
from fairgate.store.redis.store import MAX_CONNECTIONS, RedisQuotaStore
from fairgate.store.settings import DEFAULT_REDIS_TIMEOUT_MS


def redis_timeout_ms(env: dict[str, str]) -> int:
    return Settings.load(env).store.redis_timeout_ms


def test_timeout_knob_default_value_and_range(caplog: pytest.LogCaptureFixture) -> None:
    assert redis_timeout_ms({}) == DEFAULT_REDIS_TIMEOUT_MS == 1_000
    assert redis_timeout_ms({"QUOTA_STORE_REDIS_TIMEOUT_MS": " 250 "}) == 250
    for bad in ("49", "30001", "fast", "1.5"):
        assert redis_timeout_ms({"QUOTA_STORE_REDIS_TIMEOUT_MS": bad}) == 1_000
    assert "QUOTA_STORE_REDIS_TIMEOUT_MS" in caplog.text


async def test_own_client_lag_compensated_timeout_one_retry_bounded_pool() -> None:
    store = RedisQuotaStore(
        "redis://127.0.0.1:1/0", prefix="t", connect_timeout_s=0.1, socket_timeout_s=0.2
    )
    try:
        pool = store._client.connection_pool
        kwargs = pool.connection_kwargs
        # the socket timeouts are only the ceiling; the 0.2 s deadline is the store's own
        assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (10.0, 10.0)
        assert store._timeout_s == 0.2
        assert kwargs["socket_keepalive"] is True
        probe = store._probe_client.connection_pool.connection_kwargs
        # the out-of-loop probe only tells dead from alive: never under a second
        assert (probe["socket_connect_timeout"], probe["socket_timeout"]) == (1.0, 1.0)
        assert kwargs["retry"].get_retries() == 1
        assert pool.max_connections == MAX_CONNECTIONS
        # nothing listens on port 1: refused at once, reported as unreachable, not raised
        assert await store.ping() is False
    finally:
        await store.close()
