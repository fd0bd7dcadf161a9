"""What a worker knows of one deployed module (:class:`ModuleRuntime`), shared by the worker and its recovery."""

from __future__ import annotations

from conductor.metastore.module_spec import ModuleSpec
from conductor.worker.replica_faults import Backoff, Fault
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from topology.group_code import ModuleCode


class ModuleRuntime:
    """What a node knows of one deployed module: its spec, its code versions, its local replicas."""

    def __init__(self, spec: ModuleSpec, code: ModuleCode) -> None:
        self.spec = spec
        #: the module's code versions loaded here (a replica may run an older one until its switch entry)
        self.code = code
        self.hosts: dict[int, ReplicaHost] = {}
        self.stores: dict[int, ReplicaStore] = {}
        self.replicas: dict[int, tuple[str, ...]] = {}
        #: per group: the last fault of the local replica and its restart backoff (kept across restarts)
        self.faults: dict[int, Fault] = {}
        self.backoffs: dict[int, Backoff] = {}
