"""Combo routing: targets, strategies, quota-share selection and execution modes.

The pure core the proxy pipeline calls. Nothing here does I/O: the pipeline gathers live state
into a :class:`RouteInput`, asks a strategy for an order, and executes it.
"""

from __future__ import annotations

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
from fairgate.routing.metrics import TargetMetrics, TargetStats
from fairgate.routing.model import ComboConfig, ShadowConfig, Target, expand_targets
from fairgate.routing.modes import (
    FusionPlan,
    PanelAnswer,
    PipelinePlan,
    PipelineStep,
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
)
from fairgate.routing.soft import SOFT_FACTOR
from fairgate.routing.state import StrategyState

__all__ = [
    "PUBLIC_STRATEGIES",
    "SOFT_FACTOR",
    "STRATEGIES",
    "Combo",
    "ComboConfig",
    "DrrState",
    "DrrTicket",
    "FusionPlan",
    "HealthView",
    "InflightTracker",
    "Lease",
    "MetricsView",
    "PanelAnswer",
    "PipelinePlan",
    "PipelineStep",
    "QuotaShareResult",
    "QuotaView",
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
    "decide_fusion",
    "expand_targets",
    "get_strategy",
    "is_internal",
    "judge_messages",
    "mode_of",
    "qtsd_name",
    "quota_share_combo",
    "resolve_strategy",
    "saturation_gate",
    "select_quota_share",
    "step_messages",
    "task_hints",
]
