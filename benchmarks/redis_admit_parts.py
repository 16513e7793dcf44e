"""Where one ``admit.lua`` call's time goes in redis-server: the script cut short at successive
points, each variant run with the same arguments. Prints figures; asserts nothing.

The arguments are one real admission's (two checks, requests and tokens, as the benchmark pool
has), taken from the store as it sends them; each call gets its own reservation id and a ``now``
one millisecond later, so nothing is held twice and no lease runs out during the run. Per
variant and round, ``--calls`` calls are pipelined (100 at a time) and redis-server's own time
per call is read from ``INFO commandstats`` (``EVALSHA``'s ``usec`` over its ``calls``): the
server's time, not the caller's, so the round trip does not count. Variants alternate, each
figure is the median of its rounds, and the difference between two consecutive cut points is
what that part of the script costs. ``commandstats`` counts every client of the server: a Redis
shared with other work reads high.

The cut points are found by the text of ``admit.lua``; a cut point that is no longer there
stops the run with its name (update the marker here when the script changes).

Run: ``.venv/bin/python benchmarks/redis_admit_parts.py [--calls N] [--rounds R]`` (the Redis at
``FAIRGATE_TEST_REDIS_URL``, else ``127.0.0.1:6379``; its keys go under a prefix unique to the
run and are deleted afterwards).
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from typing import Any

import redis

from callgrind_support import arg_parser, drop_prefix, redis_url
from redis_scripts import HOUR, T0, evalsha_usec

EARLY = "if true then return {0} end\n"

#: (name, what it adds, the text the early return goes before); None: the whole script
CUTS: list[tuple[str, str, str | None]] = [
    ("nothing", "the library, 12 keys and 29 arguments", "local now = tonumber(ARGV[1])"),
    ("reads", "the reclaim's ZRANGEBYSCORE and the MGET", "local held = read[1]"),
    ("checks", "each check read into its table", "local function evaluate()"),
    ("decision", "evaluate()", "-- 3. The key was active now"),
    ("writes", "the active set, the counters, the reservation", None),
]


def variants(source: str) -> list[tuple[str, str, str]]:
    out = []
    for name, part, marker in CUTS:
        if marker is None:
            out.append((name, part, source))
            continue
        at = source.find(marker)
        if at < 0:
            raise SystemExit(f"cut point {name!r} not found in admit.lua: {marker!r}")
        out.append((name, part, source[:at] + EARLY + source[at:]))
    return out


async def one_admission(url: str, prefix: str) -> tuple[list[bytes], list[bytes]]:
    """The keys and arguments of one real admission, as the store sends them."""
    from fairgate.domain.units import Unit
    from fairgate.quota.decision import DimensionCheck
    from fairgate.quota.model import Policy
    from fairgate.quota.ports import AdmitRequest
    from fairgate.store.redis.store import RedisQuotaStore

    store = RedisQuotaStore(url, prefix=prefix)
    seen: list[tuple[list[bytes], list[bytes]]] = []
    run = store._run

    def spy(script: Any, keys: list[bytes], args: list[bytes], *, later: bool = False) -> Any:
        if script is store._admit:
            seen.append((list(keys), list(args)))
        return run(script, keys, args, later=later)

    store._run = spy  # type: ignore[method-assign]
    checks = (
        DimensionCheck("requests/hourly", Unit.REQUESTS, HOUR, 1e9, 1e9, None, 1.0),
        DimensionCheck("tokens/hourly", Unit.TOKENS, HOUR, 1e12, 1e12, None, 2048.0),
    )
    try:
        await store.admit(AdmitRequest("bp", "k1", checks, Policy.BURST, 0.5, "r0", T0, 60_000))
    finally:
        await store.close()
    return seen[0]


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("--calls", type=int, default=1500, help="per variant and round")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    from fairgate.store.redis.store import script_source

    url = redis_url()
    prefix = f"fgparts{uuid.uuid4().hex[:8]}"
    keys, argv = asyncio.run(one_admission(url, prefix))
    rid = argv[2]
    client = redis.Redis.from_url(url)
    runs = [(n, p, client.script_load(src)) for n, p, src in variants(script_source("admit.lua"))]
    per_call: dict[str, list[float]] = {n: [] for n, _, _ in runs}
    tick = 0
    try:
        for r in range(args.rounds):
            print(f"  round {r + 1}/{args.rounds} ...", flush=True)
            for name, _, sha in runs:
                client.config_resetstat()
                pipe = client.pipeline(transaction=False)
                for i in range(args.calls):
                    tick += 1
                    new = b"p%d" % tick
                    k = [key.replace(rid, new) for key in keys]
                    a = [str(T0 + tick).encode(), argv[1], new, *argv[3:]]
                    pipe.evalsha(sha, len(k), *k, *a)
                    if i % 100 == 99:
                        pipe.execute()
                        pipe = client.pipeline(transaction=False)
                pipe.execute()
                per_call[name].append(evalsha_usec(client)[0])
    finally:
        drop_prefix(url, prefix)
    print(f"\nadmit.lua in redis-server, µs per call (median of {args.rounds} rounds)")
    print(f"  {'the script up to':<52}{'per call':>10}{'this part':>11}")
    before = 0.0
    for name, part, _ in runs:
        med = statistics.median(per_call[name])
        print(f"  {name + ': ' + part:<52}{med:>10.1f}{med - before:>+11.1f}")
        before = med


if __name__ == "__main__":
    main()
