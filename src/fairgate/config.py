"""The YAML config file: connections, client keys, plans, pools, prices, combos (validated).

Why a strict schema (``extra="forbid"``, enums, ranges): a typo in a quota config silently turns a
hard limit into "no limit". Every problem is reported at once, each as ``<dotted.path>: <message>``
so the operator can fix the file in one pass; the CLI prints :class:`ConfigError` and exits 2.

``${VAR}`` and ``${VAR:-default}`` are expanded in every string value (never in mapping keys)
from an injected environment, so secrets stay out of the file; ``$${`` is a literal ``${``.

The config file is the lowest-precedence source of metadata: it is seeded into the metadata DB at
start (``db.seeding.seed_from_config``), and the admin API edits the DB from then on.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from fairgate import environment
from fairgate.domain.connections import ANY_MODEL, BILLING_FIELDS
from fairgate.domain.keys import hash_key
from fairgate.domain.units import Unit, Window, WindowAnchor
from fairgate.quota.hold import (
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_QUEUE_PER_KEY,
    DEFAULT_QUEUE_PER_POOL,
    AdmissionMode,
)
from fairgate.quota.model import Policy, ShareMode
from fairgate.routing.aliases import ModelAlias
from fairgate.routing.combo import Combo
from fairgate.routing.model import GLOBAL_MAX_ATTEMPTS, QTSD_PREFIX, ComboConfig, Target
from fairgate.routing.registry import PUBLIC_STRATEGIES, resolve_strategy, validate_options

#: Ids of connections, keys and pools. No ':' '{' '}' or spaces: the Redis store builds keys and
#: hash tags from them.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

ID_MESSAGE = (
    "must be 1-64 characters: letters, digits, '_', '.' or '-', starting with a letter or digit"
)

Id = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
#: A model name as clients send it (``gpt-4o``, ``claude-sonnet-4``, ``org/model``).
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^\S+$")]
Weight = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
#: Upper bound of limits and caps: far above any real quota (4.1e9 tokens/month is the largest
#: catalog entry) and small enough that n members × limit never overflows to infinity.
MAX_LIMIT = 1e15
Limit = Annotated[float, Field(ge=0, le=MAX_LIMIT, allow_inf_nan=False)]
CapValue = Annotated[float, Field(gt=0, le=MAX_LIMIT, allow_inf_nan=False)]


def _userinfo(url: str) -> tuple[str, str]:
    """(``user[:password]``, the rest of the authority) of an ``scheme://authority/...`` URL."""
    authority = url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    userinfo, at, host = authority.rpartition("@")
    return (userinfo if at else ""), host


def redact_url(url: str) -> str:
    """``https://user:***@host/...``: for URLs stored before passwords were refused."""
    userinfo, _ = _userinfo(url)
    user, colon, _ = userinfo.partition(":")
    if not colon:
        return url
    return url.replace(userinfo + "@", f"{user}:***@", 1)


def _no_password(url: str) -> str:
    """A URL is echoed by the admin API, shown on the dashboard and logged; a password in it
    would leak from all three. The credential belongs in the write-only ``secret``."""
    userinfo, _ = _userinfo(url)
    if ":" in userinfo:
        raise ValueError(
            "must not contain a password (user:password@): give the credential as 'secret', "
            "which is never echoed"
        )
    return url


HttpUrl = Annotated[
    str,
    StringConstraints(pattern=r"^https?://[^\s/?#]+[^\s]*$", max_length=2000),
    AfterValidator(_no_password),
]
#: A connection's models: names, or ``"*"`` (alone or in the list) for any model.
ModelList = list[ModelName] | Literal["*"]

#: Client headers a connection may forward upstream (``forward_headers``): a header name.
HeaderName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")]
#: Headers the gateway sets itself (credentials, framing, hop-by-hop): never the client's.
UNFORWARDABLE = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "cookie",
        "host",
        "content-length",
        "content-type",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "accept-encoding",
        "x-request-id",
    }
)


def checked_models(v: list[str] | str | None) -> list[str]:
    """A connection must say what it serves: its models by name, or ``"*"`` for any. An empty
    or missing list is refused (it used to mean "any", silently)."""
    if v is None or not v:
        raise ValueError(
            f'list the models this connection serves, or "{ANY_MODEL}" for any model '
            "(an empty list serves none)"
        )
    if isinstance(v, str):
        return [v]
    _no_duplicates(v, "model")
    return v


#: A billing-relevant body field a connection lets clients set (``billing_fields``).
BillingField = Literal["service_tier", "store"]


def checked_billing_fields(v: list[str]) -> list[str]:
    """Unique, in the order :data:`fairgate.domain.connections.BILLING_FIELDS` gives them."""
    _no_duplicates(v, "field")
    return [f for f in BILLING_FIELDS if f in v]


def checked_forward_headers(v: list[str]) -> list[str]:
    """Lower-cased and unique; never a header the gateway sets itself."""
    names = [h.lower() for h in v]
    _no_duplicates(names, "header")
    bad = sorted(n for n in names if n in UNFORWARDABLE or n.startswith("x-fairgate-"))
    if bad:
        raise ValueError(f"set by the gateway, cannot be forwarded: {', '.join(bad)}")
    return names


def _unique(what: str) -> AfterValidator:
    """The rule of a list whose items must differ (``what`` names them in the message)."""

    def check(v: list[str]) -> list[str]:
        _no_duplicates(v, what)
        return v

    return AfterValidator(check)


# Each rule rides on its type, so the file's models and the admin API's (which derive from them,
# or patch them field by field) check a value in one place.
#: A connection's models as the file and a create request give them (required).
Models = Annotated[ModelList | None, AfterValidator(checked_models)]
#: The same, where absent means "unchanged" (a patch).
ModelsPatch = Annotated[ModelList, AfterValidator(checked_models)]
ForwardHeaders = Annotated[
    list[HeaderName], Field(max_length=50), AfterValidator(checked_forward_headers)
]
BillingFields = Annotated[list[BillingField], AfterValidator(checked_billing_fields)]
#: A pool's member connections: at least one, each once.
PoolMembers = Annotated[list[Id], Field(min_length=1), _unique("connection")]
#: A display name for people.
Name = Annotated[str, StringConstraints(max_length=200)]
ActiveWindowS = Annotated[float, Field(ge=1, le=30 * 86_400, allow_inf_nan=False)]
#: admission: hold's bounds (a request's patience in ms; requests waiting per key, per pool)
MaxWaitMs = Annotated[int, Field(ge=0, le=600_000)]
QueuePerKey = Annotated[int, Field(ge=1, le=10_000)]
QueuePerPool = Annotated[int, Field(ge=1, le=100_000)]
#: Ids a key lists (connections, providers).
IdList = Annotated[list[Id], Field(max_length=1000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CamelStrict(BaseModel):
    """Strict like the rest of the file, camelCase like the admin API: the combos section's
    models, and the admin API's models, which are the file's models spelled this way (a
    subclass of a file model and this one). Snake_case names are accepted too, so a section
    of the file can be sent to the admin API as it is."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
    )


def spelled(model: BaseModel, name: str) -> str:
    """Field ``name`` as ``model``'s input spells it (``cap_value`` in the file, ``capValue``
    over the admin API), for messages of rules across fields."""
    return type(model).model_fields[name].alias or name


#: How a start treats the objects the file declares (``fairgate.db.reconcile``).
ConfigMode = Literal["seed", "authoritative"]


class ServerConfig(_Strict):
    port: int = Field(default=20128, ge=1, le=65535, description="TCP port the gateway listens on")
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description=(
            "Address the gateway binds to (127.0.0.1: this machine only; 0.0.0.0: every interface)"
        ),
    )
    max_body_bytes: int = Field(
        default=10 * 1024 * 1024,
        ge=1,
        description="Largest request body accepted, in bytes (larger: 413)",
    )
    default_provider: Id | None = Field(
        default=None,
        description="Provider whose models a client may name without the 'provider/' prefix",
    )
    upstream_timeout_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds an upstream request may take before it is abandoned",
    )
    upstream_idle_per_origin: int = Field(
        default=32,
        ge=0,
        le=100_000,
        description="Idle keep-alive connections kept per upstream origin (scheme, host, port) "
        "for the next requests, each for at most 60 s; past it the ones idle longest are closed "
        "once idle 2 s, so a steady load above it keeps its connections (0: none kept). "
        "Connections in use are not limited by it: a burst opens what it needs, and what it "
        "leaves idle is trimmed to this",
    )
    default_max_tokens: int = Field(
        default=1024,
        ge=1,
        description=(
            "Output tokens reserved for a request that sets no max_tokens (sent "
            "upstream as its limit)"
        ),
    )
    #: who may use what (docs/security.md): None = not set here (the DB setting, else on for a
    #: new data dir, off with a warning for one that predates the setting)
    require_allocation: bool | None = Field(
        default=None,
        description=(
            "Keys may use only the pools they have an allocation in and the "
            "connections they list (null: the database setting, else on for a new "
            "data directory)"
        ),
    )
    config_mode: ConfigMode = Field(
        default="seed",
        description="How a start treats the objects this file declares. seed: it creates "
        "what the database lacks, and applies the file's edits to what the file wrote itself "
        "while nothing else changed it; what was created, changed, rotated or revoked through "
        "the admin API, the CLI or the dashboard keeps its state (fairgate config check and "
        "/health list the differences). authoritative: every object the file declares is set "
        "to what it says at every start, each overwrite logged; a revoked key or a "
        "rotated-away secret still never comes back",
    )


class OAuthConfig(_Strict):
    """The OAuth side of a subscription connection (``auth_type: oauth``): the refresh token
    and where to spend it. The connection's ``secret`` is the current access token (may be
    empty: the gateway then refreshes before the first request)."""

    refresh_token: str = Field(
        min_length=1, description="The OAuth refresh token the gateway spends for new access tokens"
    )
    token_url: HttpUrl = Field(
        description="The provider's OAuth token endpoint (http or https URL, no password in it)"
    )
    client_id: str = Field(
        default="",
        max_length=200,
        description="OAuth client id sent with a refresh (the subscription CLI's own)",
    )
    #: when the access token in ``secret`` expires (epoch seconds); unknown → refreshed first
    expires_at: int | None = Field(
        default=None,
        ge=0,
        description=(
            "When the access token in 'secret' expires, in epoch seconds (null: "
            "refreshed before first use)"
        ),
    )


class ConnectionFields(_Strict):
    """A connection as the file and the admin API's create request give it."""

    id: Id = Field(description="The connection's id, unique among connections")
    provider: Id = Field(
        description=(
            "Provider name (openai, anthropic, codex, …): picks the protocol, "
            "catalogue plan and prices"
        )
    )
    base_url: HttpUrl = Field(
        description=(
            "The provider's API base URL (http or https, no password in it: the "
            "credential goes in 'secret')"
        )
    )
    secret: str = Field(
        default="",
        max_length=10_000,
        repr=False,
        description=(
            "API key, or the OAuth access token with auth_type oauth; sealed at rest "
            "and never echoed"
        ),
    )
    auth_type: Literal["apikey", "oauth"] = Field(
        default="apikey",
        description=(
            "apikey: 'secret' is an API key; oauth: a subscription account refreshed "
            "through 'oauth'"
        ),
    )
    weight: Weight = Field(
        default=1.0,
        description=(
            "Relative share of a pool's requests routed to this connection (quota-"
            "share deficit round robin)"
        ),
    )
    max_concurrent: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description=(
            "Requests in flight at most on this connection; more queue (null or 0: no limit)"
        ),
    )
    models: Models = Field(
        default=None,
        validate_default=True,
        description="Model names this connection serves, or '*' for any model (required)",
    )
    protocol: Literal["openai", "anthropic", "responses"] | None = Field(
        default=None, description="Upstream wire protocol (null: the provider's usual one)"
    )
    enabled: bool = Field(
        default=True, description="false: no request is routed to this connection"
    )
    forward_headers: ForwardHeaders = Field(
        default_factory=list,
        description=(
            "Client request headers passed on upstream besides the wire's own (anthropic-beta "
            "and anthropic-version to Anthropic, openai-beta to Responses; lower-cased; never "
            "one the gateway sets itself)"
        ),
    )
    billing_fields: BillingFields = Field(
        default_factory=list,
        description=(
            "Billing-relevant request body fields clients may set on this connection "
            "(service_tier, store); the others are removed before sending (none by default)"
        ),
    )


class ConnectionConfig(ConnectionFields):
    """A connection of the file: an OAuth one may carry its refresh settings."""

    oauth: OAuthConfig | None = Field(
        default=None, description="The OAuth refresh settings of an auth_type: oauth connection"
    )

    @model_validator(mode="after")
    def _oauth_needs_auth_type(self) -> Self:
        if self.oauth is not None and self.auth_type != "oauth":
            raise ValueError("'oauth' is for connections with auth_type: oauth")
        return self


class ModelAliasConfig(_Strict):
    """A requested model name, or a pattern of names with ``*``, and the model it is sent to."""

    pattern: ModelName = Field(
        description=(
            "The model names this alias catches: an exact name, or a pattern where * matches "
            "any characters (claude-*, gpt-5*)"
        )
    )
    target: ModelName = Field(
        description=(
            "The model the caught names are sent to: a model a connection lists, "
            "provider/model, or a combo's name (not aliased again)"
        )
    )

    @field_validator("target")
    @classmethod
    def _plain_target(cls, v: str) -> str:
        if "*" in v:
            raise ValueError("the target is a model name, not a pattern")
        return v

    def alias(self) -> ModelAlias:
        return ModelAlias(self.pattern, self.target)


class KeyFields(_Strict):
    """A client key as the file and the admin API's create request give it (its credential
    apart: the file gives it, the admin API makes it; and its id, which the admin API can
    make too)."""

    name: Name = Field(default="", description="A display name for people (dashboard, CLI)")
    allowed_models: list[ModelName] = Field(
        default_factory=list, description="Models this key may use (empty: any)"
    )
    #: connections outside every pool this key may use (by id, or every one of a provider)
    allowed_connections: IdList = Field(
        default_factory=list,
        description=(
            "Connections outside every pool this key may use, by id (with require_allocation)"
        ),
    )
    allowed_providers: IdList = Field(
        default_factory=list,
        description=(
            "Providers whose connections outside every pool this key may use (with "
            "require_allocation)"
        ),
    )
    enabled: bool = Field(default=True, description="false: the key is refused (401)")


class KeyConfig(KeyFields):
    """A client key given either by its secret (hashed on seeding) or by its SHA-256 hash."""

    id: Id = Field(description="The key's id, unique among keys")
    secret: str | None = Field(
        default=None,
        min_length=8,
        repr=False,
        description=(
            "The client's bearer token (at least 8 characters; hashed when seeded, "
            "never stored). Give this or key_hash"
        ),
    )
    key_hash: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 of the client's bearer token, 64 hex digits, instead of 'secret'",
    )

    @model_validator(mode="after")
    def _one_credential(self) -> Self:
        if (self.secret is None) == (self.key_hash is None):
            raise ValueError("give exactly one of 'secret' or 'key_hash'")
        return self


class DimensionConfig(_Strict):
    unit: Unit = Field(
        description="What is counted: requests, tokens, usd, or percent of a provider's quota"
    )
    window: Window = Field(description="The sliding window the limit applies to")
    limit: Limit = Field(description="The pool's limit per window, in the dimension's unit")
    window_anchor: WindowAnchor = Field(
        default=WindowAnchor.PROVIDER,
        description="provider: a percent window follows the reset the provider's readings "
        "state (its fair shares roll over when the account's quota does); epoch: the "
        "epoch-aligned sliding window. Only percent windows get such readings",
    )


class ModelCapConfig(_Strict):
    model: ModelName = Field(description="The model the cap applies to")
    unit: Unit = Field(description="What the cap counts (requests, tokens, usd, percent)")
    limit: Limit = Field(description="The key's most of this model per hour, in the cap's unit")


# The sections that hold lists of sections (a pool's dimensions and allocations, an
# allocation's model caps) are generic in their items: the file's models hold the file's items,
# the admin API's the same items spelled in camelCase.
DimT = TypeVar("DimT", bound=DimensionConfig)
CapT = TypeVar("CapT", bound=ModelCapConfig)


def unique_dimensions(dims: list[DimT]) -> list[DimT]:
    """Two dimensions with the same unit and window would share one counter."""
    _no_duplicates([f"{d.unit.value}/{d.window.value}" for d in dims], "dimension")
    return dims


def unique_caps(caps: list[CapT]) -> list[CapT]:
    """Two caps of one model in one unit would contradict each other."""
    _no_duplicates([f"{c.model} {c.unit.value}" for c in caps], "model cap")
    return caps


Dimensions = Annotated[list[DimT], AfterValidator(unique_dimensions)]
ModelCaps = Annotated[list[CapT], AfterValidator(unique_caps)]


class AllocationTerms(_Strict, Generic[CapT]):
    """What an allocation says besides its key and weight, and the rules on it: one
    definition for the file's allocation, the admin API's whole-pool form and its one-key
    form (``PUT …/allocations/{key}``)."""

    policy: Policy = Field(
        default=Policy.HARD,
        description=(
            "Past its fair share once the pool is strict: hard is blocked, soft is "
            "deprioritised, burst passes"
        ),
    )
    cap_value: CapValue | None = Field(
        default=None,
        description=(
            "An absolute cap on the key's use in each window of the pool's dimensions in "
            "cap_unit (given with cap_unit)"
        ),
    )
    cap_unit: Unit | None = Field(
        default=None, description="The unit of cap_value (requests, tokens, usd, percent)"
    )
    model_caps: ModelCaps[CapT] = Field(
        default_factory=list,
        description="Caps on the key's use of single models, each in its own unit",
    )

    @model_validator(mode="after")
    def _cap_pair(self) -> Self:
        if (self.cap_value is None) != (self.cap_unit is None):
            value, unit = spelled(self, "cap_value"), spelled(self, "cap_unit")
            raise ValueError(f"{value} and {unit} must be given together")
        return self


class AllocationFields(AllocationTerms[CapT], Generic[CapT]):
    key: Id = Field(description="The client key this allocation is for")
    weight: Weight = Field(
        default=0.0,
        description=(
            "The key's fair share, in percent of each limit (not a relative part: "
            "weights should sum to 100)"
        ),
    )


class AllocationConfig(AllocationFields[ModelCapConfig]):
    """A client key's share of a pool: its weight, policy and caps."""


AllocT = TypeVar("AllocT", bound=AllocationFields[Any])


def _unique_keys(allocs: list[AllocT]) -> list[AllocT]:
    _no_duplicates([a.key for a in allocs], "allocation for key")
    return allocs


Allocations = Annotated[list[AllocT], AfterValidator(_unique_keys)]


class PoolFields(_Strict, Generic[DimT, AllocT]):
    """A pool, generic in its dimensions and allocations (see above)."""

    id: Id = Field(description="The pool's id, unique among pools")
    name: Name = Field(default="", description="A display name for people (dashboard, CLI)")
    connections: PoolMembers = Field(
        description=(
            "Ids of the connections whose quota the pool shares (one provider; a "
            "connection in one pool at most)"
        ),
    )
    share_mode: ShareMode = Field(
        default=ShareMode.STATIC,
        description=(
            "static: weighted shares once the pool is half used; active: shares among"
            " the keys active lately, bounded by demand"
        ),
    )
    active_window_s: ActiveWindowS = Field(
        default=900.0,
        description="Seconds without a request after which a key holds no share in active mode",
    )
    dimensions: Dimensions[DimT] = Field(
        default_factory=list,
        description="The pool's limits (empty: the connections' catalogue plan)",
    )
    allocations: Allocations[AllocT] = Field(
        default_factory=list, description="Each client key's weight, policy and caps in this pool"
    )
    admission: AdmissionMode = Field(
        default=AdmissionMode.REFUSE,
        description=(
            "A request that does not fit: refuse it at once (429 with Retry-After), or hold "
            "it in its key's queue up to max_wait_ms; freed room goes to the waiting key with "
            "the least use of the window per weight, oldest request first (429 when the "
            "patience runs out)"
        ),
    )
    max_wait_ms: MaxWaitMs = Field(
        default=DEFAULT_MAX_WAIT_MS,
        description=(
            "admission: hold: how long a request waits for room at most (a client may shorten "
            "it with the x-fairgate-max-wait-ms header; 0: never wait)"
        ),
    )
    queue_per_key: QueuePerKey = Field(
        default=DEFAULT_QUEUE_PER_KEY,
        description="admission: hold: requests of one key waiting at most (more are refused)",
    )
    queue_per_pool: QueuePerPool = Field(
        default=DEFAULT_QUEUE_PER_POOL,
        description="admission: hold: requests waiting in the pool at most, all keys together",
    )


class PoolConfig(PoolFields[DimensionConfig, AllocationConfig]):
    """Connections whose limits are shared among client keys by weight."""


#: Below this sum of a pool's weights (percent) most of its limit is nobody's fair share; above
#: 100 the shares promise more than the limit. Both are allowed (a pool may keep room for keys
#: without an allocation, or oversubscribe soft and burst keys on purpose) and both are warned of.
WEIGHT_SUM_LOW = 50.0
WEIGHT_SUM_HIGH = 100.0


def weight_warnings(cfg: Config) -> list[tuple[str, str]]:
    """``(field path, message)`` for each pool whose allocation weights sum far below or above
    100: weights are percentages of the limit, not relative parts (three keys of ``weight: 1``
    get 1 % each, not a third), a mistake that validates and then blocks everyone early."""
    out: list[tuple[str, str]] = []
    for i, pool in enumerate(cfg.pools):
        if not pool.allocations:
            continue
        total = sum(a.weight for a in pool.allocations)
        if total < WEIGHT_SUM_LOW:
            out.append(
                (
                    f"pools.{i}.allocations",
                    f"pool {pool.id!r}: the weights sum to {total:g} %: weights are percentages "
                    f"of the limit, so {100 - total:g} % of it is nobody's fair share "
                    "(did you mean relative weights? scale them to sum to 100)",
                )
            )
        elif total > WEIGHT_SUM_HIGH:
            out.append(
                (
                    f"pools.{i}.allocations",
                    f"pool {pool.id!r}: the weights sum to {total:g} %: the fair shares promise "
                    "more than the limit (hard keys may be refused below their share)",
                )
            )
    return out


class PriceConfig(_Strict):
    """USD per million tokens."""

    input: Limit = Field(default=0.0, description="USD per million input tokens")
    output: Limit = Field(default=0.0, description="USD per million output tokens")
    cached_input: Limit | None = Field(
        default=None, description="USD per million cached input tokens (null: billed as input)"
    )


# -- combos -----------------------------------------------------------------------------------
#
# A combo is a named virtual model routed over several targets (SPEC §8). The same models
# validate the ``combos:`` section of the file and the admin API's bodies, so a combo copied from
# one to the other means the same thing. Keys are camelCase (the admin API's convention, and how
# SPEC §8 spells ``maxRetries``); the snake_case names are accepted too. Everything checkable
# without the rest of the file is checked here; :meth:`ComboSpec.to_combo` then runs the routing
# layer's own checks (``fairgate.routing.model``) and :meth:`ComboSpec.reference_problems` the
# references to connections, each problem naming its field.

#: A user combo's name: an id, so it has no ``/`` and can never look like ``provider/model``
#: or like the ``qtSd/<pool>/<model>`` combos fairgate mints itself.
ComboName = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
#: A target's connection: an id, or ``*`` for every connection of the provider.
TargetConnection = Annotated[
    str, StringConstraints(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")
]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^\S+$")]
SampleRate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
DelayMs = Annotated[int, Field(ge=0, le=600_000)]


class InvalidCombo(ValueError):
    """A combo the routing layer refuses; ``problems`` are ``(field, message)`` pairs, the field
    relative to the combo (``strategy``, ``targets.1``, ``config.options``)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


class ComboTargetSpec(CamelStrict):
    """One target of a combo. ``model: "*"`` means every model the provider's connections list
    (``provider/*``); ``connection: "*"`` every connection of the provider serving the model;
    no connection: the provider's connections as the gateway picks them. Prices are USD per
    million tokens; a lower ``tier`` is preferred."""

    provider: Id = Field(description="The target's provider")
    model: ModelName = Field(
        description="The model to ask, or '*' for every model the provider's connections list"
    )
    connection: TargetConnection | None = Field(
        default=None,
        description=(
            "One connection of the provider, or '*' for each serving the model (null:"
            " the gateway picks)"
        ),
    )
    weight: Weight = Field(default=1.0, description="Relative weight for the weighted strategies")
    price_in: Limit | None = Field(
        default=None,
        description=(
            "USD per million input tokens, for cost-aware strategies (null: the price table's)"
        ),
    )
    price_out: Limit | None = Field(
        default=None,
        description=(
            "USD per million output tokens, for cost-aware strategies (null: the price table's)"
        ),
    )
    tier: int = Field(
        default=0, ge=0, le=1000, description="Preference tier: a lower tier is tried first"
    )
    context_window: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description=(
            "The model's context window in tokens (null: unknown); longer prompts skip the target"
        ),
    )
    tags: list[Tag] = Field(
        default_factory=list,
        max_length=50,
        description=(
            "Capabilities (tools, images, reasoning, …) auto matches against the request's needs"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _from_ref(cls, data: object) -> object:
        """``"openai/gpt-4o"`` is ``{provider: openai, model: gpt-4o}``: how LiteLLM and
        OmniRoute users write a target. Split at the first ``/``, which is unambiguous: a
        provider is an id and holds no ``/``, a model may (``openrouter/meta/llama``)."""
        if not isinstance(data, str):
            return data
        provider, sep, model = data.strip().partition("/")
        if not sep or not provider or not model:
            raise ValueError(
                f"a target is a mapping {{provider, model, …}} or a 'provider/model' string, "
                f"not {data[:80]!r}"
            )
        return {"provider": provider, "model": model}

    def to_target(self) -> Target:
        same = {name: getattr(self, name) for name in _TARGET_FIELDS}
        return Target(**same, connection_id=self.connection, tags=frozenset(self.tags))

    @classmethod
    def of(cls, t: Target) -> ComboTargetSpec:
        same = {name: getattr(t, name) for name in _TARGET_FIELDS}
        return cls(**same, connection=t.connection_id, tags=sorted(t.tags))


#: The fields a combo target spec and the routing layer's Target name alike (the connection and
#: the tags differ in name or type and are converted by hand).
_TARGET_FIELDS = ("provider", "model", "weight", "price_in", "price_out", "tier", "context_window")


class ComboShadowSpec(CamelStrict):
    """Shadow routing: a sampled copy of each answered request goes to these targets."""

    targets: list[ComboTargetSpec] = Field(
        default_factory=list,
        max_length=20,
        description=(
            "Targets that get the sampled copies; their answers are never returned to the client"
        ),
    )
    sample_rate: SampleRate = Field(
        default=0.0, description="Fraction of answered requests copied, 0 to 1"
    )
    timeout_ms: int = Field(
        default=30_000, ge=1, le=3_600_000, description="Milliseconds a shadow request may take"
    )


class ReasoningBufferSpec(CamelStrict):
    """Reasoning held back in streams until the first content token (off by default)."""

    enabled: bool = Field(default=True, description="Hold reasoning while the answer has none")
    max_bytes: int = Field(
        default=262_144,
        ge=1,
        le=16_777_216,
        description="Bytes of reasoning held at most; past it the stream is passed through",
    )
    max_ms: int = Field(
        default=60_000,
        ge=1,
        le=3_600_000,
        description="Milliseconds reasoning is held at most; past it the stream is passed through",
    )


class ContextCompressionSpec(CamelStrict):
    """How a conversation larger than a target's context window is made to fit it."""

    strategy: Literal["drop-middle"] = Field(
        default="drop-middle",
        description="drop-middle: keep the system prompt and the last turns, drop the rest",
    )
    keep_last_turns: int = Field(
        default=8, ge=1, le=1000, description="Messages kept at the end of the conversation"
    )


def _regexes(v: list[str]) -> list[str]:
    for i, p in enumerate(v):
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"disallowedPatterns.{i} is not a regex ({exc})") from None
    return v


Regexes = Annotated[
    list[Annotated[str, StringConstraints(min_length=1, max_length=1000)]],
    Field(max_length=50),
    AfterValidator(_regexes),
]


class ResponseValidationSpec(CamelStrict):
    """Checks of an answer beyond the empty/truncated ones; a failed one fails over."""

    disallowed_patterns: Regexes = Field(
        default_factory=list,
        description="Regexes (Python syntax) the answer's text must not match",
    )
    json_schema: bool = Field(
        default=False,
        description="Check the answer against the JSON schema of response_format / text.format",
    )


class ComboSettingsSpec(CamelStrict):
    """A combo's own settings. A field left out (or null) is not set by the combo and inherits
    from the layers below it (built-in default → global settings → per provider), so storing
    only what the combo sets keeps the cascade alive."""

    max_retries: int | None = Field(
        default=None, ge=0, le=10, description="Retries per target on transient failures (1)"
    )
    retry_delay_ms: DelayMs | None = Field(
        default=None, description="Milliseconds to pause before a retry on the same target (0)"
    )
    fallback_delay_ms: DelayMs | None = Field(
        default=None, description="Milliseconds to pause before moving to the next target (0)"
    )
    timeout_ms: int | None = Field(
        default=None,
        ge=1,
        le=86_400_000,
        description="Milliseconds the whole combo may take, attempts included (null: no limit)",
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=GLOBAL_MAX_ATTEMPTS,
        description=(
            "Attempts at most over all targets (targets × (1 + maxRetries); never above 20)"
        ),
    )
    quality_validation: bool | None = Field(
        default=None,
        description="Fail over from a broken 200 (an empty answer with no stop reason) (true)",
    )
    max_wait_ms: int | None = Field(
        default=None,
        ge=0,
        le=600_000,
        description="Wait this long at most for a cooling target to free (5000; 0 = never)",
    )
    queue_timeout_ms: int | None = Field(
        default=None,
        ge=0,
        le=600_000,
        description="Queue this long at most for a concurrency slot (2000)",
    )
    shadow: ComboShadowSpec | None = Field(
        default=None,
        description="Shadow routing: sampled copies of answered requests to other targets",
    )
    judge: ComboTargetSpec | None = Field(
        default=None, description="fusion's judge model (default: the first target)"
    )
    options: dict[str, Any] | None = Field(
        default=None, description="Strategy options (sticky, weights, exploration, budgetUsd, …)"
    )
    predictive_ttft_ms: Annotated[int, Field(ge=1, le=600_000)] | Literal["p95"] | None = Field(
        default=None,
        description=(
            "Hedged first token: start the next target too when the first has produced no "
            "token within this many ms ('p95': its learned p95); null: no hedging"
        ),
    )
    max_hedges_in_flight: int | None = Field(
        default=None, ge=1, le=1000, description="Hedges of this combo in flight at once (4)"
    )
    reasoning_buffer: ReasoningBufferSpec | bool | None = Field(
        default=None,
        description="Hold a stream's reasoning until its first content (off; true: on with "
        "the default bounds)",
    )
    context_compression: ContextCompressionSpec | None = Field(
        default=None,
        description="Fit a conversation to a smaller target's window (null: skip that target)",
    )
    response_validation: ResponseValidationSpec | None = Field(
        default=None,
        description="Disallowed patterns and the requested JSON schema checked on answers (off)",
    )

    def layer(self) -> dict[str, Any]:
        """The settings this combo sets (JSON, camelCase): its layer of the config cascade."""
        return self.model_dump(mode="json", exclude_none=True)


def _known_strategy(v: str) -> str:
    """Unknown names are refused here, never silently routed as priority; stored in the
    canonical spelling (an alias such as ``weighted-sticky`` stays an alias)."""
    resolve_strategy(v)
    return v.strip().lower().replace("_", "-")


Strategy = Annotated[str, StringConstraints(max_length=64), AfterValidator(_known_strategy)]


class ComboBody(CamelStrict):
    """A combo without its name: what ``PUT /combos/{name}`` replaces."""

    strategy: Strategy = Field(
        default="priority", description="One of: " + ", ".join(PUBLIC_STRATEGIES)
    )
    targets: list[ComboTargetSpec] = Field(
        min_length=1,
        max_length=200,
        description="Each a {provider, model, …} mapping or a 'provider/model' string",
    )
    config: ComboSettingsSpec = Field(
        default_factory=ComboSettingsSpec,
        description="The combo's settings; a field left out inherits from the routing defaults",
    )


class ComboSpec(ComboBody):
    """A user combo as configured: in the file's ``combos:`` list or an admin API body."""

    name: ComboName = Field(
        description=(
            "The combo's name, the model clients ask for (an id; the qtSd/ prefix is reserved)"
        )
    )

    @field_validator("name", mode="before")
    @classmethod
    def _not_internal(cls, v: object) -> object:
        # checked before the pattern so the message says why, not just "bad characters"
        if isinstance(v, str) and v.startswith(QTSD_PREFIX):
            raise ValueError(
                f"the '{QTSD_PREFIX}' prefix is reserved for the quota-share combos fairgate "
                "mints for pools; they are internal, not user-selectable"
            )
        return v

    def to_combo(self, *layers: Mapping[str, object]) -> Combo:
        """The routing layer's combo (``layers``: the config layers below this combo's own).
        Raises :class:`InvalidCombo` naming every field the routing layer refuses."""
        problems: list[tuple[str, str]] = []
        canonical: str | None = None
        implied: Mapping[str, object] = {}
        try:
            canonical, implied = resolve_strategy(self.strategy)
        except ValueError as exc:
            problems.append(("strategy", str(exc)))
        targets: list[Target] = []
        first: dict[str, int] = {}
        for j, spec in enumerate(self.targets):
            try:
                t = spec.to_target()
            except ValueError as exc:
                problems.append((f"targets.{j}", str(exc)))
                continue
            if t.key in first:
                problems.append(
                    (f"targets.{j}", f"duplicate target '{t.key}' (also targets.{first[t.key]})")
                )
                continue
            first[t.key] = j
            targets.append(t)
        config: ComboConfig | None = None
        try:
            config = ComboConfig.from_layers(*layers, self.config.layer())
        except ValueError as exc:
            problems.append(("config", str(exc)))
        if canonical is not None and config is not None:
            try:
                validate_options(canonical, {**implied, **config.options}, n_targets=len(targets))
            except ValueError as exc:
                problems.append(("config.options", str(exc)))
        if problems or config is None:
            raise InvalidCombo(problems)
        try:
            return Combo(
                name=self.name, strategy=self.strategy, targets=tuple(targets), config=config
            )
        except ValueError as exc:
            raise InvalidCombo([("", str(exc))]) from None

    def reference_problems(self, providers: Mapping[str, str]) -> list[tuple[str, str]]:
        """Targets whose provider has no connection, or whose connection is unknown or of
        another provider. ``providers``: provider by connection id. A wildcard is fine as long
        as the provider has a connection (it may match nothing yet; routing reports that)."""
        known = set(providers.values())
        problems: list[tuple[str, str]] = []

        def check(path: str, t: ComboTargetSpec) -> None:
            if t.provider not in known:
                problems.append(
                    (f"{path}.provider", f"no connection of provider '{t.provider}' exists")
                )
            elif t.connection is not None and t.connection != "*":
                owner = providers.get(t.connection)
                if owner is None:
                    problems.append((f"{path}.connection", f"unknown connection '{t.connection}'"))
                elif owner != t.provider:
                    problems.append(
                        (
                            f"{path}.connection",
                            f"connection '{t.connection}' is of provider '{owner}', "
                            f"not '{t.provider}'",
                        )
                    )

        for j, t in enumerate(self.targets):
            check(f"targets.{j}", t)
        if self.config.judge is not None:
            check("config.judge", self.config.judge)
        if self.config.shadow is not None:
            for k, t in enumerate(self.config.shadow.targets):
                check(f"config.shadow.targets.{k}", t)
        return problems


class Config(_Strict):
    server: ServerConfig = Field(
        default_factory=ServerConfig,
        description="The gateway process: where it listens, request limits, defaults",
    )
    connections: list[ConnectionConfig] = Field(
        default_factory=list, description="Upstream provider accounts the gateway sends requests to"
    )
    keys: list[KeyConfig] = Field(
        default_factory=list,
        description=(
            "Client keys: who may call the gateway, and which models and connections each may use"
        ),
    )
    plans: dict[Id, list[DimensionConfig]] = Field(
        default_factory=dict,
        description=(
            "A connection's own quota plan by connection id (its dimensions), for a "
            "connection the catalogue has no plan for"
        ),
    )
    pools: list[PoolConfig] = Field(
        default_factory=list,
        description=(
            "Quota pools: connections whose limits are shared among client keys by weight"
        ),
    )
    prices: dict[ModelName, PriceConfig] = Field(
        default_factory=dict,
        description=(
            "Price overrides by model name (USD per million tokens), over the built-in price table"
        ),
    )
    combos: list[ComboSpec] = Field(
        default_factory=list,
        description=(
            "Named virtual models routed over several targets (priority, fallback, fusion, …)"
        ),
    )
    model_aliases: list[ModelAliasConfig] = Field(
        default_factory=list,
        description=(
            "Requested model names (or patterns) sent to another model, so clients work with "
            "their default model names; exact names first, then patterns in this order"
        ),
    )

    @classmethod
    def default(cls) -> Config:
        """The empty config: a gateway with nothing configured yet (all through the admin API)."""
        return cls()

    @field_validator("plans")
    @classmethod
    def _unique_plan_dims(
        cls, v: dict[str, list[DimensionConfig]]
    ) -> dict[str, list[DimensionConfig]]:
        for dims in v.values():
            unique_dimensions(dims)
        return v


def _no_duplicates(values: list[str], what: str) -> None:
    dups = sorted(v for v, n in Counter(values).items() if n > 1)
    if dups:
        raise ValueError(f"duplicate {what}: {', '.join(dups)}")


# -- errors -----------------------------------------------------------------------------------


class ConfigError(Exception):
    """Every problem of a config file; ``str()`` is one ``<path>: <message>`` per line (a problem
    of the whole file, such as malformed YAML, has no path). ``source`` is the file, if any."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{path}: {msg}" if path else msg for path, msg in self.problems)


def dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


def pydantic_problems(
    exc: ValidationError, skip_prefix: tuple[int | str, ...] = ()
) -> list[tuple[str, str]]:
    """(dotted path, message) per error; pydantic's ``Value error, `` prefix dropped. Input values
    are never included: they may be secrets."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = tuple(err["loc"])[len(skip_prefix) :]
        if loc and loc[-1] == "[key]":  # a bad mapping key: name the key itself
            loc = loc[:-1]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if (
            err["type"] == "string_pattern_mismatch"
            and (err.get("ctx") or {}).get("pattern") == ID_PATTERN
        ):
            msg = ID_MESSAGE
        out.append((dotted(loc), msg))
    return out


# -- env expansion ----------------------------------------------------------------------------

_VAR = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_string(value: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Expand ``${VAR}``/``${VAR:-default}``; returns the text and the missing variable names.

    ``${VAR:-default}`` uses the default when VAR is unset or empty (the shell's rule).
    """
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        got = env.get(name)
        if got:
            return got
        if default is not None:
            return default
        if got is None:
            missing.append(name)
            return ""
        return got

    return _VAR.sub(sub, value), missing


def expand_env(
    data: object, env: Mapping[str, str], path: tuple[int | str, ...] = ()
) -> tuple[object, list[tuple[str, str]]]:
    """Expand every string value of a parsed YAML tree; problems name the field."""
    problems: list[tuple[str, str]] = []
    if isinstance(data, str):
        text, missing = expand_string(data, env)
        problems.extend(
            (dotted(path), f"environment variable {name} is not set") for name in missing
        )
        return text, problems
    if isinstance(data, list):
        items = []
        for i, item in enumerate(data):
            v, p = expand_env(item, env, (*path, i))
            items.append(v)
            problems.extend(p)
        return items, problems
    if isinstance(data, dict):
        out: dict[object, object] = {}
        for k, item in data.items():
            v, p = expand_env(item, env, (*path, str(k)))
            out[k] = v
            problems.extend(p)
        return out, problems
    return data, problems


# -- loading ----------------------------------------------------------------------------------


def parse_config(data: object, env: Mapping[str, str], source: str | None = None) -> Config:
    """Validate a parsed YAML tree: env expansion, field rules, then cross-references."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", "the top level must be a mapping")], source)
    expanded, problems = expand_env(data, env)
    try:
        config = Config.model_validate(expanded)
    except ValidationError as exc:
        seen = {p for p, _ in problems}
        problems.extend(p for p in pydantic_problems(exc) if p[0] not in seen)
        raise ConfigError(problems, source) from None
    problems.extend(cross_check(config))
    if problems:
        raise ConfigError(problems, source)
    return config


def load_config_text(
    text: str, env: Mapping[str, str] | None = None, source: str | None = None
) -> Config:
    """Parse and validate YAML text (``env`` defaults to the process environment)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ConfigError([("", f"malformed YAML{where}: {problem}")], source) from None
    return parse_config(data, environment.snapshot() if env is None else env, source)


def load_config(path: str | Path, env: Mapping[str, str]) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([("", f"cannot read the file ({exc.strerror or exc})")], str(p)) from None
    return load_config_text(text, env, str(p))


def cross_check(config: Config) -> list[tuple[str, str]]:
    """Rules that span sections: unique ids, references that must exist, one provider per pool,
    a connection in at most one pool, combos the routing layer accepts."""
    problems: list[tuple[str, str]] = []

    def unique(section: str, ids: list[str]) -> None:
        seen: set[str] = set()
        for i, ident in enumerate(ids):
            if ident in seen:
                problems.append((f"{section}.{i}.id", f"duplicate id '{ident}'"))
            seen.add(ident)

    unique("connections", [c.id for c in config.connections])
    unique("keys", [k.id for k in config.keys])
    unique("pools", [p.id for p in config.pools])
    hashes: set[str] = set()
    for i, k in enumerate(config.keys):
        digest = k.key_hash or hash_key(k.secret or "")
        if digest in hashes:
            problems.append((f"keys.{i}", "the same secret is used by another key"))
        hashes.add(digest)

    conns = {c.id: c for c in config.connections}
    for i, k in enumerate(config.keys):
        for j, cid in enumerate(k.allowed_connections):
            if cid not in conns:
                where = f"keys.{i}.allowed_connections.{j}"
                problems.append((where, f"unknown connection '{cid}'"))
    for cid in config.plans:
        if cid not in conns:
            problems.append((f"plans.{cid}", f"unknown connection '{cid}'"))
    problems.extend(pool_problems(config))
    problems.extend(combo_problems(config))
    return problems


def pool_problems(config: Config) -> list[tuple[str, str]]:
    """Each pool: connections that exist, belong to no other pool and share one provider;
    allocations to keys that exist."""
    problems: list[tuple[str, str]] = []
    conns = {c.id: c for c in config.connections}
    keys = {k.id for k in config.keys}
    owner: dict[str, str] = {}
    for i, pool in enumerate(config.pools):
        providers: set[str] = set()
        for j, cid in enumerate(pool.connections):
            conn = conns.get(cid)
            if conn is None:
                problems.append((f"pools.{i}.connections.{j}", f"unknown connection '{cid}'"))
                continue
            providers.add(conn.provider)
            if cid in owner and owner[cid] != pool.id:
                problems.append(
                    (
                        f"pools.{i}.connections.{j}",
                        f"connection '{cid}' already belongs to pool '{owner[cid]}'",
                    )
                )
            owner.setdefault(cid, pool.id)
        if len(providers) > 1:
            problems.append(
                (
                    f"pools.{i}.connections",
                    f"connections of a pool must share one provider (got {sorted(providers)})",
                )
            )
        for j, alloc in enumerate(pool.allocations):
            if alloc.key not in keys:
                problems.append((f"pools.{i}.allocations.{j}.key", f"unknown key '{alloc.key}'"))
    return problems


def combo_problems(config: Config) -> list[tuple[str, str]]:
    """Each combo: a unique name, accepted by the routing layer, targets whose provider (and
    connection) the file configures."""
    problems: list[tuple[str, str]] = []
    providers = {c.id: c.provider for c in config.connections}
    names: dict[str, int] = {}
    for i, combo in enumerate(config.combos):
        if combo.name in names:
            problems.append(
                (
                    f"combos.{i}.name",
                    f"duplicate combo name '{combo.name}' (also combos.{names[combo.name]})",
                )
            )
        names.setdefault(combo.name, i)
        try:
            combo.to_combo()
        except InvalidCombo as exc:
            problems.extend((f"combos.{i}.{f}" if f else f"combos.{i}", m) for f, m in exc.problems)
        problems.extend((f"combos.{i}.{f}", m) for f, m in combo.reference_problems(providers))
    return problems
