"""What a worker keeps of one task group's replica it hosts (:class:`HostedReplica`), across its restarts."""

from __future__ import annotations

from dataclasses import dataclass, field

from conductor.worker.dataflow import DataflowDriver
from conductor.worker.replica_faults import Backoff, Fault
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.replica_store import ReplicaStore
from conductor.worker.timings import ReplicaTimings, new_timings, replica_counters
from topology.group_code import GroupCode
from topology.stream import StreamRunner


@dataclass(eq=False)
class HostedReplica:
    """One task group's replica on this worker: the record every part of the worker reads it by.

    It outlives the replica's hosts: a fault closes the host and recovery opens a new one from disk in the
    same record, which keeps the fault, the restart backoff and the counters. ``host`` and ``store`` are set
    together, by each open; they are None only while the replica could not open (recovery tries again).
    """

    module: str
    group: int
    #: the group's replicas in placement order (a CAS on the group znode keeps it)
    replicas: tuple[str, ...]
    #: the open replica: its task thread, replog and state machine (None while it could not open)
    host: ReplicaHost | None = None
    #: its applied state, the code versions it builds entries with (``store.code``)
    store: ReplicaStore | None = None
    #: the stream topologies the replica opened with (client appends run them)
    stream_runner: StreamRunner | None = None
    #: the last fault of the local replica and its restart backoff
    fault: Fault | None = None
    backoff: Backoff = field(default_factory=Backoff)
    #: counters for metrics and ``conductor status``; every host of this replica counts into them
    stats: dict[str, int] = field(default_factory=replica_counters)
    #: latency histograms, kept across restarts too (None with the worker's --metrics-detail off)
    timings: ReplicaTimings | None = field(default_factory=new_timings)

    @property
    def name(self) -> str:
        return f"{self.module}/{self.group}"

    @property
    def code(self) -> GroupCode | None:
        """The code versions of the open replica (None while it could not open)."""
        return self.store.code if self.store is not None else None

    @property
    def dataflow(self) -> DataflowDriver | None:
        """The hops of the open replica's topologies (None when none run here, or it could not open)."""
        return self.host.dataflow if self.host is not None else None
