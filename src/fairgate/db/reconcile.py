"""The config file against the metadata DB: what a start writes, and what differs (issue 49).

Why a rule: the file and the admin API (the CLI and the dashboard use it) write the same objects.
Re-applying the file at every start undid what the API did: a key rotated because it leaked got
its old secret back, a revoked key came back, an allocation edited on the dashboard reverted, on
PostgreSQL for the whole cluster when one replica restarted. The rule, per object:

- **seed mode** (the default): the file creates what does not exist yet, and updates what it
  wrote itself as long as nothing else changed it since. An object created, changed or deleted
  through the admin API keeps its state; the difference is reported (the start log,
  ``fairgate config check``, ``/health``).
- **authoritative mode** (``server.config_mode: authoritative``, a file kept as the source of
  truth): the file's objects are set to what it says at every start, overwritten or re-created,
  each named in the start log.
- In both modes a client key secret rotated away or revoked (``retired_key_hashes``, kept by
  ``fairgate.db.keys``) is never written again, and nothing is deleted: an object the file no
  longer declares stays in the DB, no longer the file's.

How "nothing else changed it since" is known: the DB records, per object, the form the file last
wrote (``config_applied``). While the object still has that form its state came from the file;
once it differs, from elsewhere. This needs nothing from the write paths, so it holds whoever
wrote: this process's admin API, another replica, a worker, an older version.

An object is what the admin API edits as one: a connection, a client key, a connection's plan,
a pool (name, members, dimensions, sharing), a pool's allocations, a combo. A pool's allocations
edited on the dashboard are kept while its dimensions still follow the file.

Everything here is pure: :func:`reconcile` maps the declared objects, the stored ones and the
records to decisions; ``fairgate.db.seeding`` reads the DB and applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, get_args

import orjson

from fairgate.config import ComboSpec, ConfigMode
from fairgate.db.combos import combo_fields
from fairgate.db.pools import PoolRecord
from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey
from fairgate.quota.hold import NO_HOLD
from fairgate.quota.model import Allocation, Dimension

_T = TypeVar("_T")

__all__ = [
    "Action",
    "Decision",
    "Form",
    "Kind",
    "Mode",
    "Objects",
    "Reconciliation",
    "Ref",
    "Stored",
    "reconcile",
]

Kind = Literal["connection", "key", "plan", "pool", "allocations", "combo"]
KINDS: tuple[Kind, ...] = get_args(Kind)
#: ``seed``: the file creates what is missing and never overwrites what the admin API changed;
#: ``authoritative``: the file's objects are set to what it says at every start.
Mode = ConfigMode
#: An object: its kind and id (a pool's id for its allocations, a connection's for its plan).
Ref = tuple[Kind, str]
Action = Literal[
    "create",  # the file declares it, the DB lacks it: created
    "update",  # the file changed it, nobody else did: the file's edit is applied
    "overwrite",  # authoritative: changed elsewhere, set back to the file's
    "recreate",  # authoritative: deleted elsewhere, created again
    "in_sync",  # the DB holds what the file says
    "kept",  # seed: changed or created elsewhere, differs from the file: the DB's state stays
    "deleted",  # seed: the file created it, it was deleted elsewhere: not created again
    "retired",  # a key whose secret in the file was rotated away or revoked: not created
    "skipped",  # a pool whose every connection was deleted elsewhere: not created
]
_WRITES: frozenset[Action] = frozenset({"create", "update", "overwrite", "recreate"})


@dataclass(frozen=True, slots=True)
class Form:
    """An object's comparable state: its fields as JSON values (never a secret), and the
    upstream secret of a connection in clear (compared; never shown; stored sealed)."""

    fields: Mapping[str, Any]
    secret: str = field(default="", repr=False)

    def differing(self, other: Form) -> tuple[str, ...]:
        """The names of the fields that differ (``secret`` for the secret): never a value."""
        names = [
            n
            for n in sorted(self.fields.keys() | other.fields.keys())
            if self.fields.get(n) != other.fields.get(n)
        ]
        if self.secret != other.secret:
            names.append("secret")
        return tuple(names)

    def fields_json(self) -> str:
        return orjson.dumps(self.fields).decode()


def form(fields: Mapping[str, object], secret: str = "") -> Form:
    """A form normalised by a JSON round trip, so one built from objects equals one read back
    from the DB (tuples become lists, and so on)."""
    return Form(orjson.loads(orjson.dumps(fields)), secret)


def _dims(dims: Iterable[Dimension]) -> list[dict[str, object]]:
    return [
        {"unit": d.unit.value, "window": d.window.value, "limit": d.limit, "anchor": d.anchor.value}
        for d in dims
    ]


def connection_form(c: Connection) -> Form:
    return form(
        {
            "provider": c.provider,
            "base_url": c.base_url,
            "protocol": c.protocol.value,
            "auth_type": c.auth_type.value,
            "weight": c.weight,
            "max_concurrent": c.max_concurrent,
            "models": list(c.models),
            "enabled": c.enabled,
            "forward_headers": list(c.forward_headers),
            # only when set: the forms applied before the field existed stay equal
            **({"billing_fields": list(c.billing_fields)} if c.billing_fields else {}),
        },
        c.secret,
    )


def key_form(k: ClientKey) -> Form:
    """``secret`` holds the key's hash: the file gives the secret or its hash, the DB keeps
    only the hash, and a difference is reported as the secret's."""
    return form(
        {
            "name": k.name,
            "secret": k.key_hash,
            "enabled": k.enabled,
            "allowed_models": list(k.allowed_models),
            "allowed_connections": sorted(k.allowed_connections),
            "allowed_providers": sorted(k.allowed_providers),
        }
    )


def plan_form(dims: Iterable[Dimension]) -> Form:
    return form({"dimensions": _dims(dims)})


def pool_form(r: PoolRecord) -> Form:
    """The pool without its allocations (those are an object of their own)."""
    fields: dict[str, object] = {
        "name": r.name,
        "connections": list(r.connections),
        "dimensions": _dims(r.dimensions),
        "share_mode": r.share_mode.value,
        "active_window_s": r.active_window_ms / 1000,
    }
    if r.hold != NO_HOLD:
        # only when set: the form a database applied before the setting existed still equals
        # the pool's (so the file keeps updating it)
        fields.update(
            admission=r.hold.mode.value,
            max_wait_ms=r.hold.max_wait_ms,
            queue_per_key=r.hold.queue_per_key,
            queue_per_pool=r.hold.queue_per_pool,
        )
    return form(fields)


def allocations_form(allocations: Iterable[Allocation]) -> Form:
    """One field per key, so a difference names the keys whose allocation differs."""
    return form(
        {
            a.key_id: {
                "weight": a.weight,
                "policy": a.policy.value,
                "cap_value": a.cap_value,
                "cap_unit": None if a.cap_unit is None else a.cap_unit.value,
                "model_caps": [
                    {"model": c.model, "unit": c.unit.value, "limit": c.limit} for c in a.model_caps
                ],
            }
            for a in allocations
        }
    )


def combo_form(spec: ComboSpec) -> Form:
    return form(combo_fields(spec))


def _form_of(objects: Mapping[str, _T], i: str, to_form: Callable[[_T], Form]) -> Form | None:
    """The form of ``objects[i]`` (None: there is no such object)."""
    found = objects.get(i)
    return None if found is None else to_form(found)


@dataclass(frozen=True, slots=True)
class Objects:
    """The objects the config file seeds, by id: as the file declares them, as the DB holds
    them, or as a start writes them. A pool's record carries its allocations."""

    connections: Mapping[str, Connection] = field(default_factory=dict)
    keys: Mapping[str, ClientKey] = field(default_factory=dict)
    plans: Mapping[str, tuple[Dimension, ...]] = field(default_factory=dict)
    pools: Mapping[str, PoolRecord] = field(default_factory=dict)
    combos: Mapping[str, ComboSpec] = field(default_factory=dict)

    def refs(self) -> list[Ref]:
        out: list[Ref] = [("connection", i) for i in self.connections]
        out.extend(("key", i) for i in self.keys)
        out.extend(("plan", i) for i in self.plans)
        for i in self.pools:
            out.extend((("pool", i), ("allocations", i)))
        out.extend(("combo", i) for i in self.combos)
        return out

    def form(self, ref: Ref) -> Form | None:
        """The form of one object (None: not here). Built on demand: a DB may hold many
        more objects (keys, above all) than the file declares, and only those are compared."""
        kind, i = ref
        if kind == "connection":
            return _form_of(self.connections, i, connection_form)
        if kind == "key":
            return _form_of(self.keys, i, key_form)
        if kind == "plan":
            return _form_of(self.plans, i, plan_form)
        if kind == "combo":
            return _form_of(self.combos, i, combo_form)
        if kind == "pool":
            return _form_of(self.pools, i, pool_form)
        return _form_of(self.pools, i, lambda r: allocations_form(r.allocations))

    def forms(self) -> dict[Ref, Form]:
        return {ref: form for ref in self.refs() if (form := self.form(ref)) is not None}


@dataclass(frozen=True, slots=True)
class Stored:
    """What the DB holds: the objects, the form the file last wrote of each (``applied``), and
    the key hashes rotated away or revoked (``retired``). Of the keys and the retired hashes,
    those the file names are enough (the DB may hold very many; the other kinds are few)."""

    objects: Objects
    applied: Mapping[Ref, Form] = field(default_factory=dict)
    retired: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    """What a start does with one object the file declares, and how it differs from the DB
    (``fields``: names only, never a value)."""

    kind: Kind
    id: str
    action: Action
    fields: tuple[str, ...] = ()
    #: ``kept``: the file changed the object since it last wrote it (its edit is not applied)
    file_changed: bool = False
    #: a key whose secret in the file was rotated away or revoked: that secret is never written
    retired_secret: bool = False

    @property
    def ref(self) -> Ref:
        return self.kind, self.id

    @property
    def label(self) -> str:
        if self.kind == "allocations":
            return f"allocations of pool {self.id}"
        if self.kind == "plan":
            return f"plan of connection {self.id}"
        return f"{self.kind} {self.id}"

    @property
    def writes(self) -> bool:
        return self.action in _WRITES

    @property
    def differs(self) -> bool:
        """Whether the file and the DB disagree on this object (or will until a start)."""
        return self.action != "in_sync" or self.retired_secret

    def message(self) -> str:
        """One sentence for people: the object, what differs, what a start does about it."""
        what = f" ({', '.join(self.fields)})" if self.fields else ""
        text = _MESSAGES[self.action]
        if self.action == "kept" and self.file_changed:
            text = "the file's edit is not applied: changed through the admin API"
        if self.retired_secret:
            retired = (
                "the file's secret was rotated away or revoked and is never used again; the "
                "key keeps its current one"
            )
            text = retired if self.action == "in_sync" else f"{text}; {retired}"
        return f"{self.label}{what}: {text}"

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "id": self.id,
            "action": self.action,
            "fields": list(self.fields),
            "message": self.message(),
        }


#: What each action means, said before a start (``config check``) as well as after it.
_MESSAGES: Mapping[Action, str] = {
    "create": "not in the database; a start creates it from the file",
    "update": "the file changed it, nothing else did; a start applies the file's edit",
    "overwrite": "changed through the admin API; a start sets it to the file's (authoritative)",
    "recreate": "deleted through the admin API; a start creates it again (authoritative)",
    "in_sync": "as in the file",
    "kept": "changed or created through the admin API; the database's state is kept",
    "deleted": "deleted through the admin API; not created again",
    "retired": "its secret in the file was rotated away or revoked; not created",
    "skipped": "its connections were deleted through the admin API; not created",
}


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The decisions of one comparison and what applying it writes: ``writes`` (each object to
    create or replace), ``record`` (the forms to record as the file's last written) and
    ``forget`` (records of objects the file no longer declares); ``after``: the objects as the
    DB holds them once applied (what the gateway then runs; of the keys, those compared)."""

    mode: Mode
    decisions: tuple[Decision, ...]
    writes: Objects = field(default_factory=Objects)
    record: Mapping[Ref, Form] = field(default_factory=dict)
    forget: tuple[Ref, ...] = ()
    after: Objects = field(default_factory=Objects)
    #: the objects of ``writes`` that applying inserts (the others replace stored ones)
    new: frozenset[Ref] = frozenset()

    def creates(self, kind: Kind, ident: str) -> bool:
        """Whether applying inserts the object (else it replaces the stored one)."""
        return (kind, ident) in self.new

    @property
    def differences(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.differs)

    @property
    def changes(self) -> list[str]:
        """What applying writes, one ``<action> <object>`` each (``created pool p``)."""
        return [f"{_PAST[d.action]} {d.label}" for d in self.decisions if d.writes]

    @property
    def created(self) -> int:
        return sum(d.action in ("create", "recreate") for d in self.decisions)

    @property
    def updated(self) -> int:
        return sum(d.action in ("update", "overwrite") for d in self.decisions)

    @property
    def changed(self) -> int:
        return self.created + self.updated


_PAST: Mapping[Action, str] = {
    "create": "created",
    "update": "updated",
    "overwrite": "overwrote",
    "recreate": "re-created",
}


def _action(have: Form | None, want: Form, applied: Form | None, mode: Mode) -> Action:
    """The rule of the module docstring for one object."""
    if have is None:
        if applied is None:
            return "create"
        return "recreate" if mode == "authoritative" else "deleted"
    if have == want:
        return "in_sync"
    if applied == have:  # as the file last wrote it: nobody else changed it
        return "update"
    return "overwrite" if mode == "authoritative" else "kept"


class _Plan:
    """The decisions taken so far and the forms to record."""

    def __init__(self, stored: Stored, mode: Mode) -> None:
        self.stored = stored
        self.mode = mode
        self.decisions: list[Decision] = []
        self.record: dict[Ref, Form] = {}

    def action(self, ref: Ref, want: Form) -> Action:
        have = self.stored.objects.form(ref)
        return _action(have, want, self.stored.applied.get(ref), self.mode)

    def decide(
        self, ref: Ref, want: Form, *, action: Action | None = None, retired_secret: bool = False
    ) -> Decision:
        have, applied = self.stored.objects.form(ref), self.stored.applied.get(ref)
        action = action or _action(have, want, applied, self.mode)
        fields = () if have is None else want.differing(have)
        if retired_secret and "secret" not in fields:
            fields = (*fields, "secret")  # the file's differs; the key keeps its own
        d = Decision(
            ref[0],
            ref[1],
            action,
            fields,
            file_changed=action == "kept" and applied is not None and applied != want,
            retired_secret=retired_secret,
        )
        if d.writes or (action == "in_sync" and applied != want):  # in sync: adopted
            self.record[ref] = want
        self.decisions.append(d)
        return d

    def skip(self, ref: Ref, action: Action) -> None:
        self.decisions.append(Decision(ref[0], ref[1], action))


def reconcile(declared: Objects, stored: Stored, mode: Mode) -> Reconciliation:
    """What a start in ``mode`` does with every object the file declares (see the module
    docstring), in the order the writes must happen: connections and keys before the pools
    that name them."""
    plan = _Plan(stored, mode)
    current = stored.objects
    connections = {
        i: c
        for i, c in declared.connections.items()
        if plan.decide(("connection", i), connection_form(c)).writes
    }
    keys = _keys(plan, declared.keys)
    plans = {
        i: d for i, d in declared.plans.items() if plan.decide(("plan", i), plan_form(d)).writes
    }
    live_connections = current.connections.keys() | connections.keys()
    live_keys = current.keys.keys() | keys.keys()
    pools: dict[str, PoolRecord] = {}
    for i, rec in declared.pools.items():
        wanted = replace(
            rec,
            connections=tuple(c for c in rec.connections if c in live_connections),
            allocations=tuple(a for a in rec.allocations if a.key_id in live_keys),
        )
        written = _pool(plan, wanted, current.pools.get(i))
        if written is not None:
            pools[i] = written
    combos = {
        i: s for i, s in declared.combos.items() if plan.decide(("combo", i), combo_form(s)).writes
    }
    declared_refs = {d.ref for d in plan.decisions}
    inserted = frozenset(d.ref for d in plan.decisions if d.action in ("create", "recreate"))
    return Reconciliation(
        mode,
        tuple(plan.decisions),
        Objects(connections, keys, plans, pools, combos),
        plan.record,
        tuple(ref for ref in stored.applied if ref not in declared_refs),
        Objects(
            {**current.connections, **connections},
            {**current.keys, **keys},
            {**current.plans, **plans},
            {**current.pools, **pools},
            {**current.combos, **combos},
        ),
        inserted,
    )


def _keys(plan: _Plan, declared: Mapping[str, ClientKey]) -> dict[str, ClientKey]:
    """The keys to write. A secret in the file that was rotated away or revoked is never
    written: the key keeps its current secret (its other fields follow the rule), or, when it
    does not exist, it is not created."""
    out: dict[str, ClientKey] = {}
    for i, declared_key in declared.items():
        key = declared_key
        retired = key.key_hash in plan.stored.retired
        if retired:
            current = plan.stored.objects.keys.get(i)
            if current is None:
                plan.skip(("key", i), "retired")
                continue
            key = replace(key, key_hash=current.key_hash)
        if plan.decide(("key", i), key_form(key), retired_secret=retired).writes:
            out[i] = key
    return out


def _pool(plan: _Plan, wanted: PoolRecord, current: PoolRecord | None) -> PoolRecord | None:
    """The record to write for one pool (None: nothing): its own fields and its allocations
    are decided apart, and the record takes each from the file or the DB accordingly.
    ``wanted`` holds only the connections and keys that exist after this start."""
    ref_pool: Ref = ("pool", wanted.id)
    ref_allocations: Ref = ("allocations", wanted.id)
    action = plan.action(ref_pool, pool_form(wanted))
    if action in _WRITES and not wanted.connections:
        action = "skipped"  # every member was deleted elsewhere: a pool needs one
    pool = plan.decide(ref_pool, pool_form(wanted), action=action)
    if current is None:  # created with its allocations, or not at all
        if not pool.writes:
            plan.skip(ref_allocations, pool.action)
            return None
        plan.decide(ref_allocations, allocations_form(wanted.allocations), action=pool.action)
        return wanted
    allocations = plan.decide(ref_allocations, allocations_form(wanted.allocations))
    if not (pool.writes or allocations.writes):
        return None
    base = wanted if pool.writes else current
    return replace(
        base, allocations=wanted.allocations if allocations.writes else current.allocations
    )


#: log levels of :func:`start_log` (the ``logging`` module's values, without importing it here)
INFO, WARNING = 20, 30


def start_log(result: Reconciliation) -> list[tuple[int, str]]:
    """What a start says about the file, as (level, message): the mode, what it wrote, each
    overwrite (authoritative) and each edit of the file it did not apply (a warning: someone
    changed the file and expects it applied), and one line for the rest it kept."""
    lines: list[tuple[int, str]] = []
    if result.mode == "authoritative":
        lines.append((WARNING, _AUTHORITATIVE))
    if result.changes:
        lines.append((INFO, "seeded from config: " + ", ".join(result.changes)))
    quiet: list[str] = []
    for d in result.differences:
        if d.action in ("overwrite", "recreate"):
            what = f" ({', '.join(d.fields)})" if d.fields else ""
            done = "overwriting" if d.action == "overwrite" else "re-creating"
            why = "changed" if d.action == "overwrite" else "deleted"
            lines.append(
                (
                    WARNING,
                    f"config file (authoritative): {done} {d.label}{what}, {why} through "
                    "the admin API",
                )
            )
        elif d.action in ("retired", "skipped") or d.retired_secret:
            lines.append((WARNING, "config file: " + d.message()))
        elif d.action == "kept" and d.file_changed:
            lines.append((WARNING, f"config file: {d.message()} ({_AUTHORITATIVE_HINT})"))
        elif not d.writes:
            quiet.append(d.message())
    if quiet:
        lines.append(
            (
                INFO,
                f"config file: {len(quiet)} object(s) differ and keep the database's state "
                f"(seed mode; `fairgate config check` lists them): {'; '.join(quiet)}",
            )
        )
    return lines


_AUTHORITATIVE = (
    "config file is authoritative (server.config_mode: authoritative): every object it "
    "declares is set to what it says at each start, overwriting what the admin API changed; "
    "a revoked key or a rotated-away secret never comes back"
)
_AUTHORITATIVE_HINT = (
    "change it through the admin API, or set server.config_mode: authoritative to make the file win"
)
