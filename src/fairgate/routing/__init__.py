"""Combo routing: targets, strategies, quota-share selection and execution modes.

The pure core the proxy pipeline calls. Nothing here does I/O: the pipeline gathers live state
into a :class:`RouteInput`, asks a strategy for an order, and executes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.routing.aliases import ModelAlias, ModelAliases, parse_aliases
    from fairgate.routing.combo import Combo
    from fairgate.routing.context import (
        HealthView,
        MetricsView,
        QuotaView,
        RouteInput,
        TargetHealth,
        TargetQuota,
        TaskHints,
        task_hints,
    )
    from fairgate.routing.fallbacks import FallbackCounts
    from fairgate.routing.metrics import TargetMetrics, TargetStats
    from fairgate.routing.model import (
        DEFAULT_MAX_WAIT_MS,
        DEFAULT_QUEUE_TIMEOUT_MS,
        GLOBAL_MAX_ATTEMPTS,
        QTSD_PREFIX,
        ComboConfig,
        ContextCompression,
        ReasoningBuffer,
        ResponseValidation,
        ShadowConfig,
        Target,
        expand_targets,
    )
    from fairgate.routing.modes import (
        FusionPlan,
        PanelAnswer,
        PipelinePlan,
        PipelineStep,
        answer_text,
        decide_fusion,
        judge_messages,
        mode_of,
        step_messages,
    )
    from fairgate.routing.quota_share import (
        DrrState,
        DrrTicket,
        InflightTracker,
        Lease,
        QuotaShareResult,
        is_internal,
        parse_qtsd,
        qtsd_name,
        quota_share_combo,
        saturation_gate,
        select_quota_share,
    )
    from fairgate.routing.registry import (
        PUBLIC_STRATEGIES,
        STRATEGIES,
        Strategy,
        get_strategy,
        resolve_strategy,
        validate_options,
    )
    from fairgate.routing.soft import SOFT_FACTOR
    from fairgate.routing.state import StrategyState
    from fairgate.routing.strategies.auto import auto_breakdown, auto_weights
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "DEFAULT_MAX_WAIT_MS",
    "DEFAULT_QUEUE_TIMEOUT_MS",
    "GLOBAL_MAX_ATTEMPTS",
    "PUBLIC_STRATEGIES",
    "QTSD_PREFIX",
    "SOFT_FACTOR",
    "STRATEGIES",
    "Combo",
    "ComboConfig",
    "ContextCompression",
    "DrrState",
    "DrrTicket",
    "FallbackCounts",
    "FusionPlan",
    "HealthView",
    "InflightTracker",
    "Lease",
    "MetricsView",
    "ModelAlias",
    "ModelAliases",
    "PanelAnswer",
    "PipelinePlan",
    "PipelineStep",
    "QuotaShareResult",
    "QuotaView",
    "ReasoningBuffer",
    "ResponseValidation",
    "RouteInput",
    "ShadowConfig",
    "Strategy",
    "StrategyState",
    "Target",
    "TargetHealth",
    "TargetMetrics",
    "TargetQuota",
    "TargetStats",
    "TaskHints",
    "answer_text",
    "auto_breakdown",
    "auto_weights",
    "decide_fusion",
    "expand_targets",
    "get_strategy",
    "is_internal",
    "judge_messages",
    "mode_of",
    "parse_aliases",
    "parse_qtsd",
    "qtsd_name",
    "quota_share_combo",
    "resolve_strategy",
    "saturation_gate",
    "select_quota_share",
    "step_messages",
    "task_hints",
    "validate_options",
]
