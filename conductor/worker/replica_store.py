"""A worker's view of one replica's RocksDB store (:class:`ReplicaStore`).

`pstate.TaskGroupStore` knows nothing of the network; this module adapts it to
what the replica host and the gRPC services need: applying and staging replog
entries (:mod:`topology.entries` builds them), and answering queries
whose paths arrive in the wire format of :mod:`pstate.query`.

A replica a reassignment adds opens with no store on disk
(:meth:`ReplicaStore.deferred`): the store is created when first used (an
apply, a query), and never when a far-horizon install comes first, as it
does for a copy of a leader whose replog no longer holds the group's start.
Creating an empty RocksDB store with a module's column families holds the
GIL through about twenty fsyncs (30-110 ms on a loaded 2-core box, the
worker's other replicas stopped meanwhile), for a store the install throws
away a few seconds later. Until it exists the store is empty, and answers as
one: applied offset -1, no depot data. A restart meanwhile finds no store
either, and opens an empty one as before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path as FsPath
from typing import Any

import msgpack

from conductor.worker.store_swap import PreparedStore, closes_after_swap
from conductor.worker.subscriptions import AppliedFeed
from pstate import TaskGroupStore
from pstate.changes import ChangeSet
from pstate.checkpoint import Checked, Manifest, store_dir, swap_in
from pstate.diffs import WHOLE
from pstate.errors import StoreClosed
from pstate.packed_records import PackedRecords
from pstate.path import P
from pstate.query import ResolveFn, decode_query
from pstate.retention import PartitionSize, partition_sizes
from pstate.store import ChangeSetBuilder
from replog.errors import OffsetOutOfRange
from topology.dataflow.group import GroupDataflow
from topology.group_code import GroupCode

log = logging.getLogger("millrace.node")


class ReplicaStore:
    """One replica's store, shaped for the replica host (task thread) and the query services (event loop)."""

    def __init__(self, store: TaskGroupStore | None, code: GroupCode | None = None, path: FsPath | None = None
                 ) -> None:
        assert store is not None or code is not None, "a deferred store is defined by its code versions"
        #: the store, None until a deferred one is created (:attr:`store`)
        self._store = store
        if path is None:
            assert store is not None, "a deferred store needs its path"
            path = FsPath(store.path)
        #: where the replica's store lives: a symlink to the versioned directory the store is opened at
        #: (``self.store.path``; ``pstate.checkpoint.store_dir``), which a far-horizon install replaces
        self.path = path
        #: the replica's code versions; the store and the runner follow its build version (group_code)
        self.code = code
        #: held while a deferred store is created, and by an install's swap (neither sees the other half done)
        self._creating = threading.Lock()
        #: a deferred store closed before it was created: it never will be
        self._closed = False
        #: the replica's recent applied entries and its subscriptions' topics (conductor.worker.subscriptions)
        self.feed = AppliedFeed(self.read_value)
        if code is not None:
            if store is not None:
                code.open(store)
            else:
                code.open_empty()

    @classmethod
    def open_versioned(cls, path: FsPath, code: GroupCode, *, defer_empty: bool = False) -> ReplicaStore:
        """Open a replica's store defined by the code version its applied state is in (``_meta``); ``defer_empty``:
        none on disk is created when first used (:meth:`deferred`)."""
        if defer_empty and not os.path.lexists(path):
            return cls.deferred(path, code)
        store = TaskGroupStore(store_dir(path), {}, ())
        try:
            return cls(store, code, path)
        except BaseException:  # damage found reading the applied version: release it for the quarantine
            store.abandon()
            raise

    @classmethod
    def deferred(cls, path: FsPath, code: GroupCode) -> ReplicaStore:
        """A replica's store that is not on disk yet (nothing at ``path``): created when first used (see the
        module docstring), or never, if a far-horizon install comes first."""
        assert not os.path.lexists(path), path
        return cls(None, code, path)

    @property
    def store(self) -> TaskGroupStore:
        """The RocksDB store (a deferred one is created here, by whichever thread needs it first)."""
        store = self._store
        return store if store is not None else self._create()

    @property
    def created(self) -> bool:
        """The store exists (False only for a deferred store not used yet: it is empty)."""
        return self._store is not None

    def _create(self) -> TaskGroupStore:
        with self._creating:
            if self._store is None:
                if self._closed:
                    raise StoreClosed(os.fspath(self.path))
                assert self.code is not None
                began = time.perf_counter()
                store = TaskGroupStore(store_dir(self.path), {}, ())
                try:
                    self.code.open(store)
                except BaseException:
                    store.abandon()
                    raise
                self._store = store
                self.feed.reset()
                log.info("%s: created the replica's empty store on first use (%.1f ms)", self.path,
                         (time.perf_counter() - began) * 1e3)
            assert self._store is not None
            return self._store

    def verify(self) -> None:
        """Check the store's files (``TaskGroupStore.verify``); one not created yet has none."""
        if self._store is not None:
            self._store.verify()

    def current(self) -> TaskGroupStore:
        """The store object now (a far-horizon install replaces it; holders of the old one would read a closed store)."""
        return self.store

    # ---------------------------------------------------------------- replica host (task thread)

    @property
    def applied_offset(self) -> int:
        store = self._store
        return -1 if store is None else store.applied_offset  # (not created yet: empty)

    def apply_entries(self, entries: list[tuple[int, int, bytes]], flow: GroupDataflow | None = None) -> None:
        """Apply entries in order; a leader's dataflow learns what each one consumed and sent."""
        feed = self.feed
        for offset, _type, payload in entries:
            cs = ChangeSet.decode(payload)
            before = self.store.applied_offset
            # (a replayed microbatch applies nothing, so it sent nothing either)
            wrote = self.store.apply(offset, cs)
            if wrote and flow is not None:
                flow.applied(offset, cs)
            if self.code is not None and cs.topology is not None:
                self.code.applied_entry(offset, cs, self.store)
            if offset > before:
                feed.applied(offset, cs if wrote else None, len(payload))
        feed.flush()

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
        if self._store is None:
            return  # (nothing is staged on a store not created yet: staging creates it)
        self.store.drop_staged()
        if self.code is not None:
            self.code.dropped_staged(self.store)

    def flush(self) -> None:
        if self._store is not None:
            self._store.flush()

    def checkpoint(self, directory: FsPath, leader_epoch: int) -> Manifest:
        manifest: Manifest = self.store.checkpoint(directory, leader_epoch)
        return manifest

    def prepare_install(self, staging: FsPath, manifest: Manifest, checked: Checked) -> PreparedStore:
        """Off the task thread: a fetched checkpoint verified (but for the files ``checked`` on arrival) beside
        the store and opened, for :meth:`install_prepared` (:mod:`conductor.worker.store_swap`)."""
        store = self._store
        if store is None:  # (not created: defined by the build version, as it would have been)
            assert self.code is not None
            return PreparedStore.prepare(staging, manifest, self.path, checked, *self.code.shape())
        return PreparedStore.prepare(staging, manifest, self.path, checked, store.schemas, store.depots)

    def install_prepared(self, prepared: PreparedStore) -> None:
        """Task thread: swap in a prepared store the caller claimed (:meth:`PreparedStore.claim`).

        The old store is closed first when it was opened through :attr:`path`, which the swap redirects;
        otherwise (opened at its own directory, as an installed store is) ``prepared.finish`` closes it. A
        deferred store not created yet is never created now: nothing is at :attr:`path` until the swap.
        """
        assert prepared.state == "claimed", prepared.state
        with self._creating:
            old = self._store
            close_later = old is None or closes_after_swap(old.path, self.path)
            try:
                if not close_later:
                    assert old is not None
                    old.close()
                old_dir = swap_in(prepared.target, self.path)
            except BaseException:
                if os.path.realpath(self.path) != os.path.realpath(prepared.target):  # not swapped: as it was
                    if not close_later:
                        assert old is not None
                        self._use(TaskGroupStore(store_dir(self.path), old.schemas, old.depots))
                    raise
                prepared.installed(old if close_later else None, None)  # swapped, not known durable: the error goes on
                self._use(prepared.store)
                raise
            prepared.installed(old if close_later else None, old_dir)
            self._use(prepared.store)

    def _use(self, store: TaskGroupStore) -> None:
        self._store = store
        self.feed.reset()
        if self.code is not None:
            self.code.open(store)

    def close(self) -> None:
        with self._creating:
            self._closed = True
            if self._store is not None:
                self._store.close()

    def abandon(self) -> None:
        with self._creating:
            self._closed = True
            if self._store is not None:
                self._store.abandon()

    # ---------------------------------------------------------------- queries (any thread)

    def select(self, pstate: str, task: int, raw_path: bytes, one: bool,
               resolve_fn: ResolveFn | None = None) -> tuple[bytes, int]:
        """``resolve_fn``: how named ``filter``/``view`` functions are found (None: refused)."""
        path = decode_query(raw_path, resolve_fn)
        view = self.store.pstate(pstate)
        value: Any = view.select_one(path) if one else view.select(path)
        return msgpack.packb(value, use_bin_type=True), self.store.applied_offset

    def read_value(self, pstate: str, key: Any) -> Any:
        """The applied value of a top-level key (or of the whole PState: ``WHOLE``), for a subscription."""
        view = self.store.pstate(pstate)
        return view.select_one(P) if key is WHOLE else view.select_one(P.key(key))

    def read_applied(self, pstate: str, key: Any) -> tuple[Any, int]:
        """:meth:`read_value` and the applied offset it reflects, with no apply in between."""
        out: tuple[Any, int] = self.store.read_applied(lambda _s: self.read_value(pstate, key))
        return out

    def depot_read(self, depot: str, task: int, start: int, end: int | None, max_bytes: int, strict: bool = False
                   ) -> tuple[PackedRecords, int, int, list[int]]:
        """(records as stored, packed; first offset, next, offsets): offsets only for a key-compacted
        partition (gaps), else [] (:meth:`pstate.depots.DepotView.read_packed`).

        ``strict``: a start below the partition's start (trimmed records) is :class:`OffsetOutOfRange`
        rather than a read from the start.
        """
        view = self.store.depot(depot)
        if strict:
            info = view.partition_info(task)
            if start < info.start:
                raise OffsetOutOfRange(start, info.start, info.end)
        return view.read_packed(task, start, end, max_bytes)

    def depot_sizes(self) -> list[tuple[str, int, PartitionSize]]:
        """Each depot partition's offsets, records and bytes (applied state), for status and metrics."""
        if self._store is None:
            return []  # (not created yet: empty, and a scrape does not create it)
        return [row for row in partition_sizes(self.store.applied_reader()) if row[0] in self.store.depots]

    def depot_info(self, depot: str, task: int) -> tuple[int, int]:
        info = self.store.depot(depot).partition_info(task)
        return info.start, info.end

    def depot_bytes(self) -> dict[str, int]:
        """Each depot's bytes of live SST files on this replica (its flushed data on disk: GroupStatus)."""
        if self._store is None:
            return {}  # (not created yet: no files)
        return self.store.depot_bytes()

    def depot_times(self, depot: str, task: int, start: int, stop: int) -> list[tuple[int, int]]:
        """The times of records ``[start, stop)`` as runs (first offset, ms; -1 = none), :mod:`pstate.depots`."""
        return self.store.depot(depot).time_runs(task, start, stop)

    def depot_offset_for_time(self, depot: str, task: int, time_ms: int) -> int | None:
        """The first offset whose max-so-far time is >= ``time_ms`` (None: none), :mod:`pstate.depots`."""
        return self.store.depot(depot).offset_for_time(task, time_ms)
