"""OpenTelemetry across processes (issue 48, item 7): a gateway process started with
``OTEL_TRACES_EXPORTER=console`` (the SDK's own variable; it was silently ignored) prints its
spans on standard output, and a client's W3C ``traceparent`` is continued: the request's span
is in the caller's trace, the caller's span its parent."""

from __future__ import annotations

import re

import httpx
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_console_spans_continue_the_callers_trace(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    alice = new_secret()
    gw = start_gateway(
        gateway_config(mock_upstream.url, keys={"alice": alice}),
        extra_env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "gw-e2e"},
    )
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={
            "authorization": f"Bearer {alice}",
            "traceparent": f"00-{TRACE_ID}-{PARENT}-01",
        },
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    gw.stop()  # SIGTERM: the graceful shutdown flushes the batch processor
    out = gw.output()
    names = re.findall(r'"name": "(fairgate\.[a-z]+)"', out)
    assert {"fairgate.request", "fairgate.admission", "fairgate.attempt"} <= set(names), out
    request = out[out.index('"name": "fairgate.request"') :]
    assert f'"trace_id": "0x{TRACE_ID}"' in request.split('"name":')[1]
    assert f'"parent_id": "0x{PARENT}"' in request.split('"name":')[1]
    assert '"service.name": "gw-e2e"' in out
    assert set(re.findall(r'"trace_id": "0x([0-9a-f]+)"', out)) == {TRACE_ID}
    assert alice not in out
