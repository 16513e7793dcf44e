"""The process's settings: one object, resolved once at start and passed down.

Each field says where it may come from (:class:`From`: a DB setting, an environment variable, a
path in the config file) and the rule for every field is the same: **DB setting > environment >
config file > built-in default** (docs/design-notes.md, "Configuration precedence"). The sources
are plain mappings handed to :meth:`Settings.load` (the CLI's one snapshot of the environment,
the parsed config file, the settings table), never ``os.environ`` or a ``.env`` file, so a test
builds any configuration from dicts and a running gateway never sees an edited environment.

Why pydantic-settings: its source protocol (:class:`~pydantic_settings.PydanticBaseSettingsSource`)
and the model's own validation give one definition per setting (type, range, default,
description: the docs' configuration reference lists them from here) instead of a parser per area.

Strict at start, lenient afterwards: the CLI loads ``strict`` and a bad value stops it with a
message naming the variable (exit 2), since a typo must not silently mean the default. The
gateway re-resolves with the DB settings (:meth:`Settings.with_db`) whenever they change; the
admin API validated them before storing (422 naming the field), so a stored value that no longer
validates is skipped with a warning and the next source wins, rather than taking the proxy down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, PrivateAttr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fairgate.config import Config
from fairgate.db.engine import DATABASE_URL_ENV
from fairgate.process.http_settings import EdgeSettings, SettingsError
from fairgate.process.tracing import TracingSettings
from fairgate.quota.settings import QuotaSettings
from fairgate.resilience.settings import ResilienceKnobs, ResilienceSettings
from fairgate.secretbox import ENV_VAR as SECRET_KEY_ENV
from fairgate.setting_source import From, Kind
from fairgate.store.settings import StoreSettings
from fairgate.testclock import TestClockSettings

__all__ = [
    "METRICS_DIR_ENV",
    "WORKER_SPEC_ENV",
    "From",
    "Settings",
    "SettingsError",
    "leaves",
]

#: ``serve --workers N``: how the parent hands each worker what to serve (JSON: config path,
#: data dir, bind address) and the directory of the group's metric files; uvicorn starts
#: workers with the parent's environment, so these travel there (``environment.export``) and
#: come back through the worker's settings (``worker_spec``, ``worker_metrics_dir``).
WORKER_SPEC_ENV = "FAIRGATE_WORKER_SPEC"
METRICS_DIR_ENV = "FAIRGATE_WORKER_METRICS_DIR"

log = logging.getLogger(__name__)

#: The ranges of the knobs the admin API also takes (``PUT /api/settings``): one definition.
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
RetentionDays = Annotated[float, Field(ge=0, le=3650, allow_inf_nan=False)]
LeaseMs = Annotated[int, Field(ge=1_000, le=86_400_000)]


def _log_level(value: object) -> object:
    """A level name as ``logging`` knows it, whatever its case (``debug``, ``WARNING``)."""
    if not isinstance(value, str):
        return value
    name = value.upper()
    if name not in logging.getLevelNamesMapping():
        raise ValueError(f"not a log level (one of {', '.join(_LEVELS)})")
    return name


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LogLevel = Annotated[str, BeforeValidator(_log_level)]
LogFormat = Annotated[
    Literal["json", "text"], BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v)
]

#: The sources from the highest precedence to the lowest (the default comes last).
PRECEDENCE: tuple[Kind, ...] = ("db", "env", "file")

#: A setting's place in the object: ``("port",)``, ``("http", "max_headers")``.
Path_ = tuple[str, ...]


def _origin(field: FieldInfo) -> From:
    return next((m for m in field.metadata if isinstance(m, From)), From())


def _spelled(kind: Kind, name: str) -> str:
    """How a message names a setting of ``kind``: the variable as the operator set it."""
    return {"db": f"DB setting {name}", "env": name, "file": f"config {name}"}[kind]


def _area(field: FieldInfo) -> type[BaseModel] | None:
    """The nested settings model of an area field (``http``, ``store``…), else None."""
    kind = field.annotation
    if isinstance(kind, type) and issubclass(kind, BaseModel) and not _origin(field).name("env"):
        return kind
    return None


def _leaves(model: type[BaseModel], prefix: Path_ = ()) -> Iterator[tuple[Path_, FieldInfo]]:
    """Every setting of ``model`` and of its areas, by path."""
    for name, field in model.model_fields.items():
        area = _area(field)
        if area is None:
            yield (*prefix, name), field
        else:
            yield from _leaves(area, (*prefix, name))


def leaves(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo, From]]:
    """Every setting of ``model`` as (dotted path, field, sources): the docs' table."""
    for path, field in _leaves(model):
        yield ".".join(path), field, _origin(field)


class _Source(PydanticBaseSettingsSource):
    """One source of raw values (a mapping of names to values), read by each setting's
    :class:`From` name for this source's kind. An empty string counts as unset."""

    def __init__(
        self, settings_cls: type[BaseSettings], kind: Kind, values: Mapping[str, Any]
    ) -> None:
        super().__init__(settings_cls)
        self.kind = kind
        self.values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        name = _origin(field).name(self.kind)
        raw = None if name is None else self.values.get(name)
        if isinstance(raw, str) and not raw.strip():
            raw = None
        return raw, name or field_name, False

    def __call__(self) -> dict[str, Any]:
        return _nested(self.by_path())

    def by_path(self) -> dict[Path_, Any]:
        out: dict[Path_, Any] = {}
        for path, field in _leaves(self.settings_cls):
            raw, _, _ = self.get_field_value(field, path[-1])
            if raw is not None:
                out[path] = raw.strip() if isinstance(raw, str) else raw
        return out


def _nested(flat: Mapping[Path_, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _field_at(model: type[BaseModel], path: Path_) -> FieldInfo:
    field = model.model_fields[path[0]]
    area = _area(field)
    return field if len(path) == 1 or area is None else _field_at(area, path[1:])


def _file_values(config: Config | None) -> dict[str, Any]:
    """The config file's settings by dotted path, only those the file sets itself (a field
    the file leaves out is the default, below the environment)."""
    if config is None:
        return {}
    server = config.server
    return {f"server.{name}": getattr(server, name) for name in server.model_fields_set}


class Settings(BaseSettings):
    """Every process setting with its sources, range, default and meaning."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", validate_default=False)

    port: Annotated[int, From(env="FAIRGATE_PORT", file="server.port")] = Field(
        default=20128, ge=1, le=65535, description="TCP port the gateway listens on"
    )
    data_dir: Annotated[Path, From(env="FAIRGATE_DATA_DIR")] = Field(
        default=Path("data"),
        description="The data directory: metadata DB, quota counters, the sealing key "
        "(`fairgate demo`: a temp dir unless set)",
    )
    config_path: Annotated[Path | None, From(env="FAIRGATE_CONFIG")] = Field(
        default=None,
        description="The YAML config file (unset: everything comes from the admin API)",
    )
    shutdown_timeout_s: Annotated[int, From(env="FAIRGATE_SHUTDOWN_TIMEOUT_S")] = Field(
        default=30,
        ge=0,
        le=86_400,
        description="How long a stop (SIGTERM) lets requests and streams in flight finish "
        "before it cuts them, in seconds; a supervisor's stop timeout must be longer "
        "([Deployment](../deploy.md))",
    )
    admin_key: Annotated[str | None, From(env="FAIRGATE_ADMIN_KEY")] = Field(
        default=None,
        repr=False,
        description="The admin API's key, at least 32 characters (shorter: `serve` and `demo` "
        "exit 2); unset: the admin API refuses everything (a client key gets 403); `fairgate "
        "demo` uses it when set, else prints a random one",
    )
    metadata_poll_ms: Annotated[int | None, From(env="FAIRGATE_METADATA_POLL_MS")] = Field(
        default=None,
        ge=0,
        description="How often a process reads the metadata change counter, in milliseconds "
        "(at least 10; unset: 250 on SQLite, 1000 on PostgreSQL, where NOTIFY comes first)",
    )
    admission_log_max_age_s: Annotated[int | None, From(env="FAIRGATE_ADMISSION_LOG_MAX_AGE_S")] = (
        Field(
            default=None,
            ge=0,
            description="How old an event of a Redis admission log may get before it is trimmed, "
            "and how long the log of a pool nobody admits to lives, in seconds (at least 60; "
            "unset: 7 days)",
        )
    )
    log_level: Annotated[LogLevel, From(env="FAIRGATE_LOG_LEVEL")] = Field(
        default="INFO", description="The log level (debug, info, warning, error, critical)"
    )
    log_format: Annotated[LogFormat, From(env="FAIRGATE_LOG_FORMAT")] = Field(
        default="json", description="json: one JSON object a line; text: human-readable lines"
    )
    saturation_threshold: Annotated[
        Fraction, From(db="quota.saturationThreshold", env="QUOTA_SATURATION_THRESHOLD")
    ] = Field(default=0.5, description="Pool use (fraction) from which fair shares are strict")
    soft_deprioritize_factor: Annotated[
        Fraction, From(db="quota.softDeprioritizeFactor", env="QUOTA_SOFT_DEPRIORITIZE_FACTOR")
    ] = Field(default=0.7, description="Score multiplier for soft-policy keys over their share")
    consumption_retention_days: Annotated[
        RetentionDays,
        From(db="quota.consumptionRetentionDays", env="QUOTA_CONSUMPTION_RETENTION_DAYS"),
    ] = Field(
        default=14.0,
        description="GC age in days of counter buckets (never inside 2 × window) and of "
        "active-key entries; the GC runs within 30 s of start, then hourly (±10 %)",
    )
    lease_ms: Annotated[LeaseMs, From(db="quota.leaseMs", env="QUOTA_LEASE_MS")] = Field(
        default=10 * 60_000,
        description="How long an unsettled reservation holds quota (a crashed replica's are "
        "reclaimed after it), in milliseconds",
    )
    default_max_tokens: Annotated[int, From(file="server.default_max_tokens")] = Field(
        default=1024,
        ge=1,
        description="Output tokens reserved for a request that sets no max_tokens (sent "
        "upstream as its limit)",
    )

    database_url: Annotated[str | None, From(env=DATABASE_URL_ENV)] = Field(
        default=None,
        repr=False,
        description="`postgresql://…`: the metadata DB in PostgreSQL, shared by every replica; "
        "unset: `fairgate.sqlite` in the data dir ([Deployment](../deploy.md))",
    )
    secret_key: Annotated[str | None, From(env=SECRET_KEY_ENV)] = Field(
        default=None,
        repr=False,
        description="Fernet key(s) (`fairgate secret-key` makes one), comma separated (the "
        "first seals, all open: how a key is rotated), for connection secrets and OAuth tokens "
        "at rest; unset: `<data dir>/secret.key` (SQLite), refused at start with PostgreSQL",
    )
    admin_key_file: Annotated[Path | None, From(env="FAIRGATE_ADMIN_KEY_FILE")] = Field(
        default=None,
        description="The admin CLI (`fairgate keys …`): a file holding the admin key, read "
        "when no `--admin-key` is given",
    )
    worker_spec: Annotated[str | None, From(env=WORKER_SPEC_ENV)] = Field(
        default=None,
        description="Internal (`serve --workers`): what the parent hands each worker to serve, "
        "as JSON",
    )
    worker_metrics_dir: Annotated[Path | None, From(env=METRICS_DIR_ENV)] = Field(
        default=None,
        description="Internal (`serve --workers`): the directory of the process group's metric "
        "files; unset: a process's metrics are its own",
    )
    http: EdgeSettings = Field(
        default_factory=EdgeSettings,
        description="The HTTP edge's limits ([Security](../security.md))",
    )
    store: StoreSettings = Field(
        default_factory=StoreSettings, description="The quota store: driver and tuning"
    )
    resilience: ResilienceKnobs = Field(
        default_factory=ResilienceKnobs,
        description="Breakers and cooldowns (also `GET /api/resilience/settings`)",
    )
    tracing: TracingSettings = Field(
        default_factory=TracingSettings,
        description="OpenTelemetry tracing, by the SDK's own variables",
    )
    test_clock: TestClockSettings = Field(
        default_factory=TestClockSettings,
        description="The test clock of a spawned process (tests only)",
    )

    _env: Mapping[str, str] = PrivateAttr(default_factory=dict)
    _file: Config | None = PrivateAttr(default=None)
    _came_from: Mapping[Path_, Kind] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what :meth:`load` resolved: never ``os.environ``, a ``.env`` or secrets dir."""
        return (init_settings,)

    @classmethod
    def load(
        cls,
        env: Mapping[str, str],
        file: Config | None = None,
        db: Mapping[str, str] | None = None,
        *,
        strict: bool = True,
    ) -> Settings:
        """The settings from ``db`` > ``env`` > ``file`` > default, setting by setting.

        ``strict``: a value that does not validate raises :class:`SettingsError` naming the
        variable (unless its :class:`From` is ``lenient``); else it is skipped with a warning
        and the next source wins."""
        sources = {
            "db": _Source(cls, "db", db or {}).by_path(),
            "env": _Source(cls, "env", env).by_path(),
            "file": _Source(cls, "file", _file_values(file)).by_path(),
        }
        while True:
            chosen: dict[Path_, Any] = {}
            came_from: dict[Path_, Kind] = {}
            for kind in reversed(PRECEDENCE):
                for path, raw in sources[kind].items():
                    chosen[path], came_from[path] = raw, kind
            try:
                settings = cls(**_nested(chosen))
            except ValidationError as exc:
                bad = _first_bad(exc, came_from)
                if bad is None:
                    raise
                path, kind, message = bad
                field = _field_at(cls, path)
                origin = _origin(field)
                where = _spelled(kind, origin.name(kind) or ".".join(path))
                if strict and not origin.lenient:
                    raise SettingsError(f"{where}: {message}") from None
                shown = "" if field.repr is False else f"={str(chosen[path])[:64]!r}"
                log.warning("%s%s ignored (%s); the next source applies", where, shown, message)
                del sources[kind][path]
                continue
            settings._env, settings._file, settings._came_from = env, file, came_from
            return settings

    def with_db(self, db: Mapping[str, str]) -> Settings:
        """These settings again with the DB settings on top (leniently: the admin API checked
        them when they were stored)."""
        return self.load(self._env, self._file, db, strict=False)

    def source_of(self, path: str) -> Kind | Literal["default"]:
        """Where the setting at dotted ``path`` (``store.driver``) came from."""
        return self._came_from.get(tuple(path.split(".")), "default")

    def quota(self) -> QuotaSettings:
        """The quota engine's knobs: the fields both name alike, and the retention (the
        environment's ``…_RETENTION_DAYS`` is the engine's ``retention_days``)."""
        ours = type(self).model_fields
        shared = {f.name: getattr(self, f.name) for f in fields(QuotaSettings) if f.name in ours}
        return QuotaSettings(**shared, retention_days=self.consumption_retention_days)

    def resilience_settings(self) -> ResilienceSettings:
        """The resilience manager's settings: these knobs and the DB's per-provider
        overrides."""
        return ResilienceSettings.from_knobs(self.resilience)


def _first_bad(
    exc: ValidationError, came_from: Mapping[Path_, Kind]
) -> tuple[Path_, Kind, str] | None:
    """(setting, source, message) of the first error a source's value caused."""
    for err in exc.errors(include_url=False, include_input=False):
        loc = tuple(str(part) for part in err["loc"])
        for end in range(len(loc), 0, -1):
            if loc[:end] in came_from:
                return (
                    loc[:end],
                    came_from[loc[:end]],
                    str(err["msg"]).removeprefix("Value error, "),
                )
    return None
