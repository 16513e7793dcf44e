"""What the hot path reads: an immutable, in-memory snapshot of the metadata DB.

The proxy never queries the metadata DB per request: connections, client keys (by hash), pools
(by member connection) and combos (user ones, plus the ``qtSd/<pool>/<model>`` quota-share ones
minted here from the pools) are loaded into a :class:`Registry` and swapped atomically whenever
the admin API changes something. Lookups are dict hits, so a request costs O(1) whatever the number
of keys, pools or connections.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fairgate.domain.connections import ANY_MODEL, Connection
from fairgate.domain.keys import ClientKey, Denial, hash_key
from fairgate.quota.model import Pool
from fairgate.routing.aliases import ModelAliases
from fairgate.routing.combo import Combo
from fairgate.routing.model import ComboConfig
from fairgate.routing.quota_share import qtsd_name, quota_share_combo

#: Quota-share combos a snapshot keeps for models only wildcard members serve (the models are
#: the clients' strings: the cache must not grow with them).
MAX_WILDCARD_COMBOS = 1_024


@dataclass(frozen=True)
class Registry:
    connections: Mapping[str, Connection] = field(default_factory=dict)
    keys_by_hash: Mapping[str, ClientKey] = field(default_factory=dict)
    pools: Mapping[str, Pool] = field(default_factory=dict)
    pool_by_connection: Mapping[str, Pool] = field(default_factory=dict)
    by_provider: Mapping[str, tuple[Connection, ...]] = field(default_factory=dict)
    default_provider: str | None = None
    version: int = 0
    #: user combos by name (admin API / config file)
    combos: Mapping[str, Combo] = field(default_factory=dict)
    #: the minted ``qtSd/<pool>/<model>`` quota-share combos, by name
    internal_combos: Mapping[str, Combo] = field(default_factory=dict)
    #: ``server.require_allocation`` in force: who may use what (see :meth:`denial`)
    require_allocation: bool = True
    #: the cascade's global layer over the built-in defaults: what a plain model (no combo)
    #: waits and queues by
    routing_defaults: ComboConfig = field(default_factory=ComboConfig)
    #: model aliases (config file ``model_aliases``, or the admin API's): see :meth:`alias_target`
    aliases: ModelAliases = field(default_factory=ModelAliases)
    #: every model an enabled connection lists by name (never aliased)
    listed_models: frozenset[str] = frozenset()
    #: quota-share combos minted on first use for a model only wildcard members serve
    #: (``models: ["*"]``), by name; bounded by :data:`MAX_WILDCARD_COMBOS`
    wildcard_combos: dict[str, Combo] = field(default_factory=dict, compare=False)
    #: provider → the models its wildcard connections served (in order, bounded like the
    #: combos): what ``/v1/models`` lists for a connection that names none
    wildcard_asked: dict[str, dict[str, None]] = field(default_factory=dict, compare=False)

    @classmethod
    def build(
        cls,
        connections: Iterable[Connection],
        keys: Iterable[ClientKey],
        pools: Iterable[Pool],
        *,
        default_provider: str | None = None,
        version: int = 0,
        combos: Iterable[Combo] = (),
        require_allocation: bool = True,
        routing_defaults: ComboConfig | None = None,
        aliases: ModelAliases | None = None,
    ) -> Registry:
        conns = {c.id: c for c in connections}
        by_provider: dict[str, list[Connection]] = {}
        for c in conns.values():
            if c.enabled:
                by_provider.setdefault(c.provider, []).append(c)
        pool_map = {p.id: p for p in pools}
        by_conn: dict[str, Pool] = {}
        for p in pool_map.values():
            for cid in p.connections:
                by_conn.setdefault(cid, p)
        return cls(
            connections=conns,
            keys_by_hash={k.key_hash: k for k in keys},
            pools=pool_map,
            pool_by_connection=by_conn,
            by_provider={k: tuple(v) for k, v in by_provider.items()},
            default_provider=default_provider,
            version=version,
            combos={c.name: c for c in combos},
            internal_combos=mint_quota_share_combos(pool_map.values(), conns),
            require_allocation=require_allocation,
            routing_defaults=routing_defaults or ComboConfig(),
            aliases=aliases or ModelAliases(),
            listed_models=frozenset(m for c in conns.values() if c.enabled for m in c.named_models),
        )

    def combo(self, name: str) -> Combo | None:
        """The user or internal combo called ``name``, or None."""
        found = self.combos.get(name)
        return found if found is not None else self.internal_combos.get(name)

    def alias_target(self, model: str) -> str | None:
        """The model an alias sends ``model`` to, or None when ``model`` is served under its
        own name (a combo, ``provider/model``, a model a connection lists) or no alias catches
        it. A step of its own, before :meth:`candidates` (:mod:`fairgate.routing.aliases`)."""
        if not self.aliases.aliases or "/" in model or model in self.listed_models:
            return None
        if model in self.combos or model in self.internal_combos:
            return None
        return self.aliases.resolve(model)

    def quota_share(self, pool: Pool, model: str) -> Combo | None:
        """The ``qtSd/<pool>/<model>`` combo that shares ``model`` among the pool's members:
        minted with the snapshot for every model a member names; for a model only wildcard
        members (``models: ["*"]``) serve, minted on its first request and kept with this
        snapshot (at most :data:`MAX_WILDCARD_COMBOS`; past that, minted per request, which
        costs O(members)), so a wildcard pool shares its load like a named one."""
        name = qtsd_name(pool.id, model)
        combo = self.internal_combos.get(name) or self.wildcard_combos.get(name)
        if combo is not None:
            return combo
        members = [self.connections[c] for c in pool.connections if c in self.connections]
        if not any(ANY_MODEL in c.models for c in members):
            return None
        combo = quota_share_combo(pool.id, model, members)
        if combo is not None and len(self.wildcard_combos) < MAX_WILDCARD_COMBOS:
            self.wildcard_combos[name] = combo
        return combo

    def authenticate(self, secret: str) -> ClientKey | None:
        """The enabled key whose hash matches. The dict lookup is by hash (no secret prefix is
        ever compared), and the final compare is constant-time."""
        digest = hash_key(secret)
        key = self.keys_by_hash.get(digest)
        if key is None or not hmac.compare_digest(key.key_hash, digest) or not key.enabled:
            return None
        return key

    def denial(self, key: ClientKey, conn: Connection) -> Denial | None:
        """Why ``key`` may not use ``conn``, or None when it may. O(1): the pool's allocations
        and the key's allow-lists are dicts and sets built with the snapshot.

        With ``require_allocation`` off (a deployment from before the setting that has not
        chosen yet) every key may use every connection, as it always could."""
        if not self.require_allocation:
            return None
        pool = self.pool_by_connection.get(conn.id)
        if pool is not None:
            return None if pool.allocation(key.id) is not None else Denial.NO_ALLOCATION
        if conn.id in key.allowed_connections or conn.provider in key.allowed_providers:
            return None
        return Denial.CONNECTION_NOT_ALLOWED

    def candidates(self, model: str) -> tuple[str, tuple[Connection, ...]]:
        """Resolve ``provider/model`` or a bare model to (upstream model name, connections).

        A bare model goes to the connections that list it, else to the default provider.
        """
        provider, sep, name = model.partition("/")
        if model == ANY_MODEL:
            return model, ()
        if sep and provider in self.by_provider:
            return name, tuple(c for c in self.by_provider[provider] if c.serves(name))
        listed = tuple(c for conns in self.by_provider.values() for c in conns if model in c.models)
        if listed:
            return model, listed
        if self.default_provider and self.default_provider in self.by_provider:
            return model, tuple(
                c for c in self.by_provider[self.default_provider] if c.serves(model)
            )
        # no connection names it and no default provider: the wildcard connections
        # (``models: ["*"]``) serve it when they are all of one provider (a bare name cannot
        # choose between providers: ``provider/model`` does)
        wild = tuple(
            c for conns in self.by_provider.values() for c in conns if ANY_MODEL in c.models
        )
        if wild and len({c.provider for c in wild}) == 1:
            return model, wild
        return model, ()

    def served_by_wildcard(self, conn: Connection, model: str) -> None:
        """``conn`` answered ``model`` with a 200: when only its wildcard serves it, remember
        the model for ``/v1/models`` (only what an upstream served, so a client cannot put
        names in another key's list; bounded). O(1)."""
        if model in conn.models or ANY_MODEL not in conn.models:
            return
        asked = self.wildcard_asked.setdefault(conn.provider, {})
        if model not in asked and len(asked) < MAX_WILDCARD_COMBOS:
            asked[model] = None


def mint_quota_share_combos(
    pools: Iterable[Pool], connections: Mapping[str, Connection]
) -> dict[str, Combo]:
    """One ``qtSd/<pool>/<model>`` combo per (pool, model listed by a member connection), one
    target per enabled member serving the model, weighted like the connection. Minted with the
    snapshot, never stored, so they always match the pools (a pool edit reloads the registry).
    A member serving ``"*"`` joins every combo of its pool but cannot name one itself."""
    out: dict[str, Combo] = {}
    for pool in pools:
        members = [connections[cid] for cid in pool.connections if cid in connections]
        for model in dict.fromkeys(m for c in members for m in c.named_models):
            combo = quota_share_combo(pool.id, model, members)
            if combo is not None:
                out[combo.name] = combo
    return out
