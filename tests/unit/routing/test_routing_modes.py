"""Fusion and pipeline as data and pure helpers (fairgate.routing.modes)."""

from __future__ import annotations

from fairgate.routing.combo import Combo
from fairgate.routing.model import ComboConfig, Target
from fairgate.routing.modes import (
    DEFAULT_STEP_PROMPT,
    FusionPlan,
    PanelAnswer,
    PipelinePlan,
    answer_text,
    decide_fusion,
    judge_messages,
    mode_of,
    step_messages,
)

A = Target("openai", "gpt-4o")
B = Target("anthropic", "claude-sonnet-4")
J = Target("openai", "o3")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]


def test_mode_of() -> None:
    assert mode_of("fusion") == "fusion"
    assert mode_of("pipeline") == "pipeline"
    assert mode_of("priority") == "fallback"


def test_fusion_plan_judge_defaults_to_the_first_target() -> None:
    combo = Combo("f", "fusion", (A, B))
    assert FusionPlan.from_combo(combo) == FusionPlan(panel=(A, B), judge=A)
    judged = Combo("f", "fusion", (A, B), ComboConfig(judge=J))
    assert FusionPlan.from_combo(judged).judge == J


def test_fusion_outcomes() -> None:
    ok_a = PanelAnswer(A, content="4")
    ok_b = PanelAnswer(B, content="four")
    failed = PanelAnswer(B, error="timeout")
    empty = PanelAnswer(B, content="  ")
    assert decide_fusion([failed, empty]).action == "fail"
    assert decide_fusion([failed, empty]).fallback is None
    single = decide_fusion([ok_a, failed])
    assert single.action == "single"
    assert single.fallback == ok_a
    both = decide_fusion([ok_a, failed, ok_b])
    assert both.action == "judge"
    assert both.answers == (ok_a, ok_b)


def test_judge_messages_keep_the_conversation_and_list_the_answers_anonymously() -> None:
    msgs = judge_messages(CHAT, [PanelAnswer(A, content="4"), PanelAnswer(B, content="four")])
    assert msgs[:2] == CHAT
    assert msgs[2]["role"] == "user"
    body = msgs[2]["content"]
    assert '<answer n="1">\n4\n</answer>' in body
    assert '<answer n="2">\nfour\n</answer>' in body
    assert "gpt-4o" not in body
    assert "claude" not in body
    assert CHAT[1] == {"role": "user", "content": "2+2?"}  # input untouched


def test_pipeline_steps_feed_each_other() -> None:
    combo = Combo(
        "p", "pipeline", (A, B, J), ComboConfig(options={"step_prompts": [None, "Critique it."]})
    )
    plan = PipelinePlan.from_combo(combo)
    assert [s.target for s in plan.steps] == [A, B, J]
    assert [s.prompt for s in plan.steps] == [None, "Critique it.", None]
    first = step_messages(CHAT, plan.steps[0], None)
    assert first == CHAT
    second = step_messages(CHAT, plan.steps[1], "draft")
    assert second[-2:] == [
        {"role": "assistant", "content": "draft"},
        {"role": "user", "content": "Critique it."},
    ]
    third = step_messages(CHAT, plan.steps[2], "critique")
    assert third[-1] == {"role": "user", "content": DEFAULT_STEP_PROMPT}


def test_answer_text() -> None:
    assert answer_text({"choices": [{"message": {"content": "hi"}}]}) == "hi"
    parts = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"text": "b"}]}}]}
    assert answer_text(parts) == "ab"
    assert answer_text({"choices": []}) is None
    assert answer_text({"error": {"message": "x"}}) is None
    assert answer_text({"choices": [{"message": {"content": None}}]}) is None
