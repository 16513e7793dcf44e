"""Request and response bodies of the admin API (pydantic), and their mapping to domain types.

Why a model for every body, responses included: the OpenAPI schema is generated from them and is
fuzzed, so it must say exactly what the API accepts and returns. JSON is camelCase (the
dashboard's convention); request bodies also accept the snake_case names of the config file, so
a pool from the YAML file can be POSTed as is. Secrets are write-only: no response model has a
field that could carry one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
)

from fairgate.config import (
    ActiveWindowS,
    AllocationFields,
    Allocations,
    AllocationTerms,
    BillingFields,
    CamelStrict,
    ComboBody,
    ComboName,
    ComboSettingsSpec,
    ComboSpec,
    ComboTargetSpec,
    ConnectionFields,
    DimensionConfig,
    Dimensions,
    ForwardHeaders,
    HttpUrl,
    Id,
    IdList,
    KeyFields,
    MaxWaitMs,
    ModelCapConfig,
    ModelName,
    ModelsPatch,
    Name,
    PoolFields,
    PoolMembers,
    QueuePerKey,
    QueuePerPool,
    Weight,
    redact_url,
)
from fairgate.db.pools import PoolRecord
from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey
from fairgate.domain.units import Unit, Window, WindowAnchor
from fairgate.process.settings import Fraction, RetentionDays
from fairgate.quota.decision import Outcome, Reason
from fairgate.quota.hold import (
    AdmissionMode,
    HoldSettings,
)
from fairgate.quota.model import Allocation, Dimension, ModelCap, Policy, Pool, ShareMode
from fairgate.quota.usage import PoolUsage

RedisUrl = Annotated[
    str,
    StringConstraints(
        pattern=r"^(redis|rediss|redis\+cluster|rediss\+cluster|unix)://\S+$", max_length=2000
    ),
]

#: The admin API's JSON is camelCase (the dashboard's convention); its bodies are the config
#: file's models where the file has one (a subclass of both), so a rule is written once.
ApiModel = CamelStrict


def _no_duplicates(values: Sequence[str], what: str) -> None:
    dups = sorted(v for v, n in Counter(values).items() if n > 1)
    if dups:
        raise ValueError(f"duplicate {what}: {', '.join(dups)}")


# -- quota building blocks --------------------------------------------------------------------


class DimensionIn(ApiModel, DimensionConfig):
    def to_domain(self) -> Dimension:
        return Dimension(self.unit, self.window, self.limit, self.window_anchor)

    @classmethod
    def of(cls, d: Dimension) -> DimensionIn:
        return cls(unit=d.unit, window=d.window, limit=d.limit, window_anchor=d.anchor)


class DimensionOut(ApiModel):
    key: str
    unit: Unit
    window: Window
    limit: float
    enforced: bool = Field(description="False when the limit is unknown (0): shown, not enforced")
    window_anchor: WindowAnchor = WindowAnchor.PROVIDER

    @classmethod
    def of(cls, d: Dimension) -> DimensionOut:
        return cls(
            key=d.key,
            unit=d.unit,
            window=d.window,
            limit=d.limit,
            enforced=d.known,
            window_anchor=d.anchor,
        )


class EnforcedDimensionOut(DimensionOut):
    """A dimension as a pool enforces it: ``limit`` is the pool's whole limit, the number the
    usage, the CLI and the dashboard show; ``basis`` and ``writtenLimit`` say how it came from
    what was written (one connection's limit × ``connections``, or the pool's as written)."""

    basis: Literal["pool", "per-connection"] = Field(
        description="pool: the pool's own limit, enforced as written; per-connection: one "
        "account's (a plan's, or a percent), enforced once per member connection"
    )
    written_limit: float = Field(
        description="The limit as written: one connection's for a per-connection dimension"
    )

    @classmethod
    def of_pool(cls, pool: Pool, d: Dimension) -> EnforcedDimensionOut:
        return cls(
            **DimensionOut.of(d).model_dump(),
            basis=pool.basis(d).value,
            written_limit=pool.written_limit(d),
        )


class ModelCapIn(ApiModel, ModelCapConfig):
    def to_domain(self) -> ModelCap:
        return ModelCap(self.model, self.unit, self.limit)

    @classmethod
    def of(cls, c: ModelCap) -> ModelCapIn:
        return cls(model=c.model, unit=c.unit, limit=c.limit)


def _allocation(terms: AllocationTerms[ModelCapIn], key_id: str, weight: float) -> Allocation:
    return Allocation(
        key_id=key_id,
        weight=weight,
        cap_value=terms.cap_value,
        cap_unit=terms.cap_unit,
        policy=terms.policy,
        model_caps=tuple(c.to_domain() for c in terms.model_caps),
    )


class AllocationIn(ApiModel, AllocationFields[ModelCapIn]):
    def to_domain(self) -> Allocation:
        return _allocation(self, self.key, self.weight)

    @classmethod
    def of(cls, a: Allocation) -> AllocationIn:
        return cls(
            key=a.key_id,
            weight=a.weight,
            policy=a.policy,
            cap_value=a.cap_value,
            cap_unit=a.cap_unit,
            model_caps=[ModelCapIn.of(c) for c in a.model_caps],
        )


class AllocationBody(ApiModel, AllocationTerms[ModelCapIn]):
    """One key's allocation, the key named by the path (``PUT …/allocations/{key}``): all of
    it, as :class:`AllocationIn` without the key. The weight has no default here: an
    allocation added without one would silently be a zero share."""

    weight: Weight = Field(description="The key's fair share, in percent of each limit")

    def to_domain(self, key_id: str) -> Allocation:
        return _allocation(self, key_id, self.weight)


class PoolIn(ApiModel, PoolFields[DimensionIn, AllocationIn]):
    """A pool as created, exported and imported (the config file's pool, camelCase)."""

    def to_record(self) -> PoolRecord:
        return PoolRecord(
            id=self.id,
            name=self.name or self.id,
            connections=tuple(self.connections),
            dimensions=tuple(d.to_domain() for d in self.dimensions),
            allocations=tuple(a.to_domain() for a in self.allocations),
            share_mode=self.share_mode,
            active_window_ms=round(self.active_window_s * 1000),
            hold=HoldSettings(
                self.admission, self.max_wait_ms, self.queue_per_key, self.queue_per_pool
            ),
        )

    @classmethod
    def of(cls, rec: PoolRecord) -> PoolIn:
        return cls(
            id=rec.id,
            name=rec.name,
            connections=list(rec.connections),
            share_mode=rec.share_mode,
            active_window_s=rec.active_window_ms / 1000,
            admission=rec.hold.mode,
            max_wait_ms=rec.hold.max_wait_ms,
            queue_per_key=rec.hold.queue_per_key,
            queue_per_pool=rec.hold.queue_per_pool,
            dimensions=[DimensionIn.of(d) for d in rec.dimensions],
            allocations=[AllocationIn.of(a) for a in rec.allocations],
        )


class PoolPatch(ApiModel):
    """Fields given replace the stored ones (lists are replaced whole); absent fields stay."""

    name: Name | None = None
    share_mode: ShareMode | None = None
    active_window_s: ActiveWindowS | None = None
    admission: AdmissionMode | None = None
    max_wait_ms: MaxWaitMs | None = None
    queue_per_key: QueuePerKey | None = None
    queue_per_pool: QueuePerPool | None = None
    dimensions: Dimensions[DimensionIn] | None = None
    connections: PoolMembers | None = None
    allocations: Allocations[AllocationIn] | None = None


class PoolOut(PoolIn):
    provider: str
    effective_dimensions: list[EnforcedDimensionOut] = Field(
        description="What the engine enforces: the pool's dimensions as written, else its "
        "first connection's plan once per member connection (percent: always per connection)"
    )
    plan_source: Literal["pool", "override", "catalog", "empty"]


class PoolsExport(ApiModel):
    version: Literal[1] = 1
    pools: list[PoolIn] = Field(default_factory=list)

    @field_validator("pools")
    @classmethod
    def _ids(cls, v: list[PoolIn]) -> list[PoolIn]:
        _no_duplicates([p.id for p in v], "pool id")
        return v


class ImportResult(ApiModel):
    created: int
    updated: int
    unchanged: int


# -- usage, log, preview ----------------------------------------------------------------------


class KeyUsageOut(ApiModel):
    key_id: str
    weight: float
    policy: str
    consumed: float
    fair_share: float
    surplus: float
    borrowing: bool
    cap: float | None
    allocated: bool = Field(
        default=True,
        description="False for the one row '(unallocated)': the use of keys with no allocation",
    )
    dominant_share: float = Field(
        default=0.0,
        description="The key's largest consumed / limit over the enforced dimensions: its "
        "standing in active mode (weighted dominant-resource fairness)",
    )
    dominant_dimension: str | None = Field(
        default=None,
        description="The dimension key of that share (null: the key used nothing)",
    )
    window_consumed: float = Field(
        default=0.0,
        description="What the key used in the current window (its current bucket): what "
        "active mode judges its share on, unless the key is backlogged",
    )
    backlogged: bool = Field(
        default=False,
        description="Active mode: refused without a break since before the current window "
        "began, so its share is judged on consumed (the sliding count); as this gateway "
        "process saw it",
    )


class BurnSampleOut(ApiModel):
    t_ms: int
    value: float


class DimensionUsageOut(ApiModel):
    key: str
    unit: str
    window: str
    limit: float
    enforced: bool
    total: float
    used_fraction: float
    strict: bool
    burn_rate_per_s: float
    time_to_exhaustion_ms: int | None
    resets_at_ms: int | None = Field(
        default=None,
        description="When the window's counts next roll over (epoch ms): the provider's reset "
        "when a reading anchored the window, else the turn of the epoch-aligned bucket",
    )
    anchor_source: str | None = Field(
        default=None,
        description="The connection whose reading anchors the window to the provider's reset "
        "(null: epoch-aligned)",
    )
    keys: list[KeyUsageOut]
    burn_samples: list[BurnSampleOut] = Field(
        default_factory=list,
        description="Recent samples of the pool's cumulative consumption (the burn-rate chart)",
    )


class PoolUsageOut(ApiModel):
    pool_id: str
    at_ms: int
    dimensions: list[DimensionUsageOut]

    @classmethod
    def of(cls, u: PoolUsage) -> PoolUsageOut:
        """The engine's usage records as they are: these models name their fields as
        :mod:`fairgate.quota.usage` does, so they are read by attribute (a field added there is
        added here by name, not by one more line of copying)."""
        return cls.model_validate(u, from_attributes=True)


class PoolLogOut(ApiModel):
    pool_id: str
    events: list[dict[str, Any]]


class PreviewDimensionOut(ApiModel):
    key: str
    unit: Unit
    scope: Literal["pool", "model"]
    limit: float
    total: float
    consumed: float
    fair_share: float
    cap: float | None
    cost: float
    used_fraction: float
    strict: bool


class PreviewOut(ApiModel):
    pool: str
    key: str
    model: str | None
    allocated: bool = Field(description="False: the key has no allocation (weight 0, hard)")
    policy: Policy
    outcome: Outcome
    reason: Reason | None
    dimension: str | None
    retry_after_ms: int | None
    threshold: float
    dimensions: list[PreviewDimensionOut]


# -- plans ------------------------------------------------------------------------------------


class PlanIn(ApiModel):
    dimensions: Dimensions[DimensionIn] = Field(min_length=1)


class PlanOut(ApiModel):
    connection_id: str
    provider: str
    source: Literal["override", "catalog", "empty"]
    dimensions: list[DimensionOut]
    warnings: list[str] = Field(
        default_factory=list,
        description="Set when every limit of a manual plan is unknown (≤ 1e-9): nothing enforced",
    )


# -- connections and keys ---------------------------------------------------------------------


class ConnectionIn(ApiModel, ConnectionFields):
    """A connection as created: the file's, camelCase, without its OAuth section (an OAuth
    connection is made by the login flow) and not on the Responses wire."""

    protocol: Literal["openai", "anthropic"] | None = Field(
        default=None, description="Upstream wire protocol (null: the provider's usual one)"
    )


class ConnectionPatch(ApiModel):
    provider: Id | None = None
    base_url: HttpUrl | None = None
    secret: str | None = Field(default=None, max_length=10_000, repr=False)
    auth_type: Literal["apikey", "oauth"] | None = None
    weight: Weight | None = None
    max_concurrent: int | None = Field(default=None, ge=0, le=1_000_000)
    models: ModelsPatch | None = None
    protocol: Literal["openai", "anthropic"] | None = None
    enabled: bool | None = None
    forward_headers: ForwardHeaders | None = None
    billing_fields: BillingFields | None = None


class ConnectionOut(ApiModel):
    id: str
    provider: str
    base_url: str
    protocol: str
    auth_type: str
    weight: float
    max_concurrent: int | None
    models: list[str]
    enabled: bool
    forward_headers: list[str]
    billing_fields: list[str]
    has_secret: bool
    pool: str | None
    #: the credential gate's word: ``{"usable", "problem", "action"}`` (``log in again``)
    credential: dict[str, object] | None = None

    @classmethod
    def of(
        cls, c: Connection, pool: str | None, credential: dict[str, object] | None = None
    ) -> ConnectionOut:
        return cls(
            id=c.id,
            provider=c.provider,
            base_url=redact_url(c.base_url),  # a password stored before they were refused
            protocol=c.protocol.value,
            auth_type=c.auth_type,
            weight=c.weight,
            max_concurrent=c.max_concurrent,
            models=list(c.models),
            enabled=c.enabled,
            forward_headers=list(c.forward_headers),
            billing_fields=list(c.billing_fields),
            has_secret=bool(c.secret),
            pool=pool,
            credential=credential,
        )


class KeyIn(ApiModel, KeyFields):
    """A key as created: the file's without its credential (the gateway makes the secret)."""

    id: Id | None = Field(default=None, description="Generated (key-xxxxxxxx) when omitted")


class KeyPatch(ApiModel):
    name: Name | None = None
    allowed_models: list[ModelName] | None = None
    allowed_connections: IdList | None = Field(
        default=None, description=KeyFields.model_fields["allowed_connections"].description
    )
    allowed_providers: IdList | None = Field(
        default=None, description=KeyFields.model_fields["allowed_providers"].description
    )
    enabled: bool | None = None


class KeyOut(ApiModel):
    """A key as shown: by its id (no character of its secret is kept)."""

    id: str
    name: str
    enabled: bool
    allowed_models: list[str]
    allowed_connections: list[str]
    allowed_providers: list[str]
    last_used_ms: int | None = Field(
        default=None,
        description="When this gateway process last accepted the key (epoch ms); null = not "
        "since it started",
    )

    @classmethod
    def of(cls, k: ClientKey, last_used_ms: int | None = None) -> KeyOut:
        return cls(
            id=k.id,
            name=k.name,
            enabled=k.enabled,
            allowed_models=list(k.allowed_models),
            allowed_connections=sorted(k.allowed_connections),
            allowed_providers=sorted(k.allowed_providers),
            last_used_ms=last_used_ms,
        )


class KeyCreated(KeyOut):
    secret: str = Field(description="Shown once, never again: store it now")


class RateLimitOut(ApiModel):
    """The rate-limit headers of one upstream answer; null = not reported."""

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_ms: int | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_ms: int | None = None


class ConnectionTestOut(ApiModel):
    """The reading of one cheap call (``GET <baseUrl>/models``) with the connection's secret."""

    connection_id: str
    ok: bool
    status: int | None = Field(description="The upstream's HTTP status; null = no answer")
    latency_ms: float
    models: list[str]
    rate_limit: RateLimitOut | None
    error: str | None = Field(description="The provider's words or the network failure")


# -- settings ---------------------------------------------------------------------------------


class QuotaStoreSettingsIn(ApiModel):
    """``null`` clears the DB setting (the environment or the default applies again)."""

    driver: Literal["sqlite", "redis"] | None = None
    redis_url: RedisUrl | None = Field(default=None, repr=False)


class QuotaKnobsIn(ApiModel):
    saturation_threshold: Fraction | None = None
    soft_deprioritize_factor: Fraction | None = None
    consumption_retention_days: RetentionDays | None = None


class AccessSettingsIn(ApiModel):
    """``null`` clears the DB setting (the config file's ``server.require_allocation``, else
    the default applies again)."""

    require_allocation: bool | None = Field(
        default=None,
        description="A key may use a pooled connection only with an allocation in its pool, "
        "and one outside every pool only if it lists it or its provider",
    )


class SettingsIn(ApiModel):
    quota_store: QuotaStoreSettingsIn | None = None
    quota: QuotaKnobsIn | None = None
    access: AccessSettingsIn | None = None


class QuotaStoreSettingsOut(ApiModel):
    requested_driver: str
    active_driver: str
    fallback_reason: str | None
    redis_url_configured: bool = Field(description="The URL itself is never returned")
    redis_url_source: Literal["db", "env"] | None
    driver_source: Literal["db", "env", "default"]


class QuotaKnobsOut(ApiModel):
    saturation_threshold: float
    soft_deprioritize_factor: float
    consumption_retention_days: float


class AccessSettingsOut(ApiModel):
    require_allocation: bool
    source: Literal["db", "config", "default", "legacy"] = Field(
        description="legacy: a data dir from before the setting that has not chosen (open)"
    )


class SettingsOut(ApiModel):
    quota_store: QuotaStoreSettingsOut
    quota: QuotaKnobsOut
    access: AccessSettingsOut


# -- combos -----------------------------------------------------------------------------------
# The bodies are the config file's combo models (fairgate.config), so a combo means the same in
# both places; they share ApiModel's camelCase settings.


class ComboIn(ComboSpec):
    """A combo as created: name, strategy, targets and the settings it sets itself."""


class ComboReplace(ComboBody):
    """The whole combo but its name, which the path gives (``name`` may be repeated: it must
    then equal the path's)."""

    name: ComboName | None = None


class ComboOut(ApiModel):
    name: str
    strategy: str
    targets: list[ComboTargetSpec]
    config: ComboSettingsSpec = Field(
        description="The settings the combo sets; null ones follow the defaults"
    )
    internal: bool = Field(description="A minted qtSd/<pool>/<model> combo: read-only")
    pool: str | None = Field(default=None, description="The pool of an internal combo")
    created_ms: int | None = None
    updated_ms: int | None = None


class ErrorField(ApiModel):
    field: str
    message: str


class ErrorDetail(ApiModel):
    message: str
    type: str
    fields: list[ErrorField] | None = None


class ErrorBody(ApiModel):
    error: ErrorDetail
