"""The combo pipeline's target-loop checks of issue 46 over the wire: one gateway process in
front of the mock upstream, six connections to it (``a``, ``c`` and ``f`` take the test's
``x-mock-fault`` header, the others never do), one combo per check, each with mock targets
shaped to trigger it: a slow first token, a reasoning-only answer, a long conversation and a
small-window fallback, a schema violation, a target whose window resets sooner. The behaviour
in detail is tested in-process (``tests/inproc/test_combo_pipeline_inproc.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from e2e_support import (
    FAULTS,
    UPSTREAM_SECRET,
    Proc,
    logged_diagnostics,
    mock_upstream,
    module_gateway,
    new_secret,
)

__all__ = ["mock_upstream"]  # the module-scoped mock fixture

SECRET = new_secret()
A = "{provider: mock, model: gpt-4o-mini, connection: a}"
B = "{provider: mock, model: gpt-4o-mini, connection: b}"
#: the context test's failing first target: its own connection, so that its 500's cooldown
#: touches no other test's combo
C = "{provider: mock, model: gpt-4o-mini, connection: c}"
#: auto's two targets, each in a pool of its own (a daily and an hourly window) and used by no
#: other test, so that nothing but their windows tells them apart
D = "{provider: mock, model: gpt-4o-mini, connection: d}"
E = "{provider: mock, model: gpt-4o-mini, connection: e}"
#: the validation test's second target: it takes the fault header too, so both targets break
#: the schema
F = "{provider: mock, model: gpt-4o-mini, connection: f}"
SMALL_B = "{provider: mock, model: gpt-4o-mini, connection: b, contextWindow: 1000}"


def config(mock: str) -> str:
    conn = "provider: mock, base_url: '{}/v1', secret: '{}', models: [gpt-4o-mini]"
    base = conn.format(mock, UPSTREAM_SECRET)
    pool = (
        "  - {{id: {pid}, name: {pid}, connections: [{cid}],"
        " dimensions: [{{unit: requests, window: {window}, limit: 1000000}}],"
        " allocations: [{{key: k, weight: 100}}]}}\n"
    )
    return (
        "connections:\n"
        f"  - {{id: a, {base}{FAULTS}}}\n"
        f"  - {{id: b, {base}}}\n"
        f"  - {{id: c, {base}{FAULTS}}}\n"
        f"  - {{id: d, {base}}}\n"
        f"  - {{id: e, {base}}}\n"
        f"  - {{id: f, {base}{FAULTS}}}\n"
        f"keys:\n  - {{id: k, name: k, secret: '{SECRET}', allowed_providers: [mock]}}\n"
        "pools:\n"
        + pool.format(pid="daily", cid="d", window="daily")
        + pool.format(pid="hourly", cid="e", window="hourly")
        + "combos:\n"
        f"  - {{name: hedged, targets: [{A}, {B}], config: {{predictiveTtftMs: 300}}}}\n"
        f"  - {{name: thinking, targets: [{A}, {B}], config: {{reasoningBuffer: true}}}}\n"
        f"  - {{name: fitted, targets: [{C}, {SMALL_B}],"
        " config: {maxRetries: 0, maxWaitMs: 0, contextCompression: {keepLastTurns: 2}}}\n"
        f"  - {{name: checked, targets: [{A}, {F}],"
        " config: {maxRetries: 0, maxWaitMs: 0, responseValidation: {jsonSchema: true}}}\n"
        f"  - {{name: chooser, strategy: auto, targets: [{D}, {E}],"
        " config: {options: {exploration: 0}}}\n"
    )


@pytest.fixture(scope="module")
def gw(mock_upstream: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    yield from module_gateway(tmp_path_factory.mktemp("combo-pipeline"), config(mock_upstream.url))


def chat(gw: Proc, model: str, fault: str | None = None, **body: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {SECRET}"}
    if fault:
        headers["x-mock-fault"] = fault
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(gw.url + "/v1/chat/completions", json=payload, headers=headers, timeout=60)


def deltas(r: httpx.Response, field: str) -> str:
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for c in orjson.loads(line[6:]).get("choices", []):
                out.append(c["delta"].get(field) or "")
    return "".join(out)


def test_a_slow_first_token_is_hedged(gw: Proc) -> None:
    # a's first token would come 30 s late: the hedge to b answers long before
    r = chat(gw, "hedged", "slow-first-token:30000", stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["x-fairgate-connection"] == "b"
    assert r.headers["x-fairgate-hedged"] == "won"
    assert deltas(r, "content").startswith("mock reply")
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'fairgate_combo_hedges_total{combo="hedged",outcome="won"} 1.0' in metrics


def test_a_reasoning_only_answer_fails_over_before_the_client_sees_it(gw: Proc) -> None:
    r = chat(gw, "thinking", "reasoning-only", stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["x-fairgate-connection"] == "b"
    assert deltas(r, "reasoning_content") == ""  # nothing of a's reasoning was sent
    assert deltas(r, "content").startswith("mock reply")


def test_a_long_conversation_is_compressed_for_the_small_window(gw: Proc) -> None:
    filler = "lorem ipsum dolor sit amet " * 60
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(8):
        messages += [
            {"role": "user", "content": f"turn {i} {filler}"},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    messages.append({"role": "user", "content": "the last question"})
    r = chat(gw, "fitted", "500", messages=messages, max_tokens=50)
    assert r.status_code == 200, r.text
    assert r.headers["x-fairgate-connection"] == "b"
    # the last two messages would begin at an assistant turn: the kept tail begins at the user
    # turn before it (three kept of seventeen)
    assert r.headers["x-fairgate-context-compressed"] == "dropped=14"
    assert "last question" in r.json()["choices"][0]["message"]["content"]


def test_a_schema_violation_fails_over_and_names_the_check(gw: Proc) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    # the mock answers prose instead of the JSON the schema asks for: both targets fail it
    r = chat(gw, "checked", "off-schema", response_format=fmt)
    assert r.status_code == 502, r.text
    assert "response validation" in r.json()["diagnostics"]["recoveryHint"]["action"]
    full = logged_diagnostics(gw)[-1]
    assert [a["outcome"] for a in full["attempted"]] == ["validation", "validation"]
    assert [a["target"].rsplit("@", 1)[1] for a in full["attempted"]] == ["a", "f"]


def test_auto_prefers_the_target_whose_window_resets_sooner(gw: Proc) -> None:
    r = chat(gw, "chooser")
    assert r.status_code == 200, r.text
    assert r.headers["x-fairgate-connection"] == "e"  # the hourly pool resets before the daily
