"""OpenTelemetry spans of the request path, read from the SDK's in-memory exporter: a gateway
served for real (uvicorn on loopback) over the in-process mock upstream, driven with httpx.

A request is one ``fairgate.request`` span; its admission, each upstream attempt and the
settlement are its children (the settlement too, although it runs after the answer has gone);
the attributes name the key id, pool, connection and outcome, and never a secret."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from http_support import gateway_client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fairgate.config import load_config_text
from fairgate.mock.server import MockConfig, MockUpstream
from fairgate.process import tracing
from fairgate.process.settings import Settings
from fairgate.process.state import Gateway

UP = "sk-upstream-tracing-0123456789"
ALICE = "fg-alice-tracing-secret-0123456789"


def config_yaml(mock_url: str) -> str:
    base = f"base_url: '{mock_url}/v1', secret: '{UP}', models: [gpt-4o-mini]"
    return (
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: p-1, provider: mock, {base}}}\n"
        f"  - {{id: p-2, provider: mock, {base}}}\n"
        f"keys:\n  - {{id: alice, secret: '{ALICE}'}}\n"
        "pools:\n"
        "  - id: shared\n"
        "    connections: [p-1, p-2]\n"
        "    dimensions: [{unit: requests, window: hourly, limit: 1000}]\n"
        "    allocations: [{key: alice, weight: 100}]\n"
        "combos:\n"
        "  - {name: fast, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: p-1},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: p-2}]}\n"
    )


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracing.use_tracer_provider(provider)
    yield exp
    tracing.use_tracer_provider(None)
    provider.shutdown()


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, MockUpstream]]:
    mock = MockUpstream(MockConfig(secret=UP))
    await mock.start()
    gw = Gateway(data_dir=tmp_path, config=load_config_text(config_yaml(mock.url), env={}), env={})
    try:
        async with gateway_client(gw) as (_, client):
            yield client, mock
    finally:
        await mock.stop()


async def chat(client: httpx.AsyncClient, model: str) -> httpx.Response:
    r = await client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers={"Authorization": f"Bearer {ALICE}"},
    )
    assert r.status_code == 200, r.text
    return r


async def finished(exp: InMemorySpanExporter, n_settles: int) -> list[ReadableSpan]:
    """The spans, once the settlements (background tasks after the answer) have ended."""
    for _ in range(500):
        spans = list(exp.get_finished_spans())
        if sum(s.name == "fairgate.settle" for s in spans) >= n_settles:
            return spans
        await asyncio.sleep(0.01)
    raise AssertionError([s.name for s in exp.get_finished_spans()])


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def no_secret(spans: list[ReadableSpan]) -> None:
    for s in spans:
        for v in attrs(s).values():
            assert ALICE not in str(v)
            assert UP not in str(v)


async def test_a_request_is_a_span_with_admission_attempt_and_settle_children(
    exporter: InMemorySpanExporter, gateway: tuple[httpx.AsyncClient, MockUpstream]
) -> None:
    client, _ = gateway
    await chat(client, "gpt-4o-mini")
    spans = await finished(exporter, 1)
    (root,) = [s for s in spans if s.name == "fairgate.request"]
    assert root.parent is None
    assert attrs(root)["fairgate.key_id"] == "alice"
    assert attrs(root)["fairgate.pool"] == "shared"
    assert attrs(root)["http.response.status_code"] == 200
    assert attrs(root)["fairgate.outcome"] == "ok"
    trace_id = root.context.trace_id
    by_name = {s.name: s for s in spans}
    for name in ("fairgate.admission", "fairgate.attempt", "fairgate.settle"):
        child = by_name[name]
        assert child.context.trace_id == trace_id, name
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id, name
    adm = attrs(by_name["fairgate.admission"])
    assert (adm["fairgate.outcome"], adm["fairgate.pool"]) == ("allow", "shared")
    attempt = attrs(by_name["fairgate.attempt"])
    assert attempt["fairgate.outcome"] == "ok"
    assert attempt["fairgate.connection"] in ("p-1", "p-2")
    assert attempt["fairgate.connection"] == attrs(root)["fairgate.connection"]
    settle = attrs(by_name["fairgate.settle"])
    assert settle["fairgate.key_id"] == "alice"
    assert settle["fairgate.tokens"] > 0
    no_secret(spans)


async def test_each_upstream_attempt_of_a_fallback_is_its_own_span(
    exporter: InMemorySpanExporter, gateway: tuple[httpx.AsyncClient, MockUpstream]
) -> None:
    client, mock = gateway
    async with httpx.AsyncClient() as c:
        await c.post(mock.url + "/_mock/schedule", json={"faults": ["429:600"]})
    await chat(client, "fast")
    spans = await finished(exporter, 1)
    attempts = sorted(
        (s for s in spans if s.name == "fairgate.attempt"), key=lambda s: s.start_time or 0
    )
    assert [attrs(s)["fairgate.outcome"] for s in attempts] == ["rate_limit", "ok"]
    assert [attrs(s)["fairgate.connection"] for s in attempts] == ["p-1", "p-2"]
    assert all(attrs(s)["fairgate.combo"] == "fast" for s in attempts)
    (root,) = [s for s in spans if s.name == "fairgate.request"]
    assert {s.parent.span_id for s in attempts if s.parent} == {root.context.span_id}
    no_secret(spans)


async def test_a_callers_traceparent_is_continued(
    exporter: InMemorySpanExporter, gateway: tuple[httpx.AsyncClient, MockUpstream]
) -> None:
    """Issue 48, item 7: the request's span is the caller's span's child, in its trace (it
    began a new trace), and the admission, attempt and settlement follow it there."""
    client, _ = gateway
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        headers={
            "Authorization": f"Bearer {ALICE}",
            "traceparent": f"00-{trace_id}-{span_id}-01",
            "tracestate": "vendor=x",
        },
    )
    assert r.status_code == 200, r.text
    spans = await finished(exporter, 1)
    (root,) = [s for s in spans if s.name == "fairgate.request"]
    assert format(root.context.trace_id, "032x") == trace_id
    assert root.parent is not None
    assert format(root.parent.span_id, "016x") == span_id
    assert root.parent.is_remote
    assert root.kind.name == "SERVER"
    assert root.context.trace_state.get("vendor") == "x"
    assert {format(s.context.trace_id, "032x") for s in spans} == {trace_id}


def test_the_sdks_variables_choose_the_exporters() -> None:
    def plan(env: dict[str, str]) -> tracing.TracingPlan:
        return tracing.plan_of(Settings.load(env).tracing)

    assert plan({}).exporters == ()
    assert plan({"OTEL_TRACES_EXPORTER": "console"}).exporters == ("console",)
    assert plan({"OTEL_TRACES_EXPORTER": " Console , otlp "}).exporters == ("console", "otlp")
    assert plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).exporters == ("otlp",)
    assert plan({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}).exporters == (
        "otlp",
    )
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert plan({**endpoint, "OTEL_TRACES_EXPORTER": "none"}).exporters == ()
    assert plan({**endpoint, "OTEL_SDK_DISABLED": "true"}).exporters == ()
    assert plan({**endpoint, "OTEL_TRACES_EXPORTER": "console"}).exporters == ("console",)
    zipkin = plan({"OTEL_TRACES_EXPORTER": "zipkin,console"})
    assert zipkin.exporters == ("console",)
    (warning,) = zipkin.warnings
    assert "'zipkin' is not supported" in warning
    grpc = plan({**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc.exporters == ("otlp",)
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported" in grpc.warnings[0]


async def test_the_console_exporter_prints_the_spans(
    gateway: tuple[httpx.AsyncClient, MockUpstream],
) -> None:
    """``OTEL_TRACES_EXPORTER=console`` was ignored (nothing traced without an OTLP endpoint)."""
    client, _ = gateway
    out = io.StringIO()
    try:
        assert tracing.configure(
            Settings.load({"OTEL_TRACES_EXPORTER": "console"}).tracing, console=out
        )
        await chat(client, "gpt-4o-mini")
        for _ in range(500):  # the settlement runs after the answer
            if tracing._STATE.provider is not None and '"fairgate.settle"' in out.getvalue():
                break
            tracing._STATE.provider.force_flush()
            await asyncio.sleep(0.01)
    finally:
        tracing.shutdown()
    printed = out.getvalue()
    for name in ("fairgate.request", "fairgate.admission", "fairgate.attempt", "fairgate.settle"):
        assert f'"name": "{name}"' in printed, name
    assert '"fairgate.key_id": "alice"' in printed
    assert ALICE not in printed


def test_tracing_is_off_without_an_endpoint() -> None:
    assert tracing.configure(Settings.load({}).tracing) is False
    assert tracing.configure(Settings.load({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}).tracing) is False


def test_an_endpoint_switches_it_on_and_shutdown_off() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SERVICE_NAME": "gw-test"}
    try:
        assert tracing.configure(Settings.load(env).tracing) is True
        provider = tracing._STATE.provider
        assert provider is not None
        assert provider.resource.attributes["service.name"] == "gw-test"
    finally:
        tracing.shutdown()
    assert tracing._STATE.tracer is None
