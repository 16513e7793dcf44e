"""The compression rule and the window catalogue of a combo's context fit (issue 46)."""

from __future__ import annotations

from typing import Any

from fairgate.path.context_fit import compress_messages, window_of
from fairgate.providers.context_windows import context_window


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_the_catalogue_matches_the_longest_prefix() -> None:
    assert context_window("gpt-4o-mini-2024-07-18") == 128_000
    assert context_window("gpt-4-0613") == 8_192
    assert context_window("openai/gpt-4.1-mini") == 1_047_576
    assert context_window("claude-sonnet-4-20250514") == 200_000
    assert context_window("my-local-model") is None
    assert window_of(4096, "gpt-4o") == 4096  # a configured window wins


def test_anthropic_tool_results_stay_with_their_call() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "42"}
    body = {
        "system": "be brief",
        "messages": [
            user("a"),
            {"role": "assistant", "content": "b"},
            user("c"),
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": "d"},
        ],
    }
    out = compress_messages(body, 2)
    assert out is not None
    fitted, dropped = out
    # the last two would begin at the tool result's reply; it moves back to the user turn
    # before the tool call
    assert fitted["messages"] == body["messages"][2:]
    assert dropped == 2
    assert fitted["system"] == "be brief"


def test_nothing_to_drop_is_no_compression() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, user("a")]}
    assert compress_messages(body, 5) is None
