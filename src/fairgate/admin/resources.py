"""Admin routes of connections, client keys and settings.

Secrets are write-only: a connection's upstream secret is accepted but only ``hasSecret`` is ever
returned; a client key's secret is returned once, in the 201 of its creation, and only its hash is
stored; the Redis URL (it may hold a password) is reported as ``redisUrlConfigured`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, TypeVar, overload
from urllib.parse import urlsplit

from fastapi import APIRouter, Response

from fairgate.admin.common import (
    ERROR_RESPONSES,
    GW,
    STORE_RESPONSES,
    AdminError,
    invalid,
)
from fairgate.admin.models import (
    AccessSettingsOut,
    ConnectionIn,
    ConnectionOut,
    ConnectionPatch,
    ConnectionTestOut,
    KeyCreated,
    KeyIn,
    KeyOut,
    KeyPatch,
    QuotaKnobsOut,
    QuotaStoreSettingsOut,
    RateLimitOut,
    SettingsIn,
    SettingsOut,
)
from fairgate.db.common import transaction
from fairgate.db.keys import KeyRepo
from fairgate.db.seeding import connection_from_config
from fairgate.db.settings import REQUIRE_ALLOCATION, SettingsRepo, access_policy
from fairgate.domain.connections import AuthType, Connection, protocol_for
from fairgate.domain.keys import ClientKey
from fairgate.process import credentials
from fairgate.process.state import Gateway
from fairgate.providers.probe import probe_connection
from fairgate.providers.upstream import UpstreamClient

router = APIRouter(responses=ERROR_RESPONSES)


def _no_nulls(body: ConnectionPatch | KeyPatch, nullable: frozenset[str] = frozenset()) -> None:
    """PATCH: an absent field stays; ``null`` is only meaningful where the field is nullable."""
    fields = type(body).model_fields
    nulls = [n for n in body.model_fields_set if getattr(body, n) is None and n not in nullable]
    if nulls:
        raise invalid([(fields[n].alias or n, "may not be null") for n in nulls])


T = TypeVar("T")
V = TypeVar("V")


@overload
def _patched(stored: T, given: T | None) -> T: ...
@overload
def _patched(stored: T, given: V | None, convert: Callable[[V], T]) -> T: ...
def _patched(stored: Any, given: Any, convert: Callable[[Any], Any] | None = None) -> Any:
    """PATCH: a field left out (``None``: :func:`_no_nulls` refused an explicit ``null``)
    keeps the stored value; a given one replaces it, through ``convert`` into the record's
    type."""
    if given is None:
        return stored
    return given if convert is None else convert(given)


# -- connections ------------------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


def _origin_change_needs_credentials(c: Connection, body: ConnectionPatch) -> None:
    """A connection's credential goes only where it was given for (issue 43, N8): an admin is
    not trusted with secrets in clear, so pointing the stored secret at a host of their choice
    (then ``POST …/test``) would hand it over. A new origin (scheme, host, port) needs the
    secret again in the same change; an OAuth connection's tokens were issued for its
    provider, so its origin does not change (create a connection and log in)."""
    if body.base_url is None or _origin(body.base_url) == _origin(c.base_url):
        return
    if c.auth_type is AuthType.OAUTH:
        raise invalid(
            [
                (
                    "baseUrl",
                    "an OAuth connection's host cannot change: its tokens were issued for "
                    "this one (create a new connection and log in)",
                )
            ]
        )
    if body.secret is None and c.secret:
        raise invalid(
            [
                (
                    "secret",
                    "a new host for baseUrl needs the secret again: the stored one is only "
                    "sent where it was given for",
                )
            ]
        )


def _conn_out(gw: Gateway, c: Connection) -> ConnectionOut:
    tokens = None if gw.oauth is None else gw.oauth.tokens
    verdict = credentials.verdict(c, tokens, gw.clock.now_ms())
    return ConnectionOut.of(c, gw.connections().pool_of(c.id), verdict.as_json())


@router.get("/connections", tags=["connections"])
async def list_connections(gw: GW) -> list[ConnectionOut]:
    return [_conn_out(gw, c) for c in gw.connections().all()]


@router.post("/connections", status_code=201, tags=["connections"])
async def create_connection(body: ConnectionIn, gw: GW) -> ConnectionOut:
    conn = connection_from_config(body)
    gw.connections().create(conn)
    gw.reload()
    return _conn_out(gw, conn)


@router.get("/connections/{connection_id}", tags=["connections"])
async def get_connection(connection_id: str, gw: GW) -> ConnectionOut:
    return _conn_out(gw, gw.connections().get(connection_id))


@router.patch("/connections/{connection_id}", tags=["connections"])
async def patch_connection(connection_id: str, body: ConnectionPatch, gw: GW) -> ConnectionOut:
    """Fields given replace the stored ones; ``maxConcurrent: null`` means unlimited,
    ``protocol: null`` means "by provider"."""
    _no_nulls(body, frozenset({"max_concurrent", "protocol"}))
    given = body.model_fields_set
    repo = gw.connections()
    with transaction(gw.db):
        c = repo.get(connection_id)
        _origin_change_needs_credentials(c, body)
        provider = body.provider or c.provider
        if "protocol" in given:
            protocol = protocol_for(provider, body.protocol)
        elif c.protocol is not protocol_for(c.provider):
            protocol = c.protocol  # it was set explicitly: keep it
        else:
            protocol = protocol_for(provider)  # it followed the provider: follow the new one
        c = replace(
            c,
            provider=provider,
            base_url=body.base_url or c.base_url,
            secret=_patched(c.secret, body.secret),
            auth_type=_patched(c.auth_type, body.auth_type, AuthType),
            weight=_patched(c.weight, body.weight),
            max_concurrent=body.max_concurrent if "max_concurrent" in given else c.max_concurrent,
            models=_patched(c.models, body.models, tuple),
            enabled=_patched(c.enabled, body.enabled),
            protocol=protocol,
            forward_headers=_patched(c.forward_headers, body.forward_headers, tuple),
            billing_fields=_patched(c.billing_fields, body.billing_fields, tuple),
        )
        repo.update(c)
    gw.reload()
    return _conn_out(gw, c)


@router.post("/connections/{connection_id}/test", tags=["connections"])
async def test_connection(connection_id: str, gw: GW) -> ConnectionTestOut:
    """One cheap upstream call with the connection's secret (``GET <baseUrl>/models``: no
    tokens spent) and what it returned. An upstream failure is a reading (``ok: false``), not
    an error of this route."""
    conn = gw.connections().get(connection_id)
    async with UpstreamClient() as http:  # a pool of its own, closed with the call
        res = await probe_connection(conn, http, now_ms=gw.clock.now_ms())
    snap = res.rate_limit
    return ConnectionTestOut(
        connection_id=conn.id,
        ok=res.ok,
        status=res.status,
        latency_ms=round(res.latency_ms, 1),
        models=res.models,
        # the reading's request and token fields, read by their names
        rate_limit=None
        if snap is None
        else RateLimitOut.model_validate(snap, from_attributes=True),
        error=res.error,
    )


@router.delete("/connections/{connection_id}", status_code=204, tags=["connections"])
async def delete_connection(connection_id: str, gw: GW) -> Response:
    """Refused (409) while the connection is a pool member; its plan override goes with it."""
    gw.connections().delete(connection_id)
    gw.reload()
    return Response(status_code=204)


# -- client keys ------------------------------------------------------------------------------


def _check_connections(gw: Gateway, ids: list[str]) -> None:
    """An allow-list names existing connections (a typo would silently allow nothing)."""
    repo = gw.connections()
    bad = [
        (f"allowedConnections.{i}", f"unknown connection '{c}'")
        for i, c in enumerate(ids)
        if repo.find(c) is None
    ]
    if bad:
        raise invalid(bad)


def _key_out(gw: Gateway, k: ClientKey) -> KeyOut:
    return KeyOut.of(k, gw.key_last_used.get(k.id))


def _created(key: ClientKey, secret: str) -> KeyCreated:
    return KeyCreated(**KeyOut.of(key).model_dump(), secret=secret)


@router.get("/keys", tags=["keys"])
async def list_keys(gw: GW) -> list[KeyOut]:
    return [_key_out(gw, k) for k in KeyRepo(gw.db).all()]


@router.post("/keys", status_code=201, tags=["keys"])
async def create_key(body: KeyIn, gw: GW) -> KeyCreated:
    """Creates a key; the response carries its secret, the only time it is ever shown."""
    _check_connections(gw, body.allowed_connections)
    key, secret = KeyRepo(gw.db).create(
        body.name,
        body.allowed_models,
        key_id=body.id,
        enabled=body.enabled,
        allowed_connections=body.allowed_connections,
        allowed_providers=body.allowed_providers,
    )
    gw.reload()
    return _created(key, secret)


@router.get("/keys/{key_id}", tags=["keys"])
async def get_key(key_id: str, gw: GW) -> KeyOut:
    return _key_out(gw, KeyRepo(gw.db).get(key_id))


@router.post("/keys/{key_id}/rotate", tags=["keys"])
async def rotate_key(key_id: str, gw: GW) -> KeyCreated:
    """A new secret for the key, returned this once; the old secret stops working at once. The
    key keeps its id, name, allowed models and its allocations in every pool."""
    key, secret = KeyRepo(gw.db).rotate(key_id)
    gw.reload()
    return _created(key, secret)


@router.patch("/keys/{key_id}", tags=["keys"])
async def patch_key(key_id: str, body: KeyPatch, gw: GW) -> KeyOut:
    _no_nulls(body)
    repo = KeyRepo(gw.db)
    with transaction(gw.db):
        k = repo.get(key_id)
        _check_connections(gw, body.allowed_connections or [])
        k = replace(
            k,
            name=k.name if body.name is None else (body.name or k.id),
            allowed_models=_patched(k.allowed_models, body.allowed_models, tuple),
            allowed_connections=_patched(
                k.allowed_connections, body.allowed_connections, frozenset
            ),
            allowed_providers=_patched(k.allowed_providers, body.allowed_providers, frozenset),
            enabled=_patched(k.enabled, body.enabled),
        )
        repo.update(k)
    gw.reload()
    return _key_out(gw, k)


@router.delete("/keys/{key_id}", status_code=204, tags=["keys"])
async def delete_key(key_id: str, gw: GW) -> Response:
    """The key stops working at once; its allocations go with it."""
    KeyRepo(gw.db).delete(key_id)
    gw.reload()
    return Response(status_code=204)


# -- settings ---------------------------------------------------------------------------------

_DB_KEYS = {
    ("quota_store", "driver"): "quotaStore.driver",
    ("quota_store", "redis_url"): "quotaStore.redisUrl",
    ("quota", "saturation_threshold"): "quota.saturationThreshold",
    ("quota", "soft_deprioritize_factor"): "quota.softDeprioritizeFactor",
    ("quota", "consumption_retention_days"): "quota.consumptionRetentionDays",
    ("access", "require_allocation"): REQUIRE_ALLOCATION,
}


def _settings_out(gw: Gateway) -> SettingsOut:
    db = SettingsRepo(gw.db).all()
    policy = access_policy(db, gw.config.server.require_allocation)
    choice, q = gw.store_choice, gw.quota_settings
    current = gw.settings.with_db(db)
    driver_source = current.source_of("store.driver")
    url_from = current.source_of("store.redis_url")
    url_source: Literal["db", "env"] | None = url_from if url_from in ("db", "env") else None
    if driver_source == "file":  # the quota store is not a config file section
        driver_source = "default"
    return SettingsOut(
        quota_store=QuotaStoreSettingsOut(
            requested_driver=choice.requested,
            active_driver=choice.driver,
            fallback_reason=choice.fallback_reason,
            redis_url_configured=url_source is not None,
            redis_url_source=url_source,
            driver_source=driver_source,
        ),
        quota=QuotaKnobsOut(
            saturation_threshold=q.saturation_threshold,
            soft_deprioritize_factor=q.soft_deprioritize_factor,
            consumption_retention_days=q.retention_days,
        ),
        access=AccessSettingsOut(require_allocation=policy.required, source=policy.source),
    )


@router.get("/settings", tags=["settings"])
async def get_settings(gw: GW) -> SettingsOut:
    return _settings_out(gw)


@router.put("/settings", tags=["settings"], responses=STORE_RESPONSES)
async def put_settings(body: SettingsIn, gw: GW) -> SettingsOut:
    """Store the given settings (``null`` clears one: the environment or the default applies),
    then re-choose the quota store and re-read the knobs, without a restart. A Redis that cannot
    be reached falls back to SQLite; the response says so in ``fallbackReason``."""
    repo = SettingsRepo(gw.db)
    with transaction(gw.db):
        for section_name in body.model_fields_set:
            section = getattr(body, section_name)
            if section is None:
                alias = SettingsIn.model_fields[section_name].alias or section_name
                raise invalid([(alias, "may not be null")])
            for name in section.model_fields_set:
                db_key = _DB_KEYS[(section_name, name)]
                value = getattr(section, name)
                if value is None:
                    repo.delete(db_key)
                else:
                    repo.set(db_key, str(value).lower() if isinstance(value, bool) else str(value))
    if "access" in body.model_fields_set:
        gw.reload()  # who may use what is part of the registry snapshot
    if "quota_store" not in body.model_fields_set:
        gw.refresh_settings()
        return _settings_out(gw)
    try:
        await gw.reload_store()
    except Exception as exc:
        reason = type(exc).__name__
        raise AdminError(503, f"The quota store could not be reopened ({reason})") from None
    return _settings_out(gw)
