"""The task-group store: one RocksDB per replica, atomic apply of replog entries.

Column families: one per PState (``pstate:$$name``), one per depot
(``depot:*name``), ``_meta`` (applied offset, depot partition bounds,
microbatch commits, dataflow positions) and ``_outbox`` (:mod:`pstate.outbox`).

Durability model.  The replog is the write-ahead log, so RocksDB's own WAL is
OFF (``WriteOptions.disable_wal``): writing it twice would halve throughput
for nothing.  Without a WAL, whatever sits in memtables is lost on a crash,
and column families flush independently — a ``_meta`` flush could persist
``applied = n`` while a PState's data for entries ``<= n`` was still in a
memtable, or the other way round, and the replica would silently diverge.
``Options.set_atomic_flush(True)`` makes RocksDB flush every column family
together as one MANIFEST commit, and every entry is one WriteBatch holding its
data and ``_meta.applied`` — so after any crash the files on disk hold the
state at exactly some applied offset ``m``, and replaying the replog from
``m + 1`` restores the rest.  (rocksdict only exposes single-CF manual
flushes, which under atomic_flush flush that CF alone; :meth:`flush` therefore
goes through two paths that flush all CFs atomically: a manual compaction of
``_meta``'s applied key, which releases the GIL, then the checkpoint path, whose
``GetLiveFiles`` holds it.)

What holds after a crash.  ``m`` is where the store's last flush left it, which
may be below what it had applied, even below offsets acknowledged to clients
with ``ack="applied"``; the commit rule alone would re-apply those only once the
ISR is back at min-ISR (fault campaign seed 504).  So the replica keeps the
highest offset it applied, its *applied floor*, in its storage marks
(:mod:`replog.marks_file`: written after every apply without a sync, fdatasync'd
with every replog flush) and re-applies its replog up to the floor as soon as
it serves, whatever the ISR (:mod:`replog.replica`).  After a SIGKILL the page
cache keeps the floor, so everything the store applied is applied again before
the replica leads; after a power loss, everything up to the replog flush before
the last applies (the rest is on min-ISR replicas' disks and is applied again
once the ISR recovers).  The WAL stays off: unsynced, it would give the same
SIGKILL guarantee for 6% of apply throughput with 1,000-key entries and 28%
with one-key entries (interleaved A/B in one process), where the floor's write
costs about 5 us per apply call (one per drain, whatever its entries).
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import rocksdict

from pstate.changes import OP_DELETE, OP_DELETE_RANGE, OP_PUT, ChangeSet, Overlay, Writes, decode_any
from pstate.changeset_builder import ChangeSetBuilder as ChangeSetBuilder
from pstate.depots import META as META
from pstate.depots import DepotView as DepotView
from pstate.depots import PartitionInfo as PartitionInfo
from pstate.depots import (
    check_offset,
)
from pstate.depots import depot_cf as depot_cf
from pstate.engine import (
    Engine,
    LayeredReader,
    Reader,
    pack,
    unpack,
)
from pstate.errors import (
    CorruptStore,
    DepotNotFound,
    PStateError,
    PStateNotFound,
    StoreClosed,
    rocks_errors,
    translate,
)
from pstate.families import ALIAS, ALIAS_END, Families, read_aliases, spare_names
from pstate.families import pstate_cf as pstate_cf
from pstate.hidden_versions import HiddenVersions
from pstate.migration import ActiveMigration, MigratingReader
from pstate.path import P, Path
from pstate.reader import DbReader, verify_column_families
from pstate.schema import Map, Set, check_top_level
from pstate.view import PStateView as PStateView

#: envelopes a task group sends to others (see pstate.outbox); its own family, so trims never touch _meta
OUTBOX = "_outbox"
_APPLIED = b"applied"
#: bytes applied since the last flush from which a checkpoint first flushes without the store's lock
#: (``TaskGroupStore._flush_ahead``): a leader's first checkpoint for a far-horizon copy flushed a 24 MB memtable
#: under it, and the group's applies (an ``ack="applied"`` writer's replies) waited 55-100 ms
AHEAD_FLUSH_BYTES = 4 << 20
#: level-0 files per column family that start a compaction (RocksDB's default is 4). Every round of a far-horizon
#: copy makes a checkpoint, and each checkpoint's flush adds a level-0 file to every family written since the
#: last: a compaction between two rounds renames every file it merges (the whole store, when it is all in level 0),
#: and the next round copies them all again. Two copies of two rounds each (a scale from RF 1 to 3) reached 4
#: exactly; 8 leaves room for a third round or a flush ahead (point reads look in every level-0 file: still few)
L0_COMPACTION_TRIGGER = 8
#: threads that open a column family's table files when the store opens (RocksDB's default is 16). RocksDB starts
#: that many less one for every column family, even one with no file: 15 x 9 families, about 135 threads started
#: and joined per open while the caller holds the GIL (rocksdict does not release it). A follower's far-horizon
#: install opened its store in 25-60 ms of GIL on a loaded 2-core box, stopping every other replica of the worker;
#: one thread (the caller's own) opens the few files a replica's families hold in about half of that
FILE_OPENING_THREADS = 1
_BATCH = b"b:"


class TaskGroupStore:
    """RocksDB state of one replica of a task group: PStates, depots and ``_meta``.

    ``pstates`` maps names (``"$$counts"``) to schemas; ``depots`` lists depot
    names (``"*sentences"``).  Opening creates missing column families, so a
    module update that adds a PState just works.  ``write_buffer_size`` is
    the memtable size per column family (small values make crash tests flush
    often).
    """

    def __init__(self, path: str | os.PathLike[str], pstates: Mapping[str, Any], depots: Iterable[str] = (),
                 *, write_buffer_size: int | None = None) -> None:
        self.path = os.fspath(path)
        self.schemas: dict[str, Map | Set] = {n: check_top_level(n, s) for n, s in pstates.items()}
        self.depots: tuple[str, ...] = tuple(depots)
        self._lock = threading.RLock()
        #: held while a trimmed range is compacted (outside ``_lock``); closing waits for it
        self._compacting = threading.Lock()
        self._closed = False
        #: bytes of write batches applied since this store's last flush (RocksDB's own flushes unseen): about
        #: what the memtables hold, which RocksDB's memtable size properties round up to arena blocks of MBs
        self._unflushed = 0
        opts = self._options(write_buffer_size)
        names = [pstate_cf(n) for n in self.schemas] + [depot_cf(d) for d in self.depots]
        with rocks_errors("open", self.path):
            existing = rocksdict.Rdict.list_cf(self.path, rocksdict.Options(raw_mode=True)) \
                if os.path.exists(os.path.join(self.path, "CURRENT")) else []
            opened = ({META, OUTBOX, *spare_names()} | set(existing)) - {"default"}
            cf_opts = {n: self._options(write_buffer_size) for n in opened}
            self._db = rocksdict.Rdict(self.path, opts, column_families=cf_opts)
        try:
            # RocksDB opens damaged table files; the first read of a damaged block fails (campaign seed 2072:
            # a flipped bit in the SST holding _meta failed here as a bare Exception, and the worker gave up
            # the whole module instead of quarantining this replica)
            with rocks_errors("open", self.path):
                self._wo = rocksdict.WriteOptions()
                setattr(self._wo, "disable_wal", True)  # noqa: B010 — stub says method, it is a property
                self._db.set_write_options(self._wo)
                #: column families by logical name (pstate.families: spares an update aliases new ones to)
                self.families = Families(self._db, self.path, lambda: self._options(write_buffer_size),
                                         sorted(opened))
                self._cfs = self.families.cfs
                self._handles = self.families.handles
                self.families.ensure(names, self.families.aliases())
                raw = self._cfs[META].get(_APPLIED)
        except BaseException:  # nothing was written: let go of RocksDB, so the directory can be quarantined
            self._closed = True  # or opened again by this process
            self._drop_handles()
            raise
        self._applied = -1 if raw is None else int.from_bytes(raw, "big")
        self._reader = DbReader(self._cfs, self.path)
        #: PStates whose values are migrated on read (pstate.migration), set by the module's code version
        self.migrations: dict[str, ActiveMigration] = {}
        self._pending = Overlay()
        self._staged_upto = -1
        #: the old versions whole-PState scans stepped over since the last flush (pstate.hidden_versions)
        self.hidden_versions = HiddenVersions()

    def _drop_handles(self) -> None:
        """Close the column families and drop every reference to RocksDB this store holds (some of them may
        not exist yet, after a failed open); RocksDB lets go of the directory when the last one goes."""
        families = self.__dict__.pop("families", None)
        if families is not None:
            families.close()  # (it holds the handles and the database too)
        for name in ("_cfs", "_handles", "_db"):
            self.__dict__.pop(name, None)
        gc.collect()  # handles held in reference cycles go now

    @staticmethod
    def _options(write_buffer_size: int | None) -> rocksdict.Options:
        o = rocksdict.Options(raw_mode=True)
        o.create_if_missing(True)
        o.create_missing_column_families(True)
        o.set_atomic_flush(True)
        o.set_level_zero_file_num_compaction_trigger(L0_COMPACTION_TRIGGER)
        o.set_max_file_opening_threads(FILE_OPENING_THREADS)
        if write_buffer_size is not None:
            o.set_write_buffer_size(write_buffer_size)
        return o

    def redefine(self, pstates: Mapping[str, Any], depots: Iterable[str]) -> None:
        """Take another code version's PStates and depots: missing column families are created (kept ones keep
        their data; dropped ones are hidden until :meth:`drop` deletes them)."""
        schemas = {n: check_top_level(n, s) for n, s in pstates.items()}
        depots = tuple(depots)
        with self._lock:
            self.add_families(schemas, depots)
            self.schemas = schemas
            self.depots = depots

    def add_families(self, pstates: Iterable[str], depots: Iterable[str]) -> None:
        """Column families of these PStates and depots: through the aliases this leader sees (staged
        included), else created (see pstate.families)."""
        with self._lock:
            self._check_open()
            self.families.ensure([pstate_cf(n) for n in pstates] + [depot_cf(d) for d in depots], self.aliases())

    def aliases(self) -> dict[str, str]:
        return read_aliases(self.leader_reader().scan(META, ALIAS, ALIAS_END))

    def drop(self, pstates: Iterable[str], depots: Iterable[str]) -> None:
        """Delete the column families of PStates and depots no version in use declares (their data goes)."""
        with self._lock:
            self._check_open()
            self.families.drop([pstate_cf(n) for n in pstates] + [depot_cf(d) for d in depots], self.aliases())

    # -- lifecycle -----------------------------------------------------------
    def live_sst_bytes(self) -> int:
        """Bytes of the live SST files of every column family (RocksDB's ``rocksdb.live-sst-files-size``); what
        the memtables hold is not in it until a flush. Any thread (metrics read it at scrape time)."""
        with self._lock:
            self._check_open()
            return sum(int(cf.property_int_value("rocksdb.live-sst-files-size") or 0)
                       for name, cf in self._cfs.items() if name in self.families.real)  # (aliases once)

    def depot_bytes(self) -> dict[str, int]:
        """Bytes of each depot's live SST files (as :meth:`live_sst_bytes`, per depot); the UI's depot sizes."""
        with self._lock:
            self._check_open()
            return {d: int(self._cfs[depot_cf(d)].property_int_value("rocksdb.live-sst-files-size") or 0)
                    for d in self.depots if depot_cf(d) in self._cfs}

    def memtable_entries(self, cf: str) -> int:
        """Entries in column family ``cf``'s active memtable (``rocksdb.num-entries-active-mem-table``): it drops
        when the memtable switches, which tells the retention driver a trim's tombstone was flushed
        (:mod:`pstate.trimmed_ranges`). Any thread."""
        with self._lock:
            self._check_open()
            return int(self._cfs[cf].property_int_value("rocksdb.num-entries-active-mem-table") or 0)

    def compact_range(self, cf: str, lo: bytes, hi: bytes) -> None:
        """Compact keys ``lo`` to ``hi`` (both included, as RocksDB's CompactRange) of column family ``cf`` so
        the files of a deleted range go (disk space back). RocksDB first flushes a memtable holding any key or
        range tombstone in the range (:mod:`pstate.trimmed_ranges` avoids asking for those).

        Not under the store's lock: applies go on while RocksDB compacts (it orders its own work); closing
        and abandoning the store wait for it.
        """
        with self._compacting:
            self._check_open()
            opts = rocksdict.CompactOptions()
            opts.set_exclusive_manual_compaction(False)
            with rocks_errors("compact", self.path):
                self._cfs[cf].compact_range(lo, hi, opts)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(self.path)

    def close(self) -> None:
        """Flush (atomically, all CFs) and release RocksDB so the directory can be reopened or swapped.

        rocksdict's close flushes column families one at a time; a process killed
        between two of those flushes would persist ``_meta.applied`` without some
        CF's data (the crash test caught it). So every memtable is flushed
        atomically first, and close finds nothing left to flush.
        """
        with self._lock, self._compacting:
            if self._closed:
                return
            self._flush_releasing_gil()
            self._flush_holding_gil()
            self._closed = True
            with rocks_errors("close", self.path):
                self.families.close()
                self._db.close()
                del self._db

    def discard(self) -> None:
        """Release RocksDB without the atomic flush :meth:`close` makes: the store of a directory about to be
        deleted (a far-horizon install's retired store). That flush holds the GIL, which stalls every thread
        of the process; rocksdict's own flushes at close do not, and what they leave nobody reads."""
        with self._lock, self._compacting:
            if self._closed:
                return
            self._closed = True
            with rocks_errors("close", self.path):
                self.families.close()
                self._db.close()
                del self._db

    def abandon(self) -> None:
        """Release RocksDB without persisting anything more: the store of a replica that failed.

        Nothing is lost: what the memtables hold is above the durable applied
        offset, and the replog replays it on reopen. But nothing may be half
        kept either: releasing the last handle flushes column families one at a
        time, and on a nearly full disk the small ``_meta`` flush succeeded
        where a depot's failed, persisting an applied offset without its data
        (the full-disk test caught it). So the directory is moved aside while
        the handles go: every flush then fails whole, and the files come back
        as they were. Callers drop their own handles (an exception's frames
        hold some) before calling this.
        """
        with self._lock, self._compacting:
            if self._closed:
                return
            self._closed = True
            self._pending = Overlay()
            aside = f"{self.path}.abandoning-{uuid.uuid4().hex[:8]}"
            os.rename(self.path, aside)
            try:
                self._drop_handles()  # while the directory is away
            finally:
                os.rename(aside, self.path)

    def __enter__(self) -> TaskGroupStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verify(self) -> None:
        """Read every block of every column family with checksums on; :class:`CorruptStore` at the first damage.

        A replica calls it when it opens, so damage done while it was down (a
        flipped byte in an SST file) is found before it serves or is elected,
        not by whichever scan happens to touch the block first.
        """
        with self._lock:
            self._check_open()
            try:
                verify_column_families(self._cfs.values())
                return
            except Exception as exc:
                err = translate(exc, "verify", self.path)
        # Raised outside the handler, unchained: the failed iterators' frames (which hold column family
        # handles) must not outlive this call, or close() cannot release the database's lock.
        raise err

    def flush(self) -> None:
        """Persist memtables of ALL column families in one atomic flush (see the module docstring)."""
        with self._lock:
            self._check_open()
            self._flush_releasing_gil()
            self._flush_holding_gil()

    def _flush_releasing_gil(self) -> None:
        """Flush every column family's memtable atomically while other threads run (caller holds the lock).

        The checkpoint path that :meth:`flush` and :meth:`checkpoint` rely on holds the GIL through its flush,
        which stalls every thread of the process (a leader's checkpoint for a far-horizon copy took 141-176 ms
        of writer latency). A manual compaction of a range that overlaps ``_meta``'s memtable flushes first,
        and under ``atomic_flush`` that flush takes every column family in one MANIFEST commit, which is the
        durability model's only requirement; rocksdict releases the GIL through a compaction. The range is
        ``_meta``'s applied key, which every apply writes, so the compaction itself is one key's.

        Under the store's lock, so no apply lands between this flush and the caller's own: that one then has
        nothing to flush and adds no level-0 file (with applies going on, it added one more per checkpoint,
        which reached RocksDB's compaction trigger between a far-horizon copy's rounds, and the next round
        copied every file again). Applies to this store wait as they did; the rest of the process runs.
        Any memtable with something applied goes this way, however small: a flush holding the GIL costs about
        8 ms per MB, and a small one its fsyncs (issue 27: a 50 KB memtable held the GIL 7-16 ms through a
        checkpoint's flush on the 2-core box, 75 ms while another store flushed; through the compaction 2-3 ms,
        the store's own applies waiting instead). An empty one is left to the caller's flush, which then holds
        the GIL only to link the files (3-4 ms).
        """
        if not self._unflushed:
            return
        self._compaction_flush()
        self._unflushed = 0

    def _compaction_flush(self) -> None:
        """The flush of :meth:`_flush_releasing_gil`: a manual compaction of ``_meta``'s applied key."""
        opts = rocksdict.CompactOptions()
        opts.set_exclusive_manual_compaction(False)
        with rocks_errors("flush", self.path):
            self._cfs[META].compact_range(_APPLIED, _APPLIED + b"\x00", opts)

    def _flush_ahead(self) -> None:
        """Flush a large memtable (:data:`AHEAD_FLUSH_BYTES`) WITHOUT the store's lock, so applies go on meanwhile
        and the flush the caller then makes under the lock (to pair its files with the applied offset) holds
        only what they applied during this one.

        It costs one more level-0 file per family written meanwhile (:data:`L0_COMPACTION_TRIGGER`), so only a
        large memtable goes ahead: a far-horizon copy's first checkpoint, not its later rounds. Under
        ``_compacting``, as any compaction outside the lock (closing waits for it).
        """
        if self._unflushed < AHEAD_FLUSH_BYTES:
            return
        with self._compacting:
            self._check_open()
            ahead = self._unflushed
            self._compaction_flush()
        with self._lock:  # (what was applied during the flush may or may not be in it: still counted)
            self._unflushed = max(0, self._unflushed - ahead)

    def _flush_holding_gil(self) -> None:
        """The flush through RocksDB's checkpoint (its ``GetLiveFiles`` flushes all families atomically); the
        caller holds the store's lock, so no apply lands between this flush and what the caller does next."""
        self._check_open()
        tmp = f"{self.path}.flush-{uuid.uuid4().hex}"
        try:
            with rocks_errors("flush", self.path):
                rocksdict.Checkpoint(self._db).create_checkpoint(tmp)
            self._unflushed = 0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def scanned_whole(self, name: str, keys: int) -> bool:
        """A scan read all of PState ``name`` and found ``keys`` live keys: True when the old versions scans step
        over have cost a flush (:mod:`pstate.hidden_versions`; the caller then calls :meth:`flush_for_scans`,
        off the event loop). PStates whose values hold subindexed children never count: their column family
        holds more than the keys a scan reads."""
        schema = self.schemas.get(name)
        cf = pstate_cf(name)
        db = getattr(self, "_cfs", {}).get(cf)  # (closed under the scan: its handles are gone)
        if not isinstance(schema, Map) or schema.value.storage or self._closed or db is None:
            return False
        try:  # (the scan has its result: counting it never fails it)
            with rocks_errors("property", self.path):
                entries = db.property_int_value("rocksdb.num-entries-active-mem-table") or 0
        except PStateError:
            return False
        return self.hidden_versions.scanned(cf, entries, keys)

    def flush_for_scans(self) -> None:
        """The flush :meth:`scanned_whole` asked for: every column family at once, as :meth:`flush` always does."""
        try:
            self.flush()
        finally:
            self.hidden_versions.flushed()

    # -- apply ---------------------------------------------------------------
    @property
    def applied_offset(self) -> int:
        """Highest replog offset applied (-1 before the first)."""
        return self._applied

    def apply(self, offset: int, payload: bytes | ChangeSet) -> bool:
        """Apply replog entry ``offset`` atomically; False if it was a no-op.

        One WriteBatch holds the entry's writes and ``_meta.applied = offset``
        (and the microbatch commit marker), so a crash leaves either all of it
        or none.  Offsets at or below the applied offset are ignored (replay is
        idempotent); a ChangeSet tagged ``(topology, batch_id)`` whose batch is
        already committed only advances the offset.
        """
        check_offset(offset, "offset")
        with self._lock:
            self._check_open()
            if offset <= self._applied:
                return False
            cs = decode_any(payload)
            wb = rocksdict.WriteBatch(raw_mode=True)
            meta = self._handles[META]
            skip = False
            if cs.topology is not None:
                if type(cs.batch_id) is not int:
                    raise CorruptStore("replog payload", f"batch id {cs.batch_id!r} is not an int")
                skip = self.batch_committed(cs.topology, cs.batch_id)
            if not skip:
                handles = []
                for name in cs.cfs:
                    h = self._handles.get(name)
                    if h is None:
                        raise CorruptStore("replog payload", f"unknown column family {name!r}; "
                                           "the module definition differs from the leader's")
                    handles.append(h)
                put = wb.put
                for op, ci, items in cs.runs:
                    h = handles[ci]
                    if op == OP_PUT:
                        # Per record, only rocksdict's put: the run's family is the batch's default (a family
                        # argument is checked on every call), and map pairs each key with the value after it
                        # (it pulls from `it` twice per call), with no bytecode per pair (session 13: 0.14
                        # against 0.18 µs a put).
                        wb.set_default_column_family(h)
                        it = iter(items)
                        deque(map(put, it, it), maxlen=0)
                    elif op == OP_DELETE:
                        for k in items:
                            wb.delete(k, h)
                    elif op == OP_DELETE_RANGE:
                        for j in range(0, len(items), 2):
                            wb.delete_range(items[j], items[j + 1], h)
                if cs.topology is not None:
                    put(_BATCH + cs.topology.encode(), pack(cs.batch_id), meta)
            wb.put(_APPLIED, offset.to_bytes(8, "big"), meta)
            size = wb.size_in_bytes()
            with rocks_errors("write", self.path):
                self._db.write(wb, self._wo)
            self._unflushed += size
            self._applied = offset
            if offset >= self._staged_upto:
                self._pending = Overlay()
            return not skip

    def read_applied(self, fn: Callable[[TaskGroupStore], Any]) -> tuple[Any, int]:
        """``fn(self)`` and the applied offset it saw, with no apply in between (a subscription's first value)."""
        with self._lock:
            self._check_open()
            return fn(self), self._applied

    def stage(self, offset: int, builder: ChangeSetBuilder, payload: bytes | None = None) -> bytes:
        """Leader: record an entry appended to the replog but not yet applied; return its payload.

        Later builders read through staged writes, so two in-flight entries that
        ``update`` the same key compose instead of losing an update.  Applying
        up to the highest staged offset clears the overlay. ``payload`` is the
        builder's encoding when the caller made it already (to check its size).
        """
        if payload is None:
            payload = builder.encode()
        with self._lock:
            self._pending.merge(builder.writes.overlay)
            self._staged_upto = max(self._staged_upto, offset)
            return payload

    def drop_staged(self) -> None:
        """Forget staged entries (leadership lost, or the replog was truncated)."""
        with self._lock:
            self._pending = Overlay()
            self._staged_upto = -1

    def leader_reader(self) -> Reader:
        return self._reader if self._pending.is_empty() else LayeredReader(self._pending, self._reader)

    def applied_reader(self) -> DbReader:  # what may leave the group: outbox envelopes, depot records
        return self._reader

    # -- leader side -----------------------------------------------------------
    def changes(self, topology: str | None = None, batch_id: int | None = None) -> ChangeSetBuilder:
        """Start a ChangeSet (one replog entry); tag it ``(topology, batch_id)`` for exactly-once microbatches."""
        self._check_open()
        return ChangeSetBuilder(self, topology, batch_id)

    # -- queries -------------------------------------------------------------
    def pstate(self, name: str) -> PStateView:
        """Read-only view of a PState's applied state."""
        self._check_open()
        return PStateView(self, name, self._reader)

    def select(self, name: str, path: Path = P) -> list[Any]:
        return self.pstate(name).select(path)

    def select_one(self, name: str, path: Path | Any = P) -> Any:
        return self.pstate(name).select_one(path)

    def depot(self, name: str) -> DepotView:
        self._check_open()
        if name not in self.depots:
            raise DepotNotFound(name, self.depots)
        return DepotView(self, name, self._reader)

    def last_batch(self, topology: str) -> int | None:
        """Last microbatch id committed by ``topology`` here (None if none)."""
        raw = self._reader.get(META, _BATCH + topology.encode())
        return None if raw is None else int(unpack(raw))

    def batch_committed(self, topology: str, batch_id: int) -> bool:
        """The exactly-once rule: a batch at or below ``topology``'s last is a replay (ids commit in order)."""
        last = self.last_batch(topology)
        return last is not None and batch_id <= last

    def engine(self, name: str, reader: Reader, writes: Writes | None) -> Engine:
        s = self.schemas.get(name)
        if s is None:
            raise PStateNotFound(name, tuple(self.schemas))
        migration = self.migrations.get(name)
        if migration is not None:
            reader = MigratingReader(reader, pstate_cf(name), name, migration)
        return Engine(pstate_cf(name), name, s, reader, writes)

    # -- checkpoints ---------------------------------------------------------
    def checkpoint(self, directory: str | os.PathLike[str], leader_epoch: int) -> Any:
        """Immutable file set of the current applied state for far-horizon catchup; see :mod:`pstate.checkpoint`.

        Made under the store's lock (it pairs the files with the applied
        offset), which holds back applies; the manifest (a CRC32C pass over
        every file, then two fsyncs) is written after the lock is released:
        the files are immutable, and a leader's writers need not wait for it.
        (RocksDB's checkpoint itself flushes the memtables holding the GIL, which
        stalls the whole process: :meth:`_flush_releasing_gil` empties them first.)
        """
        from pstate.checkpoint import take_checkpoint

        self._flush_ahead()
        with self._lock:
            self._check_open()
            self._flush_releasing_gil()  # so the checkpoint's own flush, which holds the GIL, has nothing left
            with rocks_errors("checkpoint", self.path):
                rocksdict.Checkpoint(self._db).create_checkpoint(os.fspath(directory))
            self._unflushed = 0
            applied = self._applied
        return take_checkpoint(os.fspath(directory), applied, leader_epoch)


__all__ = ["META", "OUTBOX", "ChangeSetBuilder", "DepotView", "PStateError", "PStateView", "PartitionInfo",
           "TaskGroupStore"]
