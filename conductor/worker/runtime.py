"""What a worker knows of its deployed modules: :class:`ModuleRuntime` per module, :class:`LocalModules` for all.

``LocalModules`` is the one table every thread of the worker reads replicas from: the gRPC services (the
local leader of a group), the replication links (the replica a peer message is for), the metastore's
callbacks, recovery and the code lifecycle. It is handed to them instead of the worker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

from conductor.metastore.module_spec import ModuleSpec
from conductor.worker.hosted import HostedReplica
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.throttle import CopyBudget
from replog.errors import NotLeader, ReplicaFailed
from topology.group_code import ModuleCode
from topology.stream import StreamRunner


class ModuleRuntime:
    """What a node knows of one deployed module: its spec, its code versions, its local replicas."""

    def __init__(self, spec: ModuleSpec, code: ModuleCode) -> None:
        self.spec = spec
        #: the module's code versions loaded here (a replica may run an older one until its switch entry)
        self.code = code
        #: the groups with a replica on this worker, by group
        self.hosted: dict[int, HostedReplica] = {}
        #: the byte rate every far-horizon copy a reassignment runs here for this module shares
        #: (conductor.worker.throttle): one per worker and module, gone with the module
        self.copy_budget = CopyBudget()

    def host(self, group: int) -> ReplicaHost | None:
        """The open local replica of ``group`` (None if it has none here, or it could not open)."""
        rec = self.hosted.get(group)
        return rec.host if rec is not None else None

    def hosts(self) -> dict[int, ReplicaHost]:
        """The open local replicas, by group (a snapshot)."""
        return {g: r.host for g, r in list(self.hosted.items()) if r.host is not None}


class Leader(NamedTuple):
    """A local replica that leads its group, and what the client API builds that group's entries from."""

    host: ReplicaHost
    store: ReplicaStore
    stream_runner: StreamRunner | None
    spec: ModuleSpec


class LocalModules:
    """The modules open on this worker (see the module docstring); any thread.

    ``resolve`` gives a node's client address, for the ``NotLeader`` that sends a client elsewhere.
    """

    def __init__(self, resolve: Callable[[str], str | None]) -> None:
        self._modules: dict[str, ModuleRuntime] = {}
        #: guards the table, and the swap of a replica's host against its module closing
        self._lock = threading.Lock()
        self._resolve = resolve

    def get(self, module: str) -> ModuleRuntime | None:
        return self._modules.get(module)

    def __contains__(self, module: str) -> bool:
        return module in self._modules

    def names(self) -> list[str]:
        with self._lock:
            return list(self._modules)

    def runtimes(self) -> list[ModuleRuntime]:
        with self._lock:
            return list(self._modules.values())

    def add(self, rt: ModuleRuntime) -> None:
        with self._lock:
            self._modules[rt.spec.name] = rt

    def pop(self, module: str) -> ModuleRuntime | None:
        with self._lock:
            return self._modules.pop(module, None)

    def clear(self) -> list[ModuleRuntime]:
        with self._lock:
            runtimes = list(self._modules.values())
            self._modules.clear()
            return runtimes

    def is_open(self, rt: ModuleRuntime) -> bool:
        """``rt`` is still the module's runtime here (not closed, not redeployed)."""
        return self._modules.get(rt.spec.name) is rt

    def place(self, rt: ModuleRuntime, rec: HostedReplica, host: ReplicaHost, replacing: ReplicaHost | None) -> bool:
        """Put a reopened ``host`` in ``rec`` in place of ``replacing``; False if either moved on meanwhile."""
        with self._lock:
            if rec.host is not replacing or not self.is_open(rt):
                return False
            rec.host = host
            return True

    def adopt(self, rt: ModuleRuntime, rec: HostedReplica, replacing: HostedReplica | None) -> bool:
        """Host ``rec``, a replica a reassignment added here, in place of ``replacing`` (None: of none, or a
        removed one); False if the module closed or the group's record changed meanwhile."""
        with self._lock:
            if not self.is_open(rt) or rt.hosted.get(rec.group) is not replacing:
                return False
            rt.hosted[rec.group] = rec
            return True

    def hosts(self) -> list[ReplicaHost]:
        """Every open local replica (metrics, session events)."""
        with self._lock:
            return [h for rt in self._modules.values() for h in rt.hosts().values()]

    def hosted(self, module: str, group: int) -> HostedReplica | None:
        rt = self._modules.get(module)
        return rt.hosted.get(group) if rt is not None else None

    def host(self, module: str, group: int) -> ReplicaHost | None:
        rt = self._modules.get(module)
        return rt.host(group) if rt is not None else None

    def leader(self, module: str, group: int) -> Leader:
        """The local replica if it leads `group`; NotLeader (with where to go) otherwise."""
        rt = self._modules.get(module)
        rec = rt.hosted.get(group) if rt is not None else None
        host = rec.host if rec is not None else None
        if rt is None or rec is None or host is None:
            raise NotLeader(f"{module}/{group}", None, None)
        r = host.replica
        if host.fault is not None:
            raise ReplicaFailed(host.name, host.fault.kind, host.fault.reason)
        if not r.is_leader:
            retry = self._resolve(r.leader) if r.leader else None
            raise NotLeader(host.name, r.leader, r.epoch, retry_at=retry)
        assert rec.store is not None, rec.name  # (set by the open that made the host)
        return Leader(host, rec.store, rec.stream_runner, rt.spec)
