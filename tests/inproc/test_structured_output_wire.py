"""Structured output reaches every upstream wire in its own form (issue 42, item 3).

Before, ``response_format: json_schema`` (what the openai SDK's ``.parse`` sends) was dropped
on the way to an Anthropic or Responses upstream, and ``text.format`` (``responses.parse``)
on the way to an Anthropic one: the answer was free text and the SDK's parse failed. Now the
schema goes as chat ``response_format``, the Responses API's ``text.format`` or Anthropic's
``output_config.format``, and the official SDK parses the answer.

The gateway runs in-process; the provider is the real mock (:mod:`fairgate.mock.server`)
on a loopback port, which answers a schema with JSON that fits it, as the providers do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from inproc_support import ALICE, Harness, base_config, conn, gateway
from pydantic import BaseModel

from fairgate.mock.server import MockUpstream
from fairgate.providers.inprocess import Reply, UpstreamRequest
from fairgate.timers import ManualTimer

#: model → (connection, its wire)
MODELS = {"claude-x": "anthropic", "gpt-5": "responses", "gpt-4o": "openai"}


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[tuple[Harness, MockUpstream]]:
    async with MockUpstream() as up, httpx.AsyncClient() as http:

        async def handler(req: UpstreamRequest) -> Reply:
            headers = {
                k: v for k, v in req.headers.items() if k.lower() not in ("host", "content-length")
            }
            r = await http.post(f"{up.url}/v1{req.path}", content=req.body, headers=headers)
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                return Reply(r.status_code, headers=dict(r.headers), chunks=[r.content])
            return Reply(r.status_code, r.content, headers=dict(r.headers))

        conns = [
            conn("c-anthropic", "anthropic", models=("claude-x",)),
            conn("c-responses", "openai", models=("gpt-5",), protocol="responses"),
            conn("c-openai", "openai", models=("gpt-4o",)),
        ]
        async with gateway(tmp_path, base_config(conns), ManualTimer(), handler) as h:
            yield h, up


def _client(h: Harness) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://gw/v1", api_key=ALICE, http_client=h.client, max_retries=0
    )


@pytest.mark.parametrize("model", sorted(MODELS))
async def test_chat_parse_gets_schema_json_from_every_wire(
    harness: tuple[Harness, MockUpstream], model: str
) -> None:
    h, _up = harness
    done = await _client(h).chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Who is it?"}],
        response_format=Person,
    )
    assert done.choices[0].message.parsed == Person(name="mock", age=1)
    assert h.sent_to[-1] == f"c-{MODELS[model]}"


@pytest.mark.parametrize("model", sorted(MODELS))
async def test_responses_parse_gets_schema_json_from_every_wire(
    harness: tuple[Harness, MockUpstream], model: str
) -> None:
    h, _up = harness
    done = await _client(h).responses.parse(model=model, input="Who is it?", text_format=Person)
    assert done.output_parsed == Person(name="mock", age=1)
    sent: dict[str, Any] = h.upstream.requests[-1].json()
    if MODELS[model] == "anthropic":
        assert sent["output_config"]["format"]["type"] == "json_schema"
    elif MODELS[model] == "responses":
        assert sent["text"]["format"]["name"] == "Person"  # passed as it is
    else:
        assert sent["response_format"]["json_schema"]["name"] == "Person"


async def test_json_mode_to_anthropic_is_a_400_naming_the_field(
    harness: tuple[Harness, MockUpstream],
) -> None:
    h, _up = harness
    with pytest.raises(openai.BadRequestError) as exc:
        await _client(h).chat.completions.create(
            model="claude-x",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
        )
    assert exc.value.body["param"] == "response_format"  # type: ignore[index]
    assert h.upstream.requests == []  # nothing was sent, nothing charged
