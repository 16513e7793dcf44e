"""One governed request at a time on the Redis store: what the round trip, the scripts in
redis-server and the store's calls cost (issue 15's c1 latency). Prints figures; asserts nothing.

Per round, in one process on uvloop, with the Redis at ``FAIRGATE_TEST_REDIS_URL`` (else
``127.0.0.1:6379``) under a key prefix unique to the run, deleted afterwards:

- a redis-py ``PING``, one at a time: the round trip and the other process's wake-up;
- ``admit`` then ``settle`` of one reservation, one at a time (two checks: requests and
  tokens, as the benchmark pool has), as the caller waits for each;
- what redis-server spent in each script per call (``INFO commandstats``: ``EVALSHA``'s
  ``usec_per_call`` over that round's admits and then its settles, each command inside a script
  counted in it too), and in the commands inside them.

``commandstats`` counts every client of that server, so a Redis shared with other work reads
high. Rounds alternate the three measurements; each figure is the median of its rounds.

Run: ``.venv/bin/python benchmarks/redis_scripts.py [--requests N] [--rounds R]``
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import redis
import uvloop

from callgrind_support import arg_parser, drop_prefix, redis_url

HOUR = 3_600_000
T0 = 1_700_002_800_000


def evalsha_usec(client: redis.Redis) -> tuple[float, float]:
    """redis-server's µs per EVALSHA, and per call in the commands the scripts ran, since
    the last reset."""
    stats: dict[str, Any] = client.info("commandstats")
    scripts = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    calls = max(1, int(scripts["calls"]))
    inner = sum(
        int(v["usec"])
        for k, v in stats.items()
        if k.startswith("cmdstat_") and k not in ("cmdstat_evalsha", "cmdstat_config|resetstat")
    )
    return int(scripts["usec"]) / calls, inner / calls


async def one_round(url: str, n: int) -> dict[str, float]:
    from fairgate.domain.units import Unit
    from fairgate.quota.decision import DimensionCheck
    from fairgate.quota.model import Policy
    from fairgate.quota.ports import AdmitRequest, UsageItem
    from fairgate.store.redis.store import RedisQuotaStore

    prefix = f"fgbrs{uuid.uuid4().hex[:10]}"
    store = RedisQuotaStore(url, prefix=prefix)
    sync = redis.Redis.from_url(url)
    ping = redis.asyncio.Redis.from_url(url)
    checks = (
        DimensionCheck("requests/hourly", Unit.REQUESTS, HOUR, 1e12, 1e12, None, 1.0),
        DimensionCheck("tokens/hourly", Unit.TOKENS, HOUR, 1e15, 1e15, None, 64.0),
    )
    usage = [UsageItem("requests/hourly", HOUR, 1), UsageItem("tokens/hourly", HOUR, 20)]
    out: dict[str, float] = {}
    try:
        await store.warm()
        await ping.ping()
        pings = []
        for _ in range(n):
            t = time.perf_counter()
            await ping.ping()
            pings.append(time.perf_counter() - t)
        out["ping"] = statistics.median(pings) * 1e6
        admits, settles, rids = [], [], []
        sync.config_resetstat()
        for i in range(n):
            rid = uuid.uuid4().hex
            rids.append(rid)
            req = AdmitRequest("bp", "bench", checks, Policy.BURST, 0.5, rid, T0 + i, 60_000)
            t = time.perf_counter()
            await store.admit(req)
            admits.append(time.perf_counter() - t)
        out["admit_server"], out["admit_inner"] = evalsha_usec(sync)
        sync.config_resetstat()
        for i, rid in enumerate(rids):
            t = time.perf_counter()
            await store.settle("bp", "bench", rid, usage, T0 + n + i)
            settles.append(time.perf_counter() - t)
        out["settle_server"], out["settle_inner"] = evalsha_usec(sync)
        out["admit"] = statistics.median(admits) * 1e6
        out["settle"] = statistics.median(settles) * 1e6
    finally:
        await ping.aclose()
        sync.close()
        await store.close()
        drop_prefix(url, prefix)
    return out


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--requests", type=int, default=2000, help="per measurement and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    url = redis_url()
    rounds = []
    for r in range(args.rounds):
        print(f"  round {r + 1}/{args.rounds} ...", flush=True)
        rounds.append(uvloop.run(one_round(url, args.requests)))

    def med(key: str) -> str:
        return f"{statistics.median(x[key] for x in rounds):8.1f}"

    print(f"\none at a time, {args.requests} per round, median of {args.rounds} rounds (µs)")
    rows = [
        ("redis-py PING, round trip", med("ping"), ""),
        ("admit, as the caller waits", med("admit"), ""),
        ("settle, as the caller waits", med("settle"), ""),
    ]
    for name in ("admit", "settle"):
        inner = med(f"{name}_inner").strip()
        rows.append((f"{name}.lua in redis-server per call", med(f"{name}_server"), inner))
    for label, value, inner in rows:
        print(f"  {label:<38}{value}" + (f"  (its commands {inner})" if inner else ""))


if __name__ == "__main__":
    main()
