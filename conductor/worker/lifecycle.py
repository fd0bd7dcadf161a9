"""A worker's side of ``conductor update``: prepare a version, have leaders switch to it, pace migrations.

Nothing here runs on a task thread but the entries it posts, and those are
cheap: the version is imported and defined and its runners built when it is
*prepared* (the Code service's Prepare, on a
gRPC worker thread), or by this lifecycle's own thread for a replica that
missed the prepare. A leader's task thread then only builds the switch entry
(one ``_meta`` write) and swaps dictionaries, in the drain that appends it;
appends before and after it in the same drain are built by the old and the
new version respectively (:mod:`topology.group_code`).

One thread per worker looks at its leaders every few milliseconds while
something is to do: a group whose build version is not the spec's gets a
switch entry; a group with a running PState migration gets one bounded
rewrite batch per ``migration.batch.interval.millis``. Each is a replog
entry posted like a client append, at most one in flight per group.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from conductor.client.code import CodeCache, code_sources
from conductor.metastore import Metastore
from conductor.metastore.module_spec import (
    MIGRATION_BATCH_INTERVAL_MS,
    MIGRATION_BATCH_KEYS,
    PATH_VERSION,
    ModuleSpec,
)
from conductor.wire import millrace_pb2 as pb
from conductor.worker.dataflow import DataflowDriver
from conductor.worker.hosted import HostedReplica
from conductor.worker.inbox import AttachDataflow
from conductor.worker.pending_entry import PendingEntry
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.runtime import LocalModules, ModuleRuntime
from replog.messages import Ack
from topology.code_loader import ALIAS_PREFIX
from topology.dataflow.group import Batch, GroupDataflow
from topology.dataflow.shipping import Pull
from topology.entries.requests import CodeSwitch, MigrationBatch
from topology.group_code import GroupCode, ModuleCode
from topology.module import ModuleDefinition, ModuleDefinitionError, load_module

log = logging.getLogger("millrace.node")

#: how often the lifecycle thread looks at its leaders while a switch or a migration is running; otherwise
#: it sleeps until woken (a spec change, a prepare) or for IDLE_S
BUSY_S = 0.01
IDLE_S = 0.5

#: sends a replica's dataflow message: (module, group, node or None for the group's leader, message)
SendFlow = Callable[[str, int, str | None, Pull | Batch], None]


class CodeLifecycle:
    """See the module docstring."""

    def __init__(self, node_id: str, code: CodeCache, metastore: Metastore, modules: LocalModules,
                 send_flow: SendFlow) -> None:
        self.node_id = node_id
        #: the code versions this worker stores (fetched from holders when missing)
        self.code = code
        self.metastore = metastore
        self.modules = modules
        self.send_flow = send_flow
        self._wake = threading.Event()
        self._stopped = False
        self._next_batch: dict[tuple[str, int], float] = {}
        self._thread = threading.Thread(target=self._run, name="code-lifecycle", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    # ------------------------------------------------------------------ versions

    def module_code(self, spec: ModuleSpec) -> ModuleCode:
        return ModuleCode(spec.name, spec.initial_version, spec.version,
                          functools.partial(self._load, spec.name, spec.module_ref, spec.defined_as or spec.name),
                          on_missing=self.load_referenced)

    def _load(self, module: str, module_ref: str, declared: str, version: str) -> ModuleDefinition:
        """Import and define ``version`` (fetched from a holder if this worker lacks it); the code must declare
        ``declared`` (the module's name, or the one it was restored from: ``ModuleSpec.defined_as``)."""
        if version.startswith(PATH_VERSION):
            definition = load_module(version[len(PATH_VERSION):]).build()
        else:
            found = self.metastore.versions.get(module, version)
            ref = found.module_ref if found is not None else module_ref
            if not self.code.has(version):
                self.code.fetch(version, code_sources(self.metastore, module, version, exclude=self.node_id))
            definition = self.code.load(version, ref).build()
        if definition.name != declared:
            raise ModuleDefinitionError(f"code version {version[:12]} declares module {definition.name!r}, not "
                                        f"{declared!r}")
        return definition

    def load_referenced(self, module_name: str) -> None:
        """Every runner's ``on_missing`` (:func:`topology.refs.resolve`): import the code version a hop's function
        reference names, if a module running here keeps it (its task thread waits: only hops sent before a
        restart get here)."""
        if not module_name.startswith(ALIAS_PREFIX):
            return
        version = module_name[len(ALIAS_PREFIX):].partition(".")[0]
        for rt in self.modules.runtimes():
            if rt.code.has(version) or self.metastore.versions.get(rt.spec.name, version) is not None:
                rt.code.get(version)
                return

    def prepare(self, module: str, version: str, definition: ModuleDefinition) -> None:
        """Code service, off the loop: ``version`` of a module running here is loaded; ready every replica."""
        rt = self.modules.get(module)
        if rt is None:
            return  # a deploy: the module opens with it
        rt.code.add(version, definition)
        for rec in list(rt.hosted.values()):
            if rec.store is not None:
                self._ready(rt, rec, rec.store, version)

    def _ready(self, rt: ModuleRuntime, rec: HostedReplica, store: ReplicaStore, version: str) -> None:
        """The runner of ``version`` for replica ``rec``, and a dataflow if it starts needing one."""
        code = store.code
        assert code is not None
        runner = code.prepare(version)
        host = rec.host
        if not runner.active or code.flow is not None or host is None:
            return
        flow = GroupDataflow(store.current, runner)
        driver = DataflowDriver(rec.name, flow, functools.partial(self.send_flow, rt.spec.name))
        host.post(AttachDataflow(flow, driver, code, runner))

    def target(self, rt: ModuleRuntime, spec: ModuleSpec) -> None:
        """The module's spec names ``spec.version``: leaders switch to it."""
        if rt.code.target != spec.version:
            log.warning("module %s: switching to code version %s", spec.name, spec.version[:12])
            rt.code.target = spec.version
        self._wake.set()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stopped:
            busy = False
            for rt in self.modules.runtimes():
                try:
                    busy |= self._tick(rt)
                except Exception:
                    log.exception("module %s: code lifecycle step failed; trying again", rt.spec.name)
                    busy = True
            self._wake.wait(BUSY_S if busy else IDLE_S)
            self._wake.clear()

    def _tick(self, rt: ModuleRuntime) -> bool:
        """Post what each local leader of ``rt`` needs; True while something is left to do."""
        busy = False
        target = rt.code.target
        now = time.monotonic()
        for rec in list(rt.hosted.values()):
            host, store = rec.host, rec.store
            code = store.code if store is not None else None
            if host is None or store is None or code is None or not host.replica.is_leader:
                continue
            if code.build != target:
                busy = True
                if not code.in_flight:
                    self._ready(rt, rec, store, target)  # (a no-op once prepared)
                    self._post(host, code, CodeSwitch(target))
            elif store.current().migrations:
                busy = True
                key = (rt.spec.name, rec.group)
                if not code.in_flight and now >= self._next_batch.get(key, 0.0):
                    self._next_batch[key] = now + rt.spec.option(MIGRATION_BATCH_INTERVAL_MS) / 1000
                    limit = rt.spec.option(MIGRATION_BATCH_KEYS)
                    self._post(host, code, MigrationBatch(limit))
        return busy

    @staticmethod
    def _post(host: ReplicaHost, code: GroupCode, request: CodeSwitch | MigrationBatch) -> None:
        code.in_flight = True

        def done(_offset: int, _result: Any, error: Exception | None) -> None:
            code.in_flight = False
            if error is not None:
                log.info("%s: a code lifecycle entry was not appended (%s); trying again", host.name, error)
        host.post(PendingEntry(request, 0, Ack.NONE, done))


def code_status(rec: HostedReplica | None) -> dict[str, Any]:
    """GroupStatus fields of a replica's code versions and migrations (none for a replica not open here)."""
    store = rec.store if rec is not None else None
    if store is None or store.code is None:
        return {}
    s = store.code.status(store.current())
    return {"code_version": s["code_version"], "code_build": s["code_build"],
            "migrations": [pb.MigrationProgress(**m) for m in s["migrations"]]}
