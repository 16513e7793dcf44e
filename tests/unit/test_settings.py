"""The one settings object (fairgate.process.settings): DB > env > config file > default, field
by field; strict at start (a bad value names its variable), lenient when the DB settings are
re-read (a bad value is skipped and the next source wins)."""

from __future__ import annotations

import pytest

from fairgate.config import load_config_text
from fairgate.process.settings import Settings, SettingsError

FILE = load_config_text("server:\n  port: 3000\n  default_max_tokens: 77\n", env={})


def test_defaults() -> None:
    s = Settings.load({}).quota()
    assert (s.saturation_threshold, s.soft_deprioritize_factor, s.retention_days) == (0.5, 0.7, 14)
    assert s.retention_ms == 14 * 86_400_000
    assert (s.lease_ms, s.default_max_tokens) == (600_000, 1024)
    assert Settings.load({}).port == 20128


def test_db_over_env_over_file_over_default() -> None:
    assert Settings.load({}, FILE).port == 3000
    assert Settings.load({"FAIRGATE_PORT": "4000"}, FILE).port == 4000
    env = {"QUOTA_SATURATION_THRESHOLD": "0.8", "QUOTA_SOFT_DEPRIORITIZE_FACTOR": "0.5"}
    assert Settings.load(env).saturation_threshold == 0.8
    s = Settings.load(env, FILE, {"quota.saturationThreshold": "0.6"})
    assert (s.saturation_threshold, s.soft_deprioritize_factor) == (0.6, 0.5)
    assert s.quota().default_max_tokens == 77
    # the DB settings on top of what the CLI resolved at start, and off again
    start = Settings.load(env, FILE)
    assert start.with_db({"quota.saturationThreshold": "0.3"}).saturation_threshold == 0.3
    assert start.with_db({}).saturation_threshold == 0.8


def at(settings: Settings, path: str) -> object:
    """The setting at dotted ``path`` (``http.max_headers``)."""
    value: object = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(
    ("variable", "raw", "path", "value"),
    [
        # the HTTP edge (issue 19)
        ("FAIRGATE_HTTP_MAX_HEADER_BYTES", "8192", "http.max_header_bytes", 8192),
        ("FAIRGATE_HTTP_MAX_HEADERS", "20", "http.max_headers", 20),
        ("FAIRGATE_HTTP_HEADER_TIMEOUT_S", "2.5", "http.header_timeout_s", 2.5),
        ("FAIRGATE_HTTP_SILENT_TIMEOUT_S", "45", "http.silent_timeout_s", 45.0),
        ("FAIRGATE_HTTP_BODY_TIMEOUT_S", "30", "http.body_timeout_s", 30.0),
        ("FAIRGATE_HTTP_KEEP_ALIVE_S", "1", "http.keep_alive_s", 1.0),
        ("FAIRGATE_HTTP_SEND_TIMEOUT_S", "12", "http.send_timeout_s", 12.0),
        ("FAIRGATE_HTTP_MAX_CONNECTIONS", "50", "http.max_connections", 50),
        ("FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "3", "http.max_connections_per_address", 3),
        ("FAIRGATE_KEY_RATE_PER_S", "0", "http.key_rate_per_s", 0.0),
        ("FAIRGATE_KEY_RATE_BURST", "7", "http.key_rate_burst", 7),
        ("FAIRGATE_MAX_MESSAGES", "99", "http.max_messages", 99),
        ("FAIRGATE_MAX_MESSAGE_BYTES", "1000", "http.max_message_bytes", 1000),
        ("FAIRGATE_THREAD_PARSE_BYTES", "0", "http.thread_parse_bytes", 0),
        ("FAIRGATE_METRICS_KEY", " scrape ", "http.metrics_key", "scrape"),
        ("FAIRGATE_METRICS_PUBLIC", "yes", "http.metrics_public", True),
        ("FAIRGATE_ALLOWED_HOSTS", "gw.example.com", "http.allowed_hosts", "gw.example.com"),
        ("FAIRGATE_ADMIN_FREE_FAILURES", "2", "http.admin_free_failures", 2),
        ("FAIRGATE_ADMIN_BACKOFF_S", "0.5", "http.admin_backoff_s", 0.5),
        ("FAIRGATE_ADMIN_BACKOFF_MAX_S", "9", "http.admin_backoff_max_s", 9.0),
        ("FORWARDED_ALLOW_IPS", "10.0.0.0/8", "http.trusted_proxies", "10.0.0.0/8"),
        # resilience (SPEC §9)
        ("RESILIENCE_BREAKER_THRESHOLD", "0.75", "resilience.breaker_threshold", 0.75),
        ("RESILIENCE_BREAKER_MIN_REQUESTS", "10", "resilience.breaker_min_requests", 10),
        ("RESILIENCE_BREAKER_WINDOW_MS", "120000", "resilience.breaker_window_ms", 120_000),
        ("RESILIENCE_BREAKER_COOLDOWN_MS", "15000", "resilience.breaker_cooldown_ms", 15_000),
        ("RESILIENCE_OAUTH_BASE_COOLDOWN_MS", "7000", "resilience.oauth_base_cooldown_ms", 7_000),
        ("RESILIENCE_APIKEY_BASE_COOLDOWN_MS", "2000", "resilience.apikey_base_cooldown_ms", 2_000),
        ("RESILIENCE_MAX_COOLDOWN_MS", "600000", "resilience.max_cooldown_ms", 600_000),
        (
            "RESILIENCE_BREAKER_COUNTS_RATE_LIMITS",
            "true",
            "resilience.breaker_counts_rate_limits",
            True,
        ),
    ],
)
def test_each_variable_reaches_its_setting(
    variable: str, raw: str, path: str, value: object
) -> None:
    s = Settings.load({variable: raw})
    got = at(s, path)
    assert got == value
    assert type(got) is type(value)  # a count stays an int, seconds and fractions are floats
    assert got != at(Settings.load({}), path)  # the variable's value, not the default
    assert s.source_of(path) == "env"


def test_an_empty_value_is_unset() -> None:
    assert Settings.load({"FAIRGATE_PORT": " "}, FILE).port == 3000


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAIRGATE_PORT": "http"}, "FAIRGATE_PORT: Input should be a valid integer"),
        ({"FAIRGATE_PORT": "70000"}, "FAIRGATE_PORT: Input should be less than or equal to 65535"),
        ({"QUOTA_SATURATION_THRESHOLD": "1.5"}, "QUOTA_SATURATION_THRESHOLD: Input should be"),
        ({"QUOTA_CONSUMPTION_RETENTION_DAYS": "nan"}, "QUOTA_CONSUMPTION_RETENTION_DAYS: "),
        ({"QUOTA_LEASE_MS": "999"}, "QUOTA_LEASE_MS: Input should be greater than or equal"),
        ({"FAIRGATE_SHUTDOWN_TIMEOUT_S": "-1"}, "FAIRGATE_SHUTDOWN_TIMEOUT_S: "),
    ],
)
def test_a_bad_value_at_start_names_its_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match="^" + message.replace("(", r"\(")):
        Settings.load(env)


def test_bad_values_fall_through_when_lenient() -> None:
    env = {"QUOTA_SATURATION_THRESHOLD": "1.5", "QUOTA_CONSUMPTION_RETENTION_DAYS": "nan"}
    s = Settings.load(env, db={"quota.saturationThreshold": "abc"}, strict=False)
    assert s.saturation_threshold == 0.5
    assert s.consumption_retention_days == 14
    good = Settings.load({"QUOTA_SATURATION_THRESHOLD": "0.9"})
    assert good.with_db({"quota.saturationThreshold": "abc"}).saturation_threshold == 0.9


def test_lease_knob_env_db_and_range() -> None:
    assert Settings.load({"QUOTA_LEASE_MS": "2500"}).lease_ms == 2_500
    both = Settings.load({"QUOTA_LEASE_MS": "2500"}, db={"quota.leaseMs": "90000"})
    assert both.lease_ms == 90_000
    # below a second, above a day or not a number: ignored, the next source wins
    for bad in ("999", "86400001", "soon", "inf"):
        assert Settings.load({"QUOTA_LEASE_MS": bad}, strict=False).lease_ms == 600_000


def test_the_process_environment_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # pydantic-settings' own sources (os.environ, .env) are off: only the mappings given count
    monkeypatch.setenv("FAIRGATE_PORT", "4321")
    monkeypatch.setenv("PORT", "4321")
    assert Settings.load({}).port == 20128


def test_every_setting_says_where_it_comes_from_and_what_it_does() -> None:
    from fairgate.process.settings import leaves

    for name, info, origin in leaves(Settings):
        assert (info.description or "").strip(), name
        assert origin.db or origin.env or origin.file, name
    for name, info in Settings.model_fields.items():  # the areas too
        assert (info.description or "").strip(), name


def test_the_areas_read_their_variables() -> None:
    env = {
        "FAIRGATE_HTTP_MAX_HEADERS": "20",
        "QUOTA_STORE_DRIVER": "REDIS",
        "QUOTA_STORE_REDIS_PREFIX": "t1",
        "RESILIENCE_BREAKER_WINDOW_MS": "5000.0",
        "OTEL_SERVICE_NAME": "gw",
        "FAIRGATE_TEST_CLOCK_RATE": "0",
        "FAIRGATE_DATABASE_URL": "postgresql://h/db",
        "FAIRGATE_WORKER_METRICS_DIR": "/tmp/m",
    }
    s = Settings.load(env)
    assert s.http.max_headers == 20
    assert (s.store.driver, s.store.redis_prefix) == ("redis", "t1")
    assert s.resilience.breaker_window_ms == 5000
    assert s.tracing.service_name == "gw"
    assert s.test_clock.rate == "0"
    assert s.database_url == "postgresql://h/db"
    assert str(s.worker_metrics_dir) == "/tmp/m"
    # a DB setting wins over the environment inside an area as at the top
    assert s.with_db({"quotaStore.driver": "sqlite"}).store.driver == "sqlite"


def test_an_area_setting_at_start_names_its_variable() -> None:
    with pytest.raises(SettingsError, match=r"^FAIRGATE_HTTP_MAX_HEADERS: must be a whole"):
        Settings.load({"FAIRGATE_HTTP_MAX_HEADERS": "1.5"})
    with pytest.raises(SettingsError, match=r"^FAIRGATE_METRICS_PUBLIC: "):
        Settings.load({"FAIRGATE_METRICS_PUBLIC": "maybe"})
    # an empty value is unset, not an error: the default prefix
    assert Settings.load({"QUOTA_STORE_REDIS_PREFIX": " "}).store.redis_prefix == "fairgate"


def test_a_lenient_setting_is_skipped_with_a_warning_even_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = Settings.load(
        {"QUOTA_STORE_DRIVER": "reddis", "RESILIENCE_WARN_FRACTION": "3"},
        db={"resilience.warnFraction": "oops"},
    )
    assert (s.store.driver, s.resilience.warn_fraction) == ("sqlite", 0.1)
    assert "QUOTA_STORE_DRIVER='reddis' ignored (not a quota store driver" in caplog.text
    assert "RESILIENCE_WARN_FRACTION='3' ignored (must be a number from 0 to 1)" in caplog.text
    assert "DB setting resilience.warnFraction='oops' ignored" in caplog.text


def test_a_secret_never_shows_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    s = Settings.load({}, db={"quotaStore.redisUrl": 5})  # type: ignore[dict-item]
    assert s.store.redis_url is None
    assert "5" not in caplog.text.split("ignored")[0]


def test_where_each_setting_came_from() -> None:
    s = Settings.load({"QUOTA_STORE_DRIVER": "redis"}, FILE, {"quotaStore.redisUrl": "redis://h"})
    assert s.source_of("store.driver") == "env"
    assert s.source_of("store.redis_url") == "db"
    assert s.source_of("port") == "file"
    assert s.source_of("http.max_headers") == "default"


def test_log_level_and_format_in_any_case_and_a_typo_named() -> None:
    s = Settings.load({"FAIRGATE_LOG_LEVEL": "debug", "FAIRGATE_LOG_FORMAT": "TEXT"})
    assert (s.log_level, s.log_format) == ("DEBUG", "text")
    assert (Settings.load({}).log_level, Settings.load({}).log_format) == ("INFO", "json")
    with pytest.raises(SettingsError, match=r"^FAIRGATE_LOG_LEVEL: not a log level"):
        Settings.load({"FAIRGATE_LOG_LEVEL": "verbose"})
    with pytest.raises(SettingsError, match=r"^FAIRGATE_LOG_FORMAT: "):
        Settings.load({"FAIRGATE_LOG_FORMAT": "xml"})
    # a worker's lenient read keeps the default, as the old reader did
    assert Settings.load({"FAIRGATE_LOG_LEVEL": "verbose"}, strict=False).log_level == "INFO"


def test_the_admin_key_never_shows_in_the_settings_repr() -> None:
    s = Settings.load({"FAIRGATE_ADMIN_KEY": "k" * 40})
    assert s.admin_key == "k" * 40
    assert "k" * 40 not in repr(s)
