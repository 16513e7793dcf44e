"""Security promises through the real gateway (issue 8, "Security").

- Requests without a key or with a wrong one never reach the upstream (the mock counts nothing).
- The admin API refuses client keys (and the upstream's secret, and wrong keys).
- A scripted session exercises answers, streams, client errors, the gateway's own 429s, the
  upstream's 429s, an upstream that rejects the gateway's credentials (401), and admin calls
  (including creating a key and a connection); then every log line of the gateway process, every
  error body, every API response (headers included), the dashboard page, its assets and the JSON
  the dashboard shows are scanned: no upstream secret, no client key, no admin key.
- Client keys are stored hashed: no byte of the data directory (metadata DB, its WAL, the quota
  store) holds a plaintext key, and the stored hash is the SHA-256 of the secret.
- The time to reject a wrong key does not depend on how many leading characters it shares with
  a real one (measured in-process on ``Registry.authenticate``).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import statistics
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest
from e2e_support import ADMIN_KEY, FAULTS, UPSTREAM_SECRET, GatewayFactory, Proc, new_secret

from fairgate.domain.keys import ClientKey, hash_key
from fairgate.snapshot import Registry

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def mock(mock_upstream: Proc) -> Iterator[Proc]:
    httpx.post(mock_upstream.url + "/_mock/reset")
    yield mock_upstream
    httpx.post(mock_upstream.url + "/_mock/reset")


@dataclass
class Secrets:
    """Every secret of the session. Two of them carry no recognisable prefix (no ``sk-``, no
    ``fg-``), so the scan does not pass merely because the log redactor's patterns know them."""

    k1: str = field(default_factory=new_secret)
    k2: str = field(default_factory=lambda: "cli" + uuid.uuid4().hex + uuid.uuid4().hex[:8])
    wrong_upstream: str = field(default_factory=lambda: "xq" + uuid.uuid4().hex)
    new_upstream: str = field(default_factory=lambda: "sk-new-" + uuid.uuid4().hex)
    patched_upstream: str = field(default_factory=lambda: "pq" + uuid.uuid4().hex)
    created_keys: list[str] = field(default_factory=list)

    def all(self) -> dict[str, str]:
        out = {
            "upstream": UPSTREAM_SECRET,
            "admin": ADMIN_KEY,
            "k1": self.k1,
            "k2": self.k2,
            "wrong upstream": self.wrong_upstream,
            "new upstream": self.new_upstream,
            "patched upstream": self.patched_upstream,
        }
        out.update({f"created key {i}": s for i, s in enumerate(self.created_keys)})
        return out

    def client_keys(self) -> list[str]:
        return [self.k1, self.k2, *self.created_keys]


def config(mock_url: str, s: Secrets) -> str:
    return (
        "connections:\n"
        f"  - {{id: mock-1, provider: mock, base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini]}\n"
        f"  - {{id: mock-free, provider: mock, base_url: '{mock_url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [free-model]{FAULTS}}}\n"
        # the upstream does not know this credential: every request there is a 401
        f"  - {{id: bad-auth, provider: mock, base_url: '{mock_url}/v1',"
        f" secret: '{s.wrong_upstream}', models: [locked-model]}}\n"
        f"  - {{id: claude-1, provider: anthropic, base_url: '{mock_url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [claude-sonnet-4]}}\n"
        "keys:\n"
        f"  - {{id: k1, name: k1, secret: '{s.k1}', allowed_connections: [mock-free, bad-auth]}}\n"
        f"  - {{id: k2, name: k2, secret: '{s.k2}', allowed_connections: [claude-1]}}\n"
        "pools:\n  - {id: p1, name: P1, connections: [mock-1],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 4}],\n"
        "     allocations: [{key: k1, weight: 100}]}\n"
    )


class Recorder:
    """Every response of the session, kept for the scan."""

    def __init__(self, gw: Proc) -> None:
        self.gw = gw
        self.http = httpx.Client(base_url=gw.url, timeout=15)
        self.seen: list[tuple[str, str]] = []  # (what, headers and body)
        self.statuses: dict[str, int] = {}

    def close(self) -> None:
        self.http.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        record: bool = True,
        headers: dict[str, str] | None = None,
        json: object = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        resp = self.http.request(method, path, headers=headers, json=json, content=content)
        if record:
            headers = "\n".join(f"{k}: {v}" for k, v in resp.headers.items())
            self.seen.append((f"{method} {path} → {resp.status_code}", headers + "\n" + resp.text))
        label = f"{resp.status_code}"
        self.statuses[label] = self.statuses.get(label, 0) + 1
        return resp

    def chat(
        self,
        key: str,
        model: str = "gpt-4o-mini",
        headers: dict[str, str] | None = None,
        **extra: object,
    ) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        return self.send(
            "POST",
            "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}", **(headers or {})},
        )


def mock_requests(mock: Proc) -> int:
    return int(httpx.get(mock.url + "/_mock/stats").json()["requests"])


def tails(secret: str) -> list[str]:
    """The secret, its first and its last 16 characters (a truncated echo is a leak too; no
    character of a client key is shown on purpose any more: a key is shown by its id)."""
    return [secret, secret[:16], secret[-16:]]


def test_security_session_leaks_no_secret_and_keys_are_hashed(
    mock: Proc, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    s = Secrets()
    # this session presents many wrong admin keys on purpose: no backoff here (its own test
    # is in test_http_limits.py)
    gw = start_gateway(config(mock.url, s), extra_env={"FAIRGATE_ADMIN_FREE_FAILURES": "1000"})
    rec = Recorder(gw)
    try:
        _session(rec, mock, s)
    finally:
        rec.close()
    gw.stop()  # flush everything the process logs at shutdown too

    # -- the scan -----------------------------------------------------------------------------
    log = gw.output()
    assert log.count("\n") >= 5  # the session really produced log lines
    texts = [("gateway log", log), *rec.seen]
    leaks = [
        (what, name)
        for what, text in texts
        for name, secret in s.all().items()
        for piece in tails(secret)
        if piece in text
    ]
    assert leaks == []
    assert "Traceback" not in log

    # -- client keys are stored hashed ----------------------------------------------------------
    assert gw.data_dir is not None
    files = [p for p in gw.data_dir.rglob("*") if p.is_file()]
    assert any(p.name == "fairgate.sqlite" for p in files)
    for p in files:  # the DBs, their WAL and shm files: raw bytes, so nothing escapes the scan
        raw = p.read_bytes()
        for key in s.client_keys():
            assert key.encode() not in raw, f"plaintext client key in {p.name}"
            assert key[-16:].encode() not in raw, f"part of a client key in {p.name}"
    db = sqlite3.connect(gw.data_dir / "fairgate.sqlite")
    try:
        stored = dict(db.execute("SELECT id, key_hash FROM client_keys").fetchall())
    finally:
        db.close()
    assert stored["k1"] == hashlib.sha256(s.k1.encode()).hexdigest()
    assert stored["k2"] == hashlib.sha256(s.k2.encode()).hexdigest()
    assert set(stored.values()) >= {hashlib.sha256(k.encode()).hexdigest() for k in s.created_keys}
    with capsys.disabled():
        print(
            f"\n[security] scanned {len(texts)} texts ({sum(len(t) for _, t in texts)} chars) "
            f"for {len(s.all())} secrets: no leak; statuses {dict(sorted(rec.statuses.items()))}"
        )


def _session(rec: Recorder, mock: Proc, s: Secrets) -> None:
    # -- no key, wrong keys: nothing reaches the upstream ------------------------------------------
    before = mock_requests(mock)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    wrong = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic " + s.k1},
        {"Authorization": f"Bearer {s.k1[:-1]}"},  # one character short
        {"Authorization": f"Bearer {s.k1}x"},
        {"Authorization": f"Bearer {s.k1.upper()}"},
        {"Authorization": f"Bearer {UPSTREAM_SECRET}"},  # the upstream's own secret
        {"Authorization": f"Bearer {ADMIN_KEY}"},  # the admin key is not a client key
        {"x-api-key": s.k2[:30] + "0" * (len(s.k2) - 30)},  # a real key's first 30 characters
        {"x-api-key": s.wrong_upstream},
    ]
    for headers in wrong:
        for path, payload in (
            ("/v1/chat/completions", body),
            ("/v1/messages", {**body, "model": "claude-sonnet-4", "max_tokens": 5}),
            ("/v1/embeddings", {"model": "gpt-4o-mini", "input": "hi"}),
        ):
            r = rec.send("POST", path, json=payload, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["message"]
        assert rec.send("GET", "/v1/models", headers=headers).status_code == 401
    assert mock_requests(mock) == before

    # -- the admin API refuses client keys and other secrets --------------------------------------
    for key in (s.k1, s.k2, UPSTREAM_SECRET, s.wrong_upstream, "nope"):
        for headers in ({"Authorization": f"Bearer {key}"}, {"x-admin-key": key}):
            r = rec.send("GET", "/api/keys", headers=headers)
            # a client key is a known caller without the right (403); the rest are unknown
            client = key in (s.k1, s.k2)
            assert r.status_code == (403 if client else 401), r.text
            if client:
                assert "Client keys cannot use the admin API" in r.json()["error"]["message"]
                assert "www-authenticate" not in r.headers
        r = rec.send(
            "POST", "/api/keys", json={"name": "evil"}, headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status_code == (403 if key in (s.k1, s.k2) else 401)

    # -- a session with answers, streams, errors and 429s ------------------------------------------
    k1 = s.k1
    assert rec.chat(k1).status_code == 200
    r = rec.chat(k1, stream=True)
    assert r.status_code == 200
    assert "data:" in r.text
    r = rec.chat(k1, "free-model", headers={"x-mock-fault": "429:1"})  # the upstream's 429
    assert r.status_code == 429
    assert r.json()["diagnostics"]
    # cooling down for about a second: waited for (maxWaitMs, 5 s by default), then served
    assert rec.chat(k1, "free-model").status_code == 200
    r = rec.chat(s.k2, "claude-sonnet-4")  # the Anthropic wire: x-api-key upstream
    assert r.status_code == 200, r.text
    r = rec.send(
        "POST",
        "/v1/messages",
        json={
            "model": "claude-sonnet-4",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
        },
        headers={"x-api-key": s.k2, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200, r.text
    # the upstream rejects the gateway's credentials: a 502 that names the connection only
    r = rec.chat(k1, "locked-model")
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_auth_error"
    r = rec.chat(k1, "locked-model")  # now cooling down: nothing is sent
    assert r.status_code in (502, 503)
    assert httpx.get(mock.url + "/_mock/stats").json()["by_status"].get("401", 0) >= 1
    # client errors
    assert rec.chat(k1, "no-such-model").status_code == 404
    assert (
        rec.send(
            "POST",
            "/v1/chat/completions",
            content=b"{nope",
            headers={"Authorization": f"Bearer {k1}"},
        ).status_code
        == 400
    )
    assert rec.chat(k1, temperature="hot").status_code == 400
    # the pool's limit is 4 requests an hour for k1: two answered already, then 429s
    statuses = [rec.chat(k1).status_code for _ in range(4)]
    assert statuses[:2] == [200, 200]
    assert statuses[2:] == [429, 429]
    r = rec.chat(k1)
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert r.headers["retry-after"]

    # -- admin calls: keys, connections, pools, settings ------------------------------------
    r = rec.send("POST", "/api/keys", json={"name": "created"}, headers=ADMIN, record=False)
    assert r.status_code == 201  # the one answer that shows a secret: not scanned, on purpose
    created = r.json()["secret"]
    s.created_keys.append(created)
    assert rec.send("GET", "/v1/models", headers={"Authorization": f"Bearer {created}"}).is_success
    r = rec.send("GET", "/api/keys", headers={"Authorization": f"Bearer {created}"})
    assert r.status_code == 403  # a fresh client key is no admin key either
    r = rec.send(
        "POST",
        "/api/connections",
        headers=ADMIN,
        json={
            "id": "new-conn",
            "provider": "openai",
            "baseUrl": mock.url + "/v1",
            "secret": s.new_upstream,
            "models": ["gpt-4.1"],
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["hasSecret"] is True
    r = rec.send(
        "PATCH", "/api/connections/new-conn", headers=ADMIN, json={"secret": s.patched_upstream}
    )
    assert r.status_code == 200, r.text
    r = rec.send(  # a bad request that carries a secret: the 422 must not echo it
        "POST",
        "/api/connections",
        headers=ADMIN,
        json={"id": "bad conn", "provider": "x", "baseUrl": "nope", "secret": s.new_upstream},
    )
    assert r.status_code == 422
    r = rec.send(
        "PUT",
        "/api/settings",
        headers=ADMIN,
        # a Redis URL with a password, unreachable: the fallback is logged, the password never
        json={
            "quotaStore": {
                "driver": "redis",
                "redisUrl": f"redis://:{s.new_upstream}@127.0.0.1:1/0",
            }
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["quotaStore"]["fallbackReason"]
    r = rec.send(
        "PUT",
        "/api/settings",
        headers=ADMIN,
        json={"quotaStore": {"driver": "sqlite", "redisUrl": None}},
    )
    assert r.status_code == 200
    assert rec.send("DELETE", "/api/connections/new-conn", headers=ADMIN).status_code == 204
    r = rec.send("PATCH", "/api/keys/k2", headers=ADMIN, json={"name": "renamed"})
    assert r.status_code == 200

    # -- what the dashboard shows: the page, its assets and the JSON it reads -------------
    page = rec.send("GET", "/dashboard/")
    assert page.status_code == 200
    assets = set(re.findall(r'(?:src|href)="([^"#:]+)"', page.text))
    assert {"app.js", "style.css"} <= assets
    for asset in assets:
        assert rec.send("GET", "/dashboard/" + asset).status_code == 200
    dashboard_json = [
        "/api/connections",
        "/api/keys",
        "/api/monitoring/health",
        "/api/quota/plans",
        "/api/quota/pools",
        "/api/settings",
        "/api/quota/pools/p1/usage",
        "/api/quota/pools/p1/log?limit=500",
        "/api/combos?internal=true",
        "/api/resilience/settings",
        "/api/routing/defaults",
        "/api/quota/pools/export",
        "/api/quota/preview?pool=p1&key=k1",
        "/api/openapi.json",
    ]
    for path in dashboard_json:
        r = rec.send("GET", path, headers=ADMIN)
        assert r.status_code < 500, (path, r.text)
    for path in ("/metrics", "/health"):
        assert rec.send("GET", path).status_code == 200


# -- timing of the key check ---------------------------------------------------------------------


class _Lookups(Mapping[str, ClientKey]):
    """The registry's keys by hash, recording every way they are read."""

    def __init__(self, inner: Mapping[str, ClientKey]) -> None:
        self.inner = inner
        self.reads: list[tuple[str, object]] = []

    def __getitem__(self, digest: str) -> ClientKey:
        self.reads.append(("getitem", digest))
        return self.inner[digest]

    def get(self, digest: str, default: object = None) -> Any:
        self.reads.append(("get", digest))
        return self.inner.get(digest, default)

    def __contains__(self, digest: object) -> bool:
        self.reads.append(("contains", digest))
        return digest in self.inner

    def __iter__(self) -> Iterator[str]:
        self.reads.append(("iter", None))
        return iter(self.inner)

    def __len__(self) -> int:
        self.reads.append(("len", None))
        return len(self.inner)


def test_key_rejection_time_does_not_depend_on_the_prefix_matched(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Why this holds by construction: ``Registry.authenticate`` hashes the presented secret
    with SHA-256 (whose cost depends on the length only) and looks the *digest* up in a dict.
    The digests of two secrets sharing 30 leading characters share nothing, so the prefix a
    wrong key has in common with a real one never takes part in any comparison; the final
    check of a found key is ``hmac.compare_digest`` (constant time).

    The guard against someone "optimising" the lookup into a scan or a prefix index is
    structural, not a stopwatch (a timing bound fails on a busy host): every authentication
    reads the keys exactly once, by the digest of what was presented, and never iterates
    them. The time per rejected key is measured and printed beside it."""
    real = "fg-" + uuid.uuid4().hex + uuid.uuid4().hex[:8]
    others = [new_secret() for _ in range(2000)]
    keys = [
        ClientKey(f"k{i}", f"k{i}", hash_key(sec), sec[:8]) for i, sec in enumerate([*others, real])
    ]
    reg = Registry.build([], keys, [])
    assert reg.authenticate(real) is not None

    def unlike(n: int) -> str:
        """A wrong key of the real key's length sharing exactly ``n`` leading characters."""
        tail = "".join("z" if c != "z" else "y" for c in real[n:])
        return real[:n] + tail

    probes = {0: unlike(0), 30: unlike(30)}
    assert all(reg.authenticate(p) is None for p in probes.values())
    lookups = _Lookups(reg.keys_by_hash)
    watched = replace(reg, keys_by_hash=lookups)
    for probe in [*probes.values(), real]:
        lookups.reads.clear()
        found = watched.authenticate(probe)
        assert (found is not None) == (probe == real)
        assert lookups.reads == [("get", hash_key(probe))]
    per_call: dict[int, list[float]] = {0: [], 30: []}
    calls = 2000
    auth = reg.authenticate
    for rnd in range(60):
        order = (0, 30) if rnd % 2 == 0 else (30, 0)
        for n in order:
            probe = probes[n]
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                auth(probe)
            per_call[n].append((time.perf_counter_ns() - t0) / calls)
    m0, m30 = statistics.median(per_call[0]), statistics.median(per_call[30])
    with capsys.disabled():
        print(
            f"\n[key timing] median ns per rejected key: 0 shared chars {m0:.1f}, "
            f"30 shared chars {m30:.1f} (difference {abs(m0 - m30) / max(m0, m30):.1%})"
        )
