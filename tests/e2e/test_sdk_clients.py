"""The official openai and anthropic SDKs, pointed at the gateway, work unchanged — in each
direction of translation (OpenAI client → Anthropic connection, Anthropic client → OpenAI one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from e2e_support import ADMIN_KEY, Proc, gateway_config, module_gateway

SECRET = "fg-test-sdk-client-key-000000000001"


@pytest.fixture(scope="module")
def gateway(mock_upstream: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir: Path = tmp_path_factory.mktemp("sdk")
    pools = (
        "pools:\n"
        "  - {id: p1, name: P1, connections: [mock-1], allocations: [{key: sdk, weight: 100}],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 1000},\n"
        "                  {unit: tokens, window: hourly, limit: 1000000}]}\n"
    )
    yield from module_gateway(workdir, gateway_config(mock_upstream.url, pools, {"sdk": SECRET}))


def oai(gw: Proc, key: str = SECRET) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def streamed_chunks(
    client: openai.OpenAI, model: str, content: str, *, include_usage: bool = False
) -> list[Any]:
    """Every chunk of one streamed Chat Completions request of one user message; with
    ``include_usage`` the client asks for the usage chunk (``stream_options``), else it does
    not send ``stream_options`` at all."""
    messages: list[Any] = [{"role": "user", "content": content}]
    if include_usage:
        return list(
            client.chat.completions.create(
                model=model,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    return list(client.chat.completions.create(model=model, messages=messages, stream=True))


def ant(gw: Proc, key: str = SECRET) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def streamed(
    client: anthropic.Anthropic, model: str, max_tokens: int, content: str
) -> tuple[str, int]:
    """One user message streamed through the SDK's ``messages.stream``: the text it read and the
    output tokens its final message reports."""
    with client.messages.stream(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": content}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    return text, final.usage.output_tokens


def test_openai_chat_to_openai_connection(gateway: Proc) -> None:
    with oai(gateway) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=8,
        )
        resp = raw.parse()
    assert resp.choices[0].message.content
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 8
    assert raw.headers["x-fairgate-connection"] in ("mock-1", "mock-2")
    assert float(raw.headers["x-fairgate-overhead-ms"]) >= 0
    assert "x-ratelimit-remaining-requests" in raw.headers


def test_openai_stream_without_and_with_usage(gateway: Proc) -> None:
    with oai(gateway) as client:
        chunks = streamed_chunks(client, "gpt-4o-mini", "stream please")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        # the gateway asked upstream for usage; the client did not, so it must not see it
        assert all(c.usage is None for c in chunks)
        chunks = streamed_chunks(client, "gpt-4o-mini", "stream please", include_usage=True)
        usage = [c.usage for c in chunks if c.usage is not None]
        assert len(usage) == 1
        assert usage[0].completion_tokens > 0


def test_openai_embeddings_and_models(gateway: Proc) -> None:
    with oai(gateway) as client:
        emb = client.embeddings.create(model="gpt-4o-mini", input=["a", "b"])
        assert len(emb.data) == 2
        assert len(emb.data[0].embedding) > 0
        ids = {m.id for m in client.models.list()}
    assert "mock/gpt-4o-mini" in ids
    assert "anthropic/claude-sonnet-4" in ids


def test_openai_client_to_anthropic_connection(gateway: Proc) -> None:
    with oai(gateway) as client:
        resp = client.chat.completions.create(
            model="claude-sonnet-4",
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi claude"},
            ],
            max_tokens=6,
        )
        assert resp.choices[0].message.content
        assert resp.choices[0].finish_reason in ("stop", "length")
        assert resp.usage is not None
        assert resp.usage.completion_tokens == 6
        chunks = streamed_chunks(client, "anthropic/claude-sonnet-4", "hi", include_usage=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert any(c.usage is not None and c.usage.completion_tokens > 0 for c in chunks)


def test_anthropic_messages_to_anthropic_connection(gateway: Proc) -> None:
    with ant(gateway) as client:
        msg = client.messages.create(
            model="claude-sonnet-4", max_tokens=5, messages=[{"role": "user", "content": "hey"}]
        )
        assert msg.content[0].type == "text"
        assert msg.usage.output_tokens == 5
        text, output_tokens = streamed(client, "claude-sonnet-4", 7, "hey")
    assert text
    assert output_tokens == 7


def test_anthropic_count_tokens_through_the_gateway(gateway: Proc) -> None:
    """The SDK's ``messages.count_tokens`` (Claude Code's ``/context``): counted by the mock's
    Anthropic wire behind the gateway, and by the gateway's estimate for an OpenAI-only model."""
    messages: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": "count these words please"}
    ]
    with ant(gateway) as client:
        raw = client.messages.with_raw_response.count_tokens(
            model="claude-sonnet-4", messages=messages
        )
        assert raw.headers["x-fairgate-token-count"] == "upstream"
        assert raw.parse().input_tokens > 0
        raw = client.messages.with_raw_response.count_tokens(model="gpt-4o-mini", messages=messages)
        assert raw.headers["x-fairgate-token-count"] == "estimate"
        assert raw.parse().input_tokens > 0


def test_anthropic_client_to_openai_connection(gateway: Proc) -> None:
    with ant(gateway) as client:
        msg = client.messages.create(
            model="gpt-4o-mini",
            max_tokens=4,
            system="short answers",
            messages=[{"role": "user", "content": "hey gpt"}],
        )
        assert msg.content[0].type == "text"
        assert msg.usage.output_tokens == 4
        text, output_tokens = streamed(client, "mock/gpt-4o-mini", 9, "x")
    assert text
    assert output_tokens == 9


def test_missing_and_wrong_keys_are_401_and_never_reach_upstream(
    gateway: Proc, mock_upstream: Proc
) -> None:
    before = httpx.get(mock_upstream.url + "/_mock/stats").json()["requests"]
    with oai(gateway, key="fg-wrong") as client, pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "gpt-4o-mini"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
    with ant(gateway, key="fg-wrong") as client, pytest.raises(anthropic.AuthenticationError):
        client.messages.create(
            model="claude-sonnet-4", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    after = httpx.get(mock_upstream.url + "/_mock/stats").json()["requests"]
    assert after == before


def test_bad_bodies_get_clear_errors(gateway: Proc) -> None:
    h = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"}
    url = gateway.url + "/v1/chat/completions"
    r = httpx.post(url, content=b"{not json", headers=h)
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]
    r = httpx.post(url, json={"model": "gpt-4o-mini", "messages": "nope"}, headers=h)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages")
    r = httpx.post(url, json={"model": 5, "messages": []}, headers=h)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "model")
    r = httpx.post(url, json={"model": "no-such-model", "messages": [{"role": "user"}]}, headers=h)
    assert r.status_code == 404
    big = (
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "'
        + b"x" * (11 * 1024 * 1024)
        + b'"}]}'
    )
    r = httpx.post(url, content=big, headers=h)
    assert r.status_code == 413
    r = httpx.get(gateway.url + "/api/quota/pools", headers={"Authorization": f"Bearer {SECRET}"})
    assert r.status_code == 403  # a client key is not an admin key: forbidden
    r = httpx.get(
        gateway.url + "/api/quota/pools", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert r.status_code == 200
