"""Which code version a replica runs, switched at one replog offset: :class:`ModuleCode`, :class:`GroupCode`.

A worker keeps every version of a module it may need loaded side by side
(:mod:`topology.code_loader` imports each under its own alias). A version is
loaded off the task threads: when ``conductor update`` prepares it (the Code
service's Prepare), or when the module is opened.

The switch is one replog entry, the *switch entry*: a change set tagged
``$code:<version>`` that writes ``_meta.code``, puts the new version's new
PStates and depots in spare column families (:mod:`pstate.families`), and
starts the PState migrations it declares. A leader appends it when the module's
spec names a version its group does not build with yet; every entry the
leader builds after it is built by the new version's topologies, every entry
before it was built by the old one, so a record is processed by exactly one
version. Replicas apply it in log order like any entry: followers, a
restarted replica replaying its replog, and a new leader staging an inherited
tail all switch at the same offset.

Two versions matter per replica, both derived from the replog, never from
ZooKeeper: the *applied* version (``_meta.code``, the module's initial
version before the first switch) and the *build* version (a switch entry
appended but not applied yet, else the applied one). The store shows the
build version's PStates and depots; a dropped one's column family is
deleted when the switch that drops it is applied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pstate.changes import ChangeSet
from pstate.families import ALIAS, ALIAS_END, alias_key, read_aliases
from pstate.migration import (
    FIRST_KEY,
    ActiveMigration,
    MigrationRecord,
    read_record,
    rewrite_batch,
    write_record,
)
from pstate.schema import Map, check_top_level
from pstate.store import META, ChangeSetBuilder, TaskGroupStore, depot_cf, pstate_cf
from topology.dataflow.group import GroupDataflow
from topology.module import ModuleDefinition
from topology.refs import MissingModule
from topology.stream import StreamRunner

log = logging.getLogger("millrace.node")

#: the tag of a switch entry is this plus the version
SWITCH = "$code:"
#: the tag of a migration batch entry
MIGRATE = "$migrate"
#: ``_meta`` key of the applied version (absent: the module's initial version)
CODE_KEY = b"code"


def switch_of(cs: ChangeSet | ChangeSetBuilder) -> str | None:
    """The version a switch entry switches to (None for any other entry)."""
    t = cs.topology
    return t[len(SWITCH):] if t is not None and t.startswith(SWITCH) else None


class ModuleCode:
    """The versions of one module this worker has loaded, by version id; any other is loaded on demand."""

    def __init__(self, name: str, initial: str, target: str, load: Callable[[str], ModuleDefinition], *,
                 on_missing: MissingModule | None = None) -> None:
        self.name = name
        #: the version a replica runs before its first switch entry
        self.initial = initial
        #: the version the module's spec names: leaders switch to it
        self.target = target
        self._load = load
        #: the runners' hook for a hop naming a function of a version not imported yet (:func:`topology.refs.resolve`)
        self.on_missing = on_missing
        self._defs: dict[str, ModuleDefinition] = {}
        self._lock = threading.Lock()

    def add(self, version: str, definition: ModuleDefinition) -> None:
        self._defs.setdefault(version, definition)

    def has(self, version: str) -> bool:
        return version in self._defs

    def get(self, version: str) -> ModuleDefinition:
        found = self._defs.get(version)
        if found is not None:
            return found
        with self._lock:  # one loader at a time (a replica replaying a switch this worker never prepared)
            if version not in self._defs:
                log.warning("module %s: loading code version %s now (it was not prepared here)", self.name,
                            version[:12])
                self._defs[version] = self._load(version)
        return self._defs[version]


class GroupCode:
    """One replica's versions (see the module docstring); its methods run on the replica's task thread unless
    they say otherwise."""

    def __init__(self, module: ModuleCode, tasks: int, groups: int, group: int) -> None:
        self.module = module
        self.tasks = tasks
        self.groups = groups
        self.group = group
        self._runners: dict[str, StreamRunner] = {}
        self.applied = module.initial
        #: leader: (offset, version) of a switch entry appended, not applied yet
        self.staged: tuple[int, str] | None = None
        #: the version the store is defined by now (the build version)
        self.current = ""
        self.runner: StreamRunner | None = None
        #: the replica's dataflow (its runner follows the build version)
        self.flow: GroupDataflow | None = None
        #: leader: a switch or migration entry posted and not answered yet (set by the lifecycle)
        self.in_flight = False

    @property
    def build(self) -> str:
        return self.staged[1] if self.staged is not None else self.applied

    def runner_of(self, version: str) -> StreamRunner:
        r = self._runners.get(version)
        if r is None:
            r = self._runners[version] = StreamRunner(self.module.get(version), self.tasks, self.groups, self.group,
                                                      on_missing=self.module.on_missing)
        return r

    def prepare(self, version: str) -> StreamRunner:
        """Any thread: the version's runner, built before the switch needs it."""
        return self.runner_of(version)

    # ------------------------------------------------------------------ the store follows the replog

    def open(self, store: TaskGroupStore) -> None:
        """A store just opened (or installed from a checkpoint): its applied version, from ``_meta``."""
        raw = store.applied_reader().get(META, CODE_KEY)
        self.applied = raw.decode() if raw is not None else self.module.initial
        self.staged = None
        self.current = ""
        self.use(store)

    def stage_entry(self, offset: int, builder: ChangeSetBuilder, store: TaskGroupStore) -> bytes:
        """Leader: stage an entry tagged with a topology (a microbatch, a switch, a migration batch) at ``offset``.

        Returns its payload, encoded again: a switch or migration entry's batch id becomes ``offset`` here
        (:func:`tag_entry`); a switch entry changes the build version at once.
        """
        tag_entry(offset, builder)
        payload = store.stage(offset, builder)
        self.staged_entry(offset, builder, store)
        return payload

    def staged_entry(self, offset: int, cs: ChangeSet | ChangeSetBuilder, store: TaskGroupStore) -> None:
        version = switch_of(cs)
        if version is not None:
            self.staged = (offset, version)
            self.use(store)

    def dropped_staged(self, store: TaskGroupStore) -> None:
        if self.staged is not None:
            self.staged = None
            self.use(store)

    def applied_entry(self, offset: int, cs: ChangeSet, store: TaskGroupStore) -> None:
        version = switch_of(cs)
        if version is not None:
            before = self.module.get(self.applied)
            self.applied = version
            if self.staged is not None and self.staged[0] <= offset:
                self.staged = None
            self.use(store)
            self._drop(before, store)
            log.info("%s/%d: switched to code version %s at offset %d", self.module.name, self.group, version[:12],
                     offset)
        elif cs.topology == MIGRATE:
            store.migrations = self._migrations(self.module.get(self.current), store)

    def open_empty(self) -> None:
        """A replica whose store does not exist yet (it is empty: ``ReplicaStore.deferred``): the initial version's
        runner now; :meth:`open` defines the store once it is created."""
        self.applied = self.module.initial
        self.staged = None
        self.current = ""
        self.runner = self.runner_of(self.build)

    def shape(self) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The build version's PStates (name: schema) and depots: what :meth:`use` defines the store by."""
        d = self.module.get(self.build)
        return {n: p.schema for n, p in d.pstates.items()}, tuple(d.depot_names())

    def use(self, store: TaskGroupStore) -> None:
        """Define the store by the build version (a no-op unless it changed), with its running migrations."""
        version = self.build
        d = self.module.get(version)
        if version != self.current:
            store.redefine(*self.shape())
            self.current = version
            self.runner = self.runner_of(version)
            if self.flow is not None:
                self.flow.runner = self.runner
        store.migrations = self._migrations(d, store)

    def _drop(self, before: ModuleDefinition, store: TaskGroupStore) -> None:
        """Delete what the version switched from declared and neither the applied nor the build version does."""
        keep = [self.module.get(self.applied), self.module.get(self.build)]
        pstates = [p for p in before.pstates if all(p not in k.pstates for k in keep)]
        depots = [d for d in before.depots if all(d not in k.depots for k in keep)]
        if pstates or depots:
            log.warning("%s/%d: deleting dropped %s", self.module.name, self.group, ", ".join(pstates + depots))
            store.drop(pstates, depots)

    @staticmethod
    def _migrations(d: ModuleDefinition, store: TaskGroupStore) -> dict[str, ActiveMigration]:
        """The migrations running here: started (as this leader sees it) and not applied to their end."""
        out = {}
        for name, decl in d.pstates.items():
            m = decl.migration
            if m is None:
                continue
            seen = read_record(store.leader_reader(), name)
            if seen is None or seen.id != m.id:
                continue
            applied = read_record(store.applied_reader(), name)
            if applied is not None and applied.id == m.id and applied.done:
                continue
            schema = check_top_level(name, decl.schema)
            assert isinstance(schema, Map)
            out[name] = ActiveMigration(m.id, m.fn, schema.value)
        return out

    # ------------------------------------------------------------------ entries a leader builds

    def switch_entry(self, store: TaskGroupStore, version: str) -> ChangeSetBuilder | None:
        """The switch entry to ``version`` (None if this group builds with it already)."""
        if self.build == version:
            return None
        old, new = self.module.get(self.build), self.module.get(version)
        b = store.changes(SWITCH + version, 0)  # the batch id becomes the entry's offset (see tag_entry)
        b.writes.put(META, CODE_KEY, version.encode())
        # new PStates and depots live in spare column families: creating one would stall the worker
        aliases = read_aliases(b.reader.scan(META, ALIAS, ALIAS_END))
        free = store.families.free_spares(aliases)
        for cf in [pstate_cf(p) for p in new.pstates] + [depot_cf(d) for d in new.depots]:
            if free and cf not in store.families.real and cf not in aliases:
                b.writes.put(META, alias_key(cf), free.pop(0).encode())
        for name, decl in new.pstates.items():
            m = decl.migration
            if m is None:
                continue
            rec = read_record(b.reader, name)
            if rec is not None and rec.id == m.id:
                continue  # declared before: started then (or done)
            # values of a PState that existed are migrated; a new PState has nothing to migrate
            write_record(b.writes, name, MigrationRecord(m.id, FIRST_KEY if name in old.pstates else None, 0))
        return b

    def migration_entry(self, store: TaskGroupStore, limit: int) -> ChangeSetBuilder | None:
        """A batch rewriting up to ``limit`` values of the first unfinished migration (None: none left)."""
        for name, mig in store.migrations.items():
            b = store.changes(MIGRATE, 0)
            rec = read_record(b.reader, name)
            if rec is not None and rec.id == mig.id and rec.done:
                continue  # rewritten to the end in an entry not applied yet
            rewrite_batch(b.reader, b.writes, pstate_cf(name), name, mig, limit)
            return b
        return None

    def status(self, store: TaskGroupStore) -> dict[str, Any]:
        """The version applied, the one building, and every migration's progress (any thread: racy reads)."""
        migrations = []
        d = self.module.get(self.current or self.applied)
        for name, decl in d.pstates.items():
            if decl.migration is None:
                continue
            rec = read_record(store.applied_reader(), name)
            if rec is not None and rec.id == decl.migration.id:
                migrations.append({"pstate": name, "id": rec.id, "done": rec.done, "rewritten": rec.rewritten})
        return {"code_version": self.applied, "code_build": self.build, "migrations": migrations}


def tag_entry(offset: int, builder: ChangeSetBuilder) -> None:
    """A switch or migration entry's batch id is its own offset: unique and rising, so apply never skips one."""
    if builder.topology is not None and (builder.topology == MIGRATE or builder.topology.startswith(SWITCH)):
        builder.batch_id = offset
