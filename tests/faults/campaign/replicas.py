"""The final state of every replica, read from its files with the project's own replog and PState code.

Read once the workers are stopped: the replog bytes (verified: every frame's CRC), the depot records of
every task, the counts of every key in every PState, and the applied offset. A replica whose files cannot
be read is reported with the reason, never skipped.

A follower learns the apply offset from the leader's next frame, and a store's files may lag its applied
offset (RocksDB runs without its WAL: the replog is the write-ahead log), so a stopped replica's store can
be behind the group's commit point by design. Before reading, each replica applies its own replog up to the
commit point with the product's apply path, exactly as the worker would on restart or on its next frame;
how many entries that took is reported.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.worker.replica_store import ReplicaStore
from pstate import TaskGroupStore
from replog.log import Log
from tests.faults.campaign.module import COUNTED, KEYS, Campaign


@dataclass
class ReplicaState:
    """What one replica of one group holds on disk."""

    worker: str
    group: int
    error: str | None = None
    log_start: int = 0
    log_end: int = 0
    replog: bytes = b""
    #: offset -> CRC-32 of (epoch, type, payload): compares logs that start at different offsets (a replica a
    #: reassignment added copied a checkpoint, so its log starts after the leader's)
    entries: dict[int, int] = field(default_factory=dict)
    applied: int = -1
    #: entries applied from its own replog before reading (see the module docstring)
    caught_up: int = 0
    #: (depot, task) -> [(offset, record)]
    depots: dict[tuple[str, int], list[tuple[int, Any]]] = field(default_factory=dict)
    #: pstate -> key -> count (every key of module.KEYS that has one)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def records(self) -> list[tuple[str, Any]]:
        """(depot, record) of every depot record this replica holds."""
        return [(d, rec) for (d, _task), rows in sorted(self.depots.items()) for _off, rec in rows]


def applied_on_disk(gdir: Path) -> int | None:
    """The applied offset a stopped replica's store holds (None if it cannot be opened)."""
    definition = Campaign().build()
    try:
        store = TaskGroupStore(gdir / "state", {n: d.schema for n, d in definition.pstates.items()},
                               definition.depot_names())
    except Exception:
        return None
    try:
        return store.applied_offset
    finally:
        store.close()


def read_replica(gdir: Path, worker: str, group: int, tasks: int, commit: int) -> ReplicaState:
    """Read one replica's replog and store, after applying its replog up to `commit` (the group's commit
    point); the error (not an exception) if either cannot be read."""
    st = ReplicaState(worker, group)
    if not gdir.exists():
        st.error = f"no data folder {gdir}"
        return st
    definition = Campaign().build()
    try:
        with Log.open(gdir / "replog", fsync="none", verify=True) as log:
            st.log_start, st.log_end = log.start_offset, log.end_offset
            st.replog = log.read(log.start_offset, 1 << 31) if log.end_offset > log.start_offset else b""
            st.entries = {off: zlib.crc32(payload, zlib.crc32(b"%d:%d:" % (epoch, typ)))
                          for off, epoch, typ, payload in log.read_entries(log.start_offset, log.end_offset)}
        store = TaskGroupStore(gdir / "state", {n: d.schema for n, d in definition.pstates.items()},
                               definition.depot_names())
        try:
            upto = min(commit, st.log_end - 1)
            if upto > store.applied_offset:
                with Log.open(gdir / "replog", fsync="none") as log:
                    entries = log.read_entries(store.applied_offset + 1, upto + 1)
                st.caught_up = len(entries)
                ReplicaStore(store).apply_entries([(off, typ, payload) for off, _e, typ, payload in entries])
            st.applied = store.applied_offset
            for d in definition.depot_names():
                for task in range(tasks):
                    rows = store.depot(d).read(task, 0, None, 1 << 31)
                    if rows:
                        st.depots[(d, task)] = rows
            for pstate in (p for p in COUNTED.values() if p):
                view = store.pstate(pstate)
                st.counts[pstate] = {k: v for k in KEYS if (v := view.select_one(k))}
        finally:
            store.close()
    except Exception as e:
        st.error = f"{type(e).__name__}: {e}"
    return st
