"""A restart keeps what the admin API did (issue 49), over real processes: ``fairgate serve``
stopped with SIGTERM and started again on the same data with the same config file. A key rotated
because it leaked keeps its new secret (the old one 401), a revoked key stays revoked, an
allocation edited through the API stays; and with two replicas on one PostgreSQL, a replica
that restarts with the file reverts nothing for the cluster.

(The same facts are tested in-process, on both engines, in
tests/inproc/test_config_restart_inproc.py; here the config file is read from disk by the CLI,
and the processes are separate.)"""

from __future__ import annotations

import httpx
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN

KEYS = ("k1", "k2")
POOLS = (
    "pools:\n"
    "  - id: shared\n"
    "    connections: [mock-1]\n"
    "    dimensions: [{unit: requests, window: daily, limit: 1000}]\n"
    "    allocations:\n"
    "      - {key: k1, weight: 50, policy: hard}\n"
    "      - {key: k2, weight: 50, policy: hard}\n"
)


def _status(gw: Proc, secret: str) -> int:
    """``GET /v1/models`` with a client key: 200 for a key the gateway knows, 401 otherwise."""
    r = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=10)
    return r.status_code


def _change_through_the_api(gw: Proc) -> str:
    """Rotate k1, revoke k2, give k1 the whole pool; the new secret of k1."""
    with httpx.Client(base_url=gw.url, headers=ADMIN, timeout=10) as api:
        rotated = api.post("/api/keys/k1/rotate")
        assert rotated.status_code == 200, rotated.text
        assert api.delete("/api/keys/k2").status_code == 204
        body = {"allocations": [{"key": "k1", "weight": 100, "policy": "soft"}]}
        r = api.patch("/api/quota/pools/shared", json=body)
        assert r.status_code == 200, r.text
        return str(rotated.json()["secret"])


def _assert_kept(gw: Proc, keys: dict[str, str], new_k1: str) -> None:
    assert _status(gw, keys["k1"]) == 401  # the leaked secret never comes back
    assert _status(gw, new_k1) == 200
    assert _status(gw, keys["k2"]) == 401  # revoked stays revoked
    with httpx.Client(base_url=gw.url, headers=ADMIN, timeout=10) as api:
        pool = api.get("/api/quota/pools/shared").json()
        assert [(a["key"], a["weight"], a["policy"]) for a in pool["allocations"]] == [
            ("k1", 100, "soft")
        ]
        config = api.get("/health").json()["configFile"]
    assert config["mode"] == "seed"
    assert {(d["kind"], d["id"]) for d in config["differences"]} == {
        ("key", "k1"),  # the file's secret was rotated away
        ("key", "k2"),  # revoked
        ("allocations", "shared"),
    }


def test_a_restart_keeps_what_the_admin_api_did(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(mock_upstream.url, POOLS, keys)
    gw = start_gateway(config)
    new_k1 = _change_through_the_api(gw)
    gw.stop()
    again = start_gateway(config, data_dir=gw.data_dir)
    _assert_kept(again, keys, new_k1)
    assert "seeded from config" not in again.output()  # an unchanged file wrote nothing


def test_a_replica_restarting_on_postgres_reverts_nothing_for_the_cluster(
    mock_upstream: Proc, start_gateway: GatewayFactory, postgres_url: str
) -> None:
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(mock_upstream.url, POOLS, keys)
    env = {"FAIRGATE_DATABASE_URL": postgres_url}
    a = start_gateway(config, extra_env=env)
    b = start_gateway(config, extra_env=env)
    new_k1 = _change_through_the_api(a)
    b.stop()
    b = start_gateway(config, extra_env=env, data_dir=b.data_dir)
    for gw in (b, a):
        _assert_kept(gw, keys, new_k1)
