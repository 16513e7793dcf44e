"""Every package's public surface (``__all__``) is pinned, and every name in it exists.

Issue 47: a package names what other packages may import from it, as httpx does
(``tests/test_exported_members.py`` there). The snapshot below is that list; a change to a
surface is a change to this file too, so a review sees it. The names are loaded on first use
(:mod:`fairgate.surface`): importing a package must not load its surface, so the checks that
every name resolves and that nothing is loaded early are both here.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import fairgate
from fairgate.surface import surface_modules

#: package → its ``__all__``, space-separated and sorted.
SURFACES: dict[str, str] = {
    "fairgate.admin": "create_admin_app dashboard_mount error_response",
    "fairgate.admin_cli": "register",
    "fairgate.backends": "AsyncClient NoReply async_client call_within prepare probe_client",
    "fairgate.db": (
        "ChangeWatcher ComboRecord ComboRepo Conflict ConnectionRepo Database FileRefreshLock "
        "FileTokenStore Invalid KeyRepo MODEL_ALIASES MetadataProbe MetadataUnavailable "
        "NotFound PgDatabase PlanRepo PoolRecord PoolRepo READ_TIMEOUT_S REQUIRE_ALLOCATION "
        "RedisRefreshLock RedisTokenStore RepoError STATEMENT_DEADLINE_S SettingsRepo "
        "access_policy compare_database compare_with_config database_url load_registry "
        "open_database prepare_secrets reseal_all resolve_pool seed_from_config start_log "
        "transaction"
    ),
    "fairgate.domain": (
        "ANY_MODEL AuthType BILLING_FIELDS BreakerState ClientKey Connection Denial Protocol "
        "RateLimitSnapshot TokenSet UNKNOWN_LIMIT Unit Window WindowAnchor count_limits "
        "hash_key parse_delay_ms parse_rate_limit_headers protocol_for"
    ),
    "fairgate.formats": (
        "AnthropicToOpenAIStream CannotCarry ChatToResponsesStream OMITTED_HEADER "
        "OpenAIToAnthropicStream PriceTable ResponsesToChatStream SSEParser "
        "TOOLS_OMITTED_HEADER Usage anthropic_to_openai_request anthropic_to_openai_response "
        "chat_to_responses_response completed_of encode_event estimate_prompt_tokens "
        "estimate_text_tokens merge_anthropic_usage omitted_chat_to_anthropic "
        "omitted_in_translation omitted_messages_to_chat omitted_tools "
        "openai_to_anthropic_request openai_to_anthropic_response responses_to_chat_request "
        "upstream_responses_answer upstream_responses_body usage_from_anthropic "
        "usage_from_openai uses_max_completion_tokens"
    ),
    "fairgate.mock": "MockConfig MockUpstream run_mock_upstream",
    "fairgate.path": "ProviderSignals Services",
    "fairgate.process": (
        "AdminBackoff Answer ApiError CLIENT_SETTING ClientRequest FastRoute Fraction Gateway "
        "GatewayApp HttpSettings KeyRateGuard Later MASK Metrics OAuthClient "
        "REDACTOR REQUEST_ID RetentionDays SendDeadline Settings SettingsError StreamAnswer "
        "admin_key_problem configure_from_settings error_response "
        "internal_error metrics_endpoint protocol_for run server_options start_oauth via_router"
    ),
    "fairgate.providers": (
        "AuthHealth HttpSender HttpTokenEndpoint OAuthTokens RefreshLock RefreshRejected "
        "RefreshUnavailable TRANSPORT_ERRORS TokenStore Upstream UpstreamAuthUnavailable "
        "UpstreamClient UpstreamResponse chatgpt_account_id context_window jwt_claims "
        "probe_connection"
    ),
    "fairgate.quota": (
        "ALLOW_UNGOVERNED AccountBuckets Admission AdmitRequest AdmitResult Allocation Anchor "
        "BucketState CATALOG Count CounterRef Dimension DimensionCheck GcResult ModelCap "
        "Outcome POLICY_CODES PercentAttributor PlanSource Policy Pool PoolCounts PoolUsage "
        "QuotaEngine QuotaSettings QuotaStore REASON_CODES RECLAIM_BATCH Reason "
        "ReservationExists RetentionGc SaturationSignals Scope ShareMode SingleFlight "
        "SlotLeaseSource SlotLeases Standing TOTAL_KEY Ticket UsageItem Verdict block_message "
        "bucket_index compile_checks dominant_levels evaluate fade pool_limits reanchor "
        "resolve_plan retry_after_ms sliding_value unenforced_message unenforced_pools"
    ),
    "fairgate.resilience": (
        "CODE_TABLE Classification CredentialFacts CredentialVerdict Exclusion FailureClass "
        "RateLimitManager ResilienceSettings SHADOW_KEY_SUFFIX Step USABLE all_rate_limited "
        "build_manager knob_names parse_knob request_explains same_model_is_futile step_after"
    ),
    "fairgate.routing": (
        "Combo ComboConfig ContextCompression DEFAULT_MAX_WAIT_MS DEFAULT_QUEUE_TIMEOUT_MS "
        "DrrState DrrTicket FallbackCounts FusionPlan GLOBAL_MAX_ATTEMPTS HealthView "
        "InflightTracker Lease MetricsView ModelAlias ModelAliases PUBLIC_STRATEGIES "
        "PanelAnswer PipelinePlan PipelineStep QTSD_PREFIX QuotaShareResult QuotaView "
        "ReasoningBuffer ResponseValidation RouteInput SOFT_FACTOR STRATEGIES ShadowConfig "
        "Strategy StrategyState Target TargetHealth TargetMetrics TargetQuota TargetStats "
        "TaskHints answer_text auto_breakdown auto_weights decide_fusion expand_targets "
        "get_strategy is_internal judge_messages mode_of parse_aliases parse_qtsd qtsd_name "
        "quota_share_combo resolve_strategy saturation_gate select_quota_share step_messages "
        "task_hints validate_options"
    ),
    "fairgate.routing.strategies": (
        "auto_breakdown auto_weights cache_optimized context_optimized context_relay "
        "cost_optimized fill_first fusion headroom least_used lkgp p2c pipeline priority "
        "random_order reset_aware reset_window round_robin strict_random weighted"
    ),
    "fairgate.server": "MAX_WORKERS config_secrets create_app run_workers",
    "fairgate.sim": "run_simulate",
    "fairgate.store": (
        "AdmitRequest AdmitResult CounterRef DRIVERS LogBackend MAX_AGE_MS PoolCounts "
        "QuotaStore RedisLogBackend RedisQuotaStore SharedPoolLog SqliteLogBackend "
        "SqliteQuotaStore StoreChoice StoreSettings UsageItem create_store"
    ),
    "fairgate.store.redis": "RedisQuotaStore script_source",
    "fairgate.store.sqlite": (
        "DEFAULT_FLUSH_MS DEFAULT_MODE MAX_FLUSH_MS MODES SYNCHRONOUS_MODES SqliteQuotaStore"
    ),
}


def _packages() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(fairgate.__path__, "fairgate.") if m.ispkg)


def _package(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_every_package_has_a_pinned_surface() -> None:
    assert _packages() == sorted(SURFACES)


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_the_surface_is_the_pinned_one(name: str) -> None:
    declared = _package(name).__all__
    assert len(declared) == len(set(declared)), "a name listed twice"
    assert sorted(declared) == SURFACES[name].split()


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_every_name_of_the_surface_exists(name: str) -> None:
    package = _package(name)
    for public in package.__all__:
        value = getattr(package, public)
        assert value is not None or public.isupper(), f"{name}.{public}"


@pytest.mark.parametrize("name", sorted(set(SURFACES) - {"fairgate.domain"}))
def test_a_lazy_surface_lists_each_name_once_with_its_module(name: str) -> None:
    """The ``TYPE_CHECKING`` imports (what mypy reads) and ``__all__`` are the same names, and
    each comes from a module inside the package or, for a name another package defines, is the
    very object that module holds."""
    package = _package(name)
    modules = surface_modules(name)
    assert sorted(modules) == sorted(package.__all__)
    for public, module in modules.items():
        assert getattr(package, public) is getattr(importlib.import_module(module), public)


def test_an_unknown_name_is_an_attribute_error_and_a_submodule_still_imports() -> None:
    quota = _package("fairgate.quota")
    with pytest.raises(AttributeError, match="no_such_name"):
        quota.no_such_name  # noqa: B018
    from fairgate.path import proxy

    assert proxy.__name__ == "fairgate.path.proxy"


def test_importing_a_package_does_not_load_its_surface() -> None:
    """``import fairgate.path`` loads neither the request path's modules nor Starlette, and
    ``import fairgate.providers`` not aiohttp: a module loads what it uses."""
    probe = (
        "import sys, fairgate.path, fairgate.providers, fairgate.quota\n"
        "loaded = [m for m in ('starlette', 'aiohttp', 'fairgate.path.proxy',"
        " 'fairgate.quota.engine') if m in sys.modules]\n"
        "print(','.join(loaded))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
