"""One cheap call to a connection, for "does this key work?" (``fairgate connections test``).

The call is ``GET <base_url>/models`` with the connection's own credentials: it costs no tokens,
every OpenAI- and Anthropic-compatible provider answers it, and it proves the URL, the secret
and the network path at once. The reading is what an operator wants to see: the status, the
time to answer, how many models the account lists, the rate-limit headers if any were sent, and
for a failure the provider's own words — never the secret (the error body is the provider's,
and a provider that echoed our key would be redacted by the caller's log redactor anyway; we
drop any body text that contains it here too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from fairgate.domain.connections import Connection
from fairgate.domain.readings import RateLimitSnapshot, parse_rate_limit_headers
from fairgate.providers.transport import HttpSender
from fairgate.providers.upstream import upstream_headers, upstream_url

__all__ = ["ProbeResult", "probe_connection"]

#: Characters of an upstream error body kept in the reading.
_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    status: int | None
    latency_ms: float
    models: list[str] = field(default_factory=list)
    rate_limit: RateLimitSnapshot | None = None
    error: str | None = None


def _model_ids(payload: Any) -> list[str]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return []
    return [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _error_text(raw: bytes, secret: str) -> str:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", errors="replace")
    else:
        err = payload.get("error") if isinstance(payload, dict) else None
        msg = err.get("message") if isinstance(err, dict) else None
        text = str(msg) if msg else raw.decode("utf-8", errors="replace")
    if secret and secret in text:
        text = text.replace(secret, "[redacted]")
    return text.strip()[:_ERROR_CHARS]


async def probe_connection(
    conn: Connection, http: HttpSender, *, now_ms: int, timeout_s: float = 10.0
) -> ProbeResult:
    """List the connection's models once; never raises for an upstream or network failure."""
    t0 = time.perf_counter()
    try:
        resp = await http.send(
            "GET",
            upstream_url(conn, "/models"),
            headers=upstream_headers(conn, {}),
            timeout_s=timeout_s,
        )
        try:
            raw = await resp.read()
        finally:
            resp.release()
    except TimeoutError:
        latency = (time.perf_counter() - t0) * 1000
        return ProbeResult(False, None, latency, error=f"no answer within {timeout_s:g} s")
    except OSError as exc:  # UpstreamUnreachable / UpstreamBroken: the client error's name
        latency = (time.perf_counter() - t0) * 1000
        return ProbeResult(False, None, latency, error=f"cannot reach the upstream ({exc})")
    latency = (time.perf_counter() - t0) * 1000
    snap = parse_rate_limit_headers(resp.headers, now_ms)
    if resp.status >= 400:
        return ProbeResult(
            False, resp.status, latency, rate_limit=snap, error=_error_text(raw, conn.secret)
        )
    try:
        models = _model_ids(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return ProbeResult(False, resp.status, latency, error="the answer is not JSON")
    return ProbeResult(True, resp.status, latency, models, snap)
