"""A restart never undoes what the admin API did (issue 49): the config file seeds what does not
exist yet; a key rotated or revoked, a pool or an allocation edited through the admin API stay
so across a restart, on both metadata engines and across two gateways sharing PostgreSQL. An
authoritative file overwrites such edits, but never brings a retired key secret back; ``/health``
says the mode and what differs.

Each test runs the real app in-process (admin API, registry, metadata DB), stops it and starts
it again on the same data (a restart), with the same file."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from inproc_support import ADMIN, ALICE, BOB, Harness, base_config, conn, gateway

from fairgate.db.watch import read_version
from fairgate.secretbox import SecretBox
from fairgate.timers import ManualTimer

#: the key of the secrets at rest shared by gateways on one PostgreSQL (required there)
SHARED_KEY = SecretBox.generate_key().decode()

POOL: dict[str, Any] = {
    "id": "shared",
    "name": "Shared",
    "connections": ["m1"],
    "dimensions": [{"unit": "requests", "window": "daily", "limit": 1000}],
    "allocations": [
        {"key": "alice", "weight": 50, "policy": "hard"},
        {"key": "bob", "weight": 50, "policy": "hard"},
    ],
}
CONFIG = base_config([conn("m1"), conn("m2")], pools=[POOL])


def _env(metadata_url: str | None) -> dict[str, str]:
    if metadata_url is None:
        return {}
    return {"FAIRGATE_DATABASE_URL": metadata_url, "FAIRGATE_SECRET_KEY": SHARED_KEY}


@contextlib.asynccontextmanager
async def started(
    data_dir: Path, metadata_url: str | None, config: dict[str, Any] = CONFIG
) -> AsyncIterator[Harness]:
    """One start of the gateway on ``data_dir`` (and the shared DB, if any) with ``config``."""
    async with gateway(data_dir, config, ManualTimer(), env=_env(metadata_url)) as h:
        yield h


async def status_with(h: Harness, secret: str) -> int:
    """``GET /v1/models`` with a client key: 200 for a key the gateway knows, 401 otherwise."""
    r = await h.client.get("/v1/models", headers={"authorization": f"Bearer {secret}"})
    return r.status_code


async def pool(h: Harness) -> dict[str, Any]:
    r = await h.client.get("/api/quota/pools/shared", headers=ADMIN)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def weights(p: dict[str, Any]) -> dict[str, float]:
    return {a["key"]: a["weight"] for a in p["allocations"]}


async def test_a_rotated_key_keeps_its_new_secret_after_a_restart(
    tmp_path: Path, metadata_url: str | None
) -> None:
    async with started(tmp_path, metadata_url) as h:
        r = await h.client.post("/api/keys/alice/rotate", headers=ADMIN)
        assert r.status_code == 200, r.text
        new = r.json()["secret"]
        assert await status_with(h, ALICE) == 401
    async with started(tmp_path, metadata_url) as h:
        assert await status_with(h, ALICE) == 401
        assert await status_with(h, new) == 200


async def test_a_revoked_key_stays_revoked_after_a_restart(
    tmp_path: Path, metadata_url: str | None
) -> None:
    async with started(tmp_path, metadata_url) as h:
        assert (await h.client.delete("/api/keys/alice", headers=ADMIN)).status_code == 204
    async with started(tmp_path, metadata_url) as h:
        assert await status_with(h, ALICE) == 401
        assert (await h.client.get("/api/keys/alice", headers=ADMIN)).status_code == 404
        assert await status_with(h, BOB) == 200


async def test_an_allocation_edited_through_the_api_is_kept_after_a_restart(
    tmp_path: Path, metadata_url: str | None
) -> None:
    allocations = [
        {"key": "alice", "weight": 80, "policy": "hard"},
        {"key": "bob", "weight": 20, "policy": "soft"},
    ]
    async with started(tmp_path, metadata_url) as h:
        r = await h.client.patch(
            "/api/quota/pools/shared", json={"allocations": allocations}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
    async with started(tmp_path, metadata_url) as h:
        assert weights(await pool(h)) == {"alice": 80, "bob": 20}


async def test_a_pool_edited_through_the_api_is_kept_after_a_restart(
    tmp_path: Path, metadata_url: str | None
) -> None:
    dims = [{"unit": "tokens", "window": "hourly", "limit": 5000}]
    async with started(tmp_path, metadata_url) as h:
        r = await h.client.patch(
            "/api/quota/pools/shared",
            json={"name": "Renamed", "dimensions": dims, "connections": ["m1", "m2"]},
            headers=ADMIN,
        )
        assert r.status_code == 200, r.text
    async with started(tmp_path, metadata_url) as h:
        p = await pool(h)
        assert p["name"] == "Renamed"
        assert p["connections"] == ["m1", "m2"]
        assert [(d["unit"], d["limit"]) for d in p["dimensions"]] == [("tokens", 5000)]


async def test_a_restart_of_one_replica_keeps_what_another_changed(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two gateways on one PostgreSQL: B restarting with the file must not revert A's writes
    for the whole cluster (it did: the allocation, the rotated key and the revoked key)."""
    async with started(tmp_path / "a", postgres_url) as a:
        async with started(tmp_path / "b", postgres_url):
            allocations = [{"key": "alice", "weight": 90}, {"key": "bob", "weight": 10}]
            r = await a.client.patch(
                "/api/quota/pools/shared", json={"allocations": allocations}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
            rotated = (await a.client.post("/api/keys/alice/rotate", headers=ADMIN)).json()
            assert (await a.client.delete("/api/keys/bob", headers=ADMIN)).status_code == 204
        async with started(tmp_path / "b", postgres_url) as b:  # B restarts; A keeps running
            for g in (b, a):
                a.gw.reload()  # what A's watcher does on B's writes, if B wrote anything
                assert weights(await pool(g)) == {"alice": 90}
                assert await status_with(g, ALICE) == 401
                assert await status_with(g, rotated["secret"]) == 200
                assert await status_with(g, BOB) == 401


@pytest.mark.parametrize("edit", ["allocations", "rotate", "revoke"])
async def test_an_unchanged_file_writes_nothing_at_a_restart_after_an_api_change(
    tmp_path: Path, edit: str
) -> None:
    """The docs' promise: once the API changed something, restarting with the same file
    changes nothing in the database (the change counter does not move)."""
    async with started(tmp_path, None) as h:
        if edit == "allocations":
            body = {"allocations": [{"key": "alice", "weight": 1}]}
            r = await h.client.patch("/api/quota/pools/shared", json=body, headers=ADMIN)
        elif edit == "rotate":
            r = await h.client.post("/api/keys/alice/rotate", headers=ADMIN)
        else:
            r = await h.client.delete("/api/keys/alice", headers=ADMIN)
        assert r.status_code < 300, r.text
        before = read_version(h.gw.db)
    async with started(tmp_path, None) as h:
        assert read_version(h.gw.db) == before


AUTHORITATIVE = {**CONFIG, "server": {"config_mode": "authoritative"}}


async def test_an_authoritative_file_overwrites_what_the_api_changed_but_never_a_retired_key(
    tmp_path: Path, metadata_url: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    async with started(tmp_path, metadata_url, AUTHORITATIVE) as h:
        body = {"allocations": [{"key": "alice", "weight": 90}, {"key": "bob", "weight": 10}]}
        assert (
            await h.client.patch("/api/quota/pools/shared", json=body, headers=ADMIN)
        ).status_code == 200
        rotated = (await h.client.post("/api/keys/alice/rotate", headers=ADMIN)).json()["secret"]
        assert (await h.client.delete("/api/keys/bob", headers=ADMIN)).status_code == 204
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fairgate"):
        async with started(tmp_path, metadata_url, AUTHORITATIVE) as h:
            assert weights(await pool(h)) == {"alice": 50}  # the file's again; bob is gone
            assert await status_with(h, ALICE) == 401  # the rotated-away secret stays dead
            assert await status_with(h, rotated) == 200
            assert await status_with(h, BOB) == 401  # revoked: not created again
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert any(lvl == logging.WARNING and "is authoritative" in m for lvl, m in said)
    assert (
        logging.WARNING,
        "config file (authoritative): overwriting allocations of pool shared (alice), "
        "changed through the admin API",
    ) in said
    assert any("key bob: its secret in the file was rotated away or revoked" in m for _, m in said)
    for _, m in said:
        assert ALICE not in m
        assert rotated not in m


async def test_health_says_the_mode_and_what_differs_from_the_file(tmp_path: Path) -> None:
    async with started(tmp_path, None) as h:
        health = (await h.client.get("/health")).json()
        assert health["configFile"] == {"mode": "seed", "differences": []}
        body = {"allocations": [{"key": "alice", "weight": 90}, {"key": "bob", "weight": 10}]}
        assert (
            await h.client.patch("/api/quota/pools/shared", json=body, headers=ADMIN)
        ).status_code == 200
        (diff,) = (await h.client.get("/health")).json()["configFile"]["differences"]
        assert diff == {
            "kind": "allocations",
            "id": "shared",
            "action": "kept",
            "fields": ["alice", "bob"],
            "message": "allocations of pool shared (alice, bob): changed or created through the "
            "admin API; the database's state is kept",
        }
        assert health["status"] == "ok"  # a difference is no fault
    async with started(tmp_path, None) as h:  # the same after a restart, which kept it
        (again,) = (await h.client.get("/health")).json()["configFile"]["differences"]
        assert again == diff
