"""What Claude Code and the Codex CLI need of the request path (issue 42, items 4, 7, 8): their
default model names caught by model aliases, Codex's hosted tools left out and named, and a
quota block told in the shape each client prints, with fairgate's reason and the wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from inproc_support import ADMIN, ALICE, BOB, base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, anthropic_message, openai_chat
from fairgate.timers import ManualTimer

ANT = {"x-api-key": ALICE, "anthropic-version": "2023-06-01"}


def _config(**extra: Any) -> dict[str, Any]:
    cfg = base_config(
        [
            conn("chat", models=("gpt-4o-mini",)),
            conn("ant", "anthropic", models=("claude-sonnet-4",)),
            conn("tiny", models=("tiny",)),
        ],
        pools=[
            {
                "id": "p",
                "connections": ["tiny"],
                "dimensions": [{"unit": "requests", "window": "hourly", "limit": 1}],
                "allocations": [{"key": "bob", "weight": 100}],
            }
        ],
    )
    cfg["model_aliases"] = [
        {"pattern": "claude-*", "target": "claude-sonnet-4"},
        {"pattern": "gpt-*", "target": "gpt-4o-mini"},
    ]
    cfg.update(extra)
    return cfg


async def _handler(req: UpstreamRequest) -> Reply:
    body = req.json()
    if req.conn.id == "ant":
        return anthropic_message("hi", model=body["model"])
    return openai_chat("hi", model=body["model"])


async def test_default_model_names_reach_the_alias_targets(tmp_path: Path) -> None:
    async with gateway(tmp_path, _config(), ManualTimer(), _handler) as h:
        r = await h.messages("claude-opus-5-5", 5, text="x")
        assert r.status_code == 200, r.text
        r = await h.chat("gpt-6.2-sol")
        assert r.status_code == 200, r.text
        r = await h.chat("gpt-4o-mini")  # a listed name is never aliased
        assert r.status_code == 200, r.text
        r = await h.chat("llama-3")  # no alias catches it
        assert r.status_code == 404
    sent = [(q.conn.id, q.json()["model"]) for q in h.upstream.requests]
    assert sent == [
        ("ant", "claude-sonnet-4"),
        ("chat", "gpt-4o-mini"),
        ("chat", "gpt-4o-mini"),
    ]


async def test_a_key_with_an_allow_list_may_use_an_alias_of_an_allowed_target(
    tmp_path: Path,
) -> None:
    cfg = _config()
    cfg["keys"][0]["allowed_models"] = ["gpt-4o-mini"]
    async with gateway(tmp_path, cfg, ManualTimer(), _handler) as h:
        assert (await h.chat("gpt-5.5")).status_code == 200
        r = await h.chat("claude-opus-5-5")
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "model_not_allowed"


async def test_codex_hosted_tools_are_left_out_and_named(tmp_path: Path) -> None:
    tools = [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        {"type": "web_search"},
        {"type": "custom", "name": "apply_patch"},
    ]
    async with gateway(tmp_path, _config(), ManualTimer(), _handler) as h:
        r = await h.client.post(
            "/v1/responses",
            json={"model": "gpt-6.2-sol", "input": "hi", "tools": tools},
            headers={"authorization": f"Bearer {ALICE}"},
        )
        # the same on the way to an Anthropic upstream, a stream this time (the header is set
        # per attempt, by the connection's wire)
        streamed = await h.client.post(
            "/v1/responses",
            json={"model": "claude-opus-5-5", "input": "hi", "tools": tools, "stream": True},
            headers={"authorization": f"Bearer {ALICE}"},
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-fairgate-tools-omitted"] == "web_search"
    sent = h.upstream.requests[0].json()
    assert [t["function"]["name"] for t in sent["tools"]] == ["exec_command", "apply_patch"]
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["x-fairgate-tools-omitted"] == "web_search"
    to_anthropic = h.upstream.requests[1].json()
    assert [t["name"] for t in to_anthropic["tools"]] == ["exec_command", "apply_patch"]


async def _block(h: Any) -> None:
    """Spend the tiny pool's one request of the hour."""
    assert (await h.chat("tiny", key=BOB)).status_code == 200


async def test_claude_code_sees_the_reason_and_the_wait_in_the_message(tmp_path: Path) -> None:
    async with gateway(tmp_path, _config(), ManualTimer(), _handler) as h:
        await _block(h)
        r = await h.client.post(
            "/v1/messages",
            json={"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            headers={**ANT, "x-api-key": BOB},
        )
    assert r.status_code == 429
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error"
    retry = r.headers["retry-after"]
    assert err["message"].endswith(f"; retry in {retry} s")
    assert "quota window is saturated" in err["message"]


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: ")]


async def test_codex_sees_response_failed_with_the_reason_other_clients_the_429(
    tmp_path: Path,
) -> None:
    body = {"model": "tiny", "input": "hi", "stream": True}
    auth = {"authorization": f"Bearer {BOB}"}
    async with gateway(tmp_path, _config(), ManualTimer(), _handler) as h:
        await _block(h)
        codex = await h.client.post(
            "/v1/responses", json=body, headers={**auth, "originator": "codex_exec"}
        )
        sdk = await h.client.post("/v1/responses", json=body, headers=auth)
    assert sdk.status_code == 429  # an SDK keeps the HTTP error it raises RateLimitError on
    assert codex.status_code == 200
    events = _events(codex.content)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    error = events[-1]["response"]["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert "quota window is saturated" in error["message"]
    assert error["message"].endswith(f"; retry after {codex.headers['retry-after']} s")


async def test_aliases_set_through_the_admin_api_win_over_the_file_until_deleted(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, _config(), ManualTimer(), _handler) as h:
        r = await h.client.get("/api/model-aliases", headers=ADMIN)
        assert r.json()["source"] == "config"
        assert r.json()["aliases"][0] == {"pattern": "claude-*", "target": "claude-sonnet-4"}
        new = {"aliases": [{"pattern": "gpt-*", "target": "claude-sonnet-4"}]}
        r = await h.client.put("/api/model-aliases", json=new, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json() == {**new, "source": "db"}
        assert (await h.chat("gpt-6.2-sol")).status_code == 200
        assert (await h.chat("claude-opus-5-5")).status_code == 404  # the file's is replaced
        bad = {"aliases": [{"pattern": "gpt-*", "target": "x*"}]}
        r = await h.client.put("/api/model-aliases", json=bad, headers=ADMIN)
        assert r.status_code in (400, 422)
        assert "target" in r.text
        r = await h.client.delete("/api/model-aliases", headers=ADMIN)
        assert r.status_code == 204
        assert (await h.client.get("/api/model-aliases", headers=ADMIN)).json()[
            "source"
        ] == "config"
        assert (await h.chat("gpt-6.2-sol")).status_code == 200
    assert [q.conn.id for q in h.upstream.requests] == ["ant", "chat"]
