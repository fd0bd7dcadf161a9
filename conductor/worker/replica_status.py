"""A replica's status as plain data, for `conductor status`, `GroupStatus` and the metrics.

Read racily from another thread than the replica's task thread: each field is one read of a value the task
thread replaces whole, which is good enough for display; nothing decides on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor.worker.replica_host import ReplicaHost


def replica_status(host: ReplicaHost) -> dict[str, Any]:
    """A snapshot of ``host``: role, epoch, offsets, followers, ISR, storage, catch-up, dataflow and fault."""
    r = host.replica
    return {
        "role": r.role.value, "epoch": r.epoch, "leader": r.leader, "log_start": host.log.start_offset,
        "log_end": r.log_end, "apply_offset": r.apply_offset, "applied": r.applied,
        "followers": r.follower_offsets(), "isr": list(r.isr), "stalled": r.stalled,
        "storage": {"incarnation": host.incarnation, "recorded": r.registered, "lost": host.storage_lost},
        "catchup": host.catchup.progress if host.catchup is not None and host.catchup.running else None,
        "dataflow": host.dataflow.status() if host.dataflow is not None else None,
        "fault": host.fault or host.last_fault, "failed": host.fault is not None,
    }
