"""A worker's view of one replica's RocksDB store (:class:`ReplicaStore`).

`pstate.TaskGroupStore` knows nothing of the network; this module adapts it to
what the replica host and the gRPC services need: applying and staging replog
entries (:mod:`topology.entries` builds them), and answering queries
whose paths arrive in the wire format of :mod:`pstate.query`.
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Any

import msgpack

from pstate import TaskGroupStore
from pstate.changes import ChangeSet
from pstate.checkpoint import Manifest, install
from pstate.query import decode_query
from pstate.store import ChangeSetBuilder
from topology.dataflow.group import GroupDataflow
from topology.group_code import GroupCode


class ReplicaStore:
    """One replica's store, shaped for the replica host (task thread) and the query services (event loop)."""

    def __init__(self, store: TaskGroupStore, code: GroupCode | None = None) -> None:
        self.store = store
        #: the replica's code versions; the store and the runner follow its build version (group_code)
        self.code = code
        if code is not None:
            code.open(store)

    @classmethod
    def open_versioned(cls, path: FsPath, code: GroupCode) -> ReplicaStore:
        """Open a replica's store defined by the code version its applied state is in (``_meta``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        store = TaskGroupStore(path, {}, ())
        try:
            return cls(store, code)
        except BaseException:  # damage found reading the applied version: release it for the quarantine
            store.abandon()
            raise

    def current(self) -> TaskGroupStore:
        """The store object now (a far-horizon install replaces it; holders of the old one would read a closed store)."""
        return self.store

    # ---------------------------------------------------------------- replica host (task thread)

    @property
    def applied_offset(self) -> int:
        return self.store.applied_offset

    def apply_entries(self, entries: list[tuple[int, int, bytes]], flow: GroupDataflow | None = None) -> None:
        """Apply entries in order; a leader's dataflow learns what each one consumed and sent."""
        for offset, _type, payload in entries:
            cs = ChangeSet.decode(payload)
            # (a replayed microbatch applies nothing, so it sent nothing either)
            if self.store.apply(offset, cs) and flow is not None:
                flow.applied(offset, cs)
            if self.code is not None and cs.topology is not None:
                self.code.applied_entry(offset, cs, self.store)

    def stage(self, offset: int, builder: ChangeSetBuilder, payload: bytes | None = None) -> bytes:
        if builder.topology is None or self.code is None:
            return self.store.stage(offset, builder, payload)
        return self.code.stage_entry(offset, builder, self.store)

    def stage_inherited(self, entries: list[tuple[int, int, bytes]]) -> None:
        """A new leader's log tail `(applied, log end)` from earlier epochs: make it visible to builders.

        Those entries will be applied once the ISR holds them; change sets built
        meanwhile must read through them, or a depot append would reuse offsets
        an inherited entry already assigned.
        """
        for offset, _type, payload in entries:
            cs = ChangeSet.decode(payload)
            if cs.topology is not None and cs.batch_id is not None \
                    and self.store.batch_committed(cs.topology, cs.batch_id):
                continue  # apply will skip this replayed microbatch; so must the overlay
            b = self.store.changes()
            b.writes.extend(cs)
            self.store.stage(offset, b)
            if self.code is not None:
                self.code.staged_entry(offset, cs, self.store)

    def drop_staged(self) -> None:
        self.store.drop_staged()
        if self.code is not None:
            self.code.dropped_staged(self.store)

    def flush(self) -> None:
        self.store.flush()

    def checkpoint(self, directory: FsPath, leader_epoch: int) -> Manifest:
        manifest: Manifest = self.store.checkpoint(directory, leader_epoch)
        return manifest

    def install_checkpoint(self, staging: FsPath, manifest: Manifest) -> None:
        """Swap in a fetched checkpoint (verified again by ``install``) and reopen the same PStates and depots."""
        old = self.store
        old.close()
        try:
            install(staging, manifest, old.path)
        finally:
            self.store = TaskGroupStore(old.path, old.schemas, old.depots)
            if self.code is not None:
                self.code.open(self.store)

    def close(self) -> None:
        self.store.close()

    def abandon(self) -> None:
        self.store.abandon()

    # ---------------------------------------------------------------- queries (any thread)

    def select(self, pstate: str, task: int, raw_path: bytes, one: bool) -> tuple[bytes, int]:
        path = decode_query(raw_path)
        view = self.store.pstate(pstate)
        value: Any = view.select_one(path) if one else view.select(path)
        return msgpack.packb(value, use_bin_type=True), self.store.applied_offset

    def depot_read(self, depot: str, task: int, start: int, end: int | None, max_bytes: int) -> tuple[list[bytes], int, int]:
        first, nxt, records = self.store.depot(depot).read_raw(task, start, end, max_bytes)
        return records, first, nxt

    def depot_info(self, depot: str, task: int) -> tuple[int, int]:
        info = self.store.depot(depot).partition_info(task)
        return info.start, info.end

    def depot_times(self, depot: str, task: int, start: int, stop: int) -> list[tuple[int, int]]:
        """The times of records ``[start, stop)`` as runs (first offset, ms; -1 = none), :mod:`pstate.depots`."""
        return self.store.depot(depot).time_runs(task, start, stop)

    def depot_offset_for_time(self, depot: str, task: int, time_ms: int) -> int | None:
        """The first offset whose max-so-far time is >= ``time_ms`` (None: none), :mod:`pstate.depots`."""
        return self.store.depot(depot).offset_for_time(task, time_ms)
