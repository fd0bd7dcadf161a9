"""A worker's view of one replica's RocksDB store (:class:`ReplicaStore`).

`pstate.TaskGroupStore` knows nothing of the network; this module adapts it to
what the replica host and the gRPC services need: applying replog entries,
building client-append change sets on the leader, and answering queries whose
paths arrive in the wire format of :mod:`pstate.query`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path as FsPath
from typing import Any

import msgpack

from pstate import P, TaskGroupStore
from pstate.changes import ChangeSet
from pstate.checkpoint import Manifest, install
from pstate.query import decode_query
from pstate.store import ChangeSetBuilder
from topology.dataflow.entries import Sends, append_through_topologies, build_client_append
from topology.dataflow.group import GroupDataflow
from topology.module import ModuleDefinition
from topology.stream import StreamRunner


class ReplicaStore:
    """One replica's store, shaped for the replica host (task thread) and the query services (event loop)."""

    def __init__(self, store: TaskGroupStore) -> None:
        self.store = store

    @classmethod
    def open(cls, path: FsPath, definition: ModuleDefinition) -> ReplicaStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        pstates = {name: decl.schema for name, decl in definition.pstates.items()}
        return cls(TaskGroupStore(path, pstates, definition.depot_names()))

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

    def build_client_append(self, appends: Iterable[tuple[str, int, Sequence[bytes]]],
                            runner: StreamRunner | None = None) -> tuple[ChangeSetBuilder, list[int], dict[str, list[Any]]]:
        """Leader: one change set appending every record plus the topologies' effects and hops (see entries)."""
        return build_client_append(self.store, runner, appends)

    def build_batch_commit(self, topology: str, batch_id: int, changes: Sequence[Any],
                           runner: StreamRunner | None = None) -> ChangeSetBuilder | None:
        """A microbatch's changes for this group as one change set tagged (topology, batch_id); None if done.

        A record appended to a depot that stream topologies subscribe to goes
        through them, as a hop to this group (see ``append_through_topologies``).
        """
        if self.store.batch_committed(topology, batch_id):
            return None
        b = self.store.changes(topology, batch_id)
        sends = Sends()
        for c in changes:
            key = msgpack.unpackb(c.key, raw=False, strict_map_key=False) if c.key else None
            value = msgpack.unpackb(c.value, raw=False, strict_map_key=False) if c.value else None
            if c.op == "set":
                b.transform(c.target, P.key(key).set(value))
            elif c.op == "add":
                delta = value

                def add(old: Any, delta: Any = delta) -> Any:
                    return (old or 0) + delta

                b.update(c.target, key, add)
            elif c.op == "remove":
                b.transform(c.target, P.key(key).remove())
            elif c.op == "append":
                if runner is not None and c.target in runner.by_depot:
                    append_through_topologies(runner, sends, c.target, c.task, value)
                else:
                    b.depot_append(c.target, c.task, [value])
            else:
                raise ValueError(f"unknown microbatch change op {c.op!r}; use set, add, remove or append")
        sends.write(b)
        return b

    def stage(self, offset: int, builder: ChangeSetBuilder, payload: bytes | None = None) -> bytes:
        return self.store.stage(offset, builder, payload)

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

    def drop_staged(self) -> None:
        self.store.drop_staged()

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
