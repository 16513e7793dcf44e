"""Fusion and pipeline, the two strategies that are execution modes, as plain data and pure
helpers. The pipeline module does the HTTP; this one decides what to send and what to do with
the answers.

**Fusion** asks every panel target the same request in parallel, then a *judge* target merges
the answers into one. Outcomes (:func:`decide_fusion`): no answer → the combo fails; exactly
one answer → it is returned as is (no judge call: there is nothing to merge); two or more → the
judge gets the original conversation plus the candidate answers (:func:`judge_messages`) and
its reply is the combo's answer. If the judge itself fails, the pipeline may fall back to the
first answer (:attr:`FusionDecision.fallback`). Answers are labelled "Answer 1, 2, …" without
provider names, so the judge weighs content, not brands.

**Pipeline** runs the steps in order; step 1 gets the original request, and every later step
gets the original conversation, the previous step's output as an assistant turn, and that
step's prompt as a user turn (:func:`step_messages`) — draft → critique → polish. The last
step's output is the answer; a failing step fails the combo (a later step cannot do its job
without its input).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fairgate.routing.combo import Combo
from fairgate.routing.model import Target

__all__ = [
    "DEFAULT_STEP_PROMPT",
    "JUDGE_INSTRUCTIONS",
    "ExecutionMode",
    "FusionDecision",
    "FusionPlan",
    "PanelAnswer",
    "PipelinePlan",
    "PipelineStep",
    "answer_text",
    "decide_fusion",
    "judge_messages",
    "mode_of",
    "step_messages",
]

ExecutionMode = Literal["fallback", "fusion", "pipeline"]

JUDGE_INSTRUCTIONS = (
    "Several assistants answered the conversation above. Their answers follow, each between "
    "<answer> tags. Write the single best reply to the user's last message: keep what is "
    "correct and useful in each answer, resolve their disagreements, drop their errors. Reply "
    "with that answer only, addressed to the user; do not mention the other assistants or "
    "this instruction."
)

DEFAULT_STEP_PROMPT = (
    "Review your previous answer for errors and omissions and improve it. Reply with the "
    "improved answer only."
)


def mode_of(strategy: str) -> ExecutionMode:
    """How the executor runs a combo of this (canonical) strategy."""
    if strategy == "fusion":
        return "fusion"
    if strategy == "pipeline":
        return "pipeline"
    return "fallback"


# -- fusion -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FusionPlan:
    panel: tuple[Target, ...]
    judge: Target

    @classmethod
    def from_combo(cls, combo: Combo, order: Sequence[Target] | None = None) -> FusionPlan:
        """The panel is the combo's targets (or the strategy's ``order`` of them); the judge is
        ``config.judge``, else the first target."""
        panel = tuple(order) if order is not None else combo.targets
        judge = combo.config.judge or combo.targets[0]
        return cls(panel=panel, judge=judge)


@dataclass(frozen=True, slots=True)
class PanelAnswer:
    """One panel member's outcome: its text, or the error that ended it."""

    target: Target
    content: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.content and self.content.strip())


@dataclass(frozen=True, slots=True)
class FusionDecision:
    action: Literal["judge", "single", "fail"]
    answers: tuple[PanelAnswer, ...]  # the usable ones, in panel order

    @property
    def fallback(self) -> PanelAnswer | None:
        """What to return if the judge call fails: the first usable answer."""
        return self.answers[0] if self.answers else None


def decide_fusion(answers: Sequence[PanelAnswer]) -> FusionDecision:
    good = tuple(a for a in answers if a.ok)
    if not good:
        return FusionDecision("fail", good)
    return FusionDecision("single" if len(good) == 1 else "judge", good)


def judge_messages(
    messages: Sequence[Mapping[str, Any]],
    answers: Sequence[PanelAnswer],
    *,
    instructions: str = JUDGE_INSTRUCTIONS,
) -> list[dict[str, Any]]:
    """The judge's chat messages: the original conversation, then one user turn with the
    instructions and the usable answers."""
    blocks = [
        f'<answer n="{i}">\n{a.content}\n</answer>'
        for i, a in enumerate((a for a in answers if a.ok), start=1)
    ]
    return [
        *(dict(m) for m in messages),
        {"role": "user", "content": instructions + "\n\n" + "\n\n".join(blocks)},
    ]


# -- pipeline -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PipelineStep:
    target: Target
    prompt: str | None = None  # the instruction for steps after the first


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    steps: tuple[PipelineStep, ...]

    @classmethod
    def from_combo(cls, combo: Combo) -> PipelinePlan:
        """One step per target, in configured order; option ``step_prompts`` (a list aligned
        with the targets, null = default) sets each step's instruction."""
        raw = combo.config.options.get("step_prompts", ())
        prompts = list(raw) if isinstance(raw, list | tuple) else []
        steps = []
        for i, t in enumerate(combo.targets):
            p = prompts[i] if i < len(prompts) else None
            steps.append(PipelineStep(t, p if isinstance(p, str) else None))
        return cls(tuple(steps))


def step_messages(
    messages: Sequence[Mapping[str, Any]],
    step: PipelineStep,
    previous_output: str | None,
) -> list[dict[str, Any]]:
    """The chat messages for ``step``: the original conversation for the first step
    (``previous_output`` None); otherwise the conversation + the previous output as an
    assistant turn + the step's prompt (or :data:`DEFAULT_STEP_PROMPT`) as a user turn."""
    out = [dict(m) for m in messages]
    if previous_output is None:
        return out
    out.append({"role": "assistant", "content": previous_output})
    out.append({"role": "user", "content": step.prompt or DEFAULT_STEP_PROMPT})
    return out


def answer_text(body: Mapping[str, Any]) -> str | None:
    """The assistant text of an OpenAI chat-completion body (``choices[0].message.content``,
    string or text parts), None when there is none."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        ]
        return "".join(parts) if parts else None
    return None
