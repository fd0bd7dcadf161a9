"""The leader's side of an entry: :class:`ChangeSetBuilder` turns transforms, depot appends and trims into
one ChangeSet (one replog entry), reading the store's applied state under its own staged writes.

Split from :mod:`pstate.store`, which applies what it builds: building runs on leaders only, applying on every
replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pstate.changes import ChangeSet, Writes
from pstate.depot_batches import append_writes
from pstate.depots import (
    META,
    PartitionInfo,
    batched_key,
    check_offset,
    check_partition,
    depot_cf,
    depot_meta_key,
    encode_partition_meta,
    read_partition_meta,
    time_run,
    times_below,
)
from pstate.engine import (
    Engine,
    LayeredReader,
    Reader,
    _packb,
    encode_value,
    pack,
    top_key,
    unpack,
)
from pstate.errors import (
    DepotNotFound,
    PStateNotFound,
    SchemaMismatch,
)
from pstate.families import pstate_cf
from pstate.keys import encode_key
from pstate.path import P, Path, Transform, as_transform
from pstate.schema import Map, Scalar

if TYPE_CHECKING:
    from pstate.store import TaskGroupStore


class ChangeSetBuilder:
    """Leader side: turn transforms, depot appends and trims into one ChangeSet (one replog entry).

    Reads see the applied state, staged in-flight entries and this builder's
    own earlier writes.  Each call is atomic: if it raises (``SchemaMismatch``,
    ``InvalidPath``, an exception from an ``update`` function) none of its
    writes are kept.
    """

    def __init__(self, store: TaskGroupStore, topology: str | None, batch_id: int | None) -> None:
        if (topology is None) != (batch_id is None):
            raise SchemaMismatch("changes()", "topology and batch_id together", f"{topology!r}, {batch_id!r}")
        if batch_id is not None and type(batch_id) is not int:
            raise SchemaMismatch("batch_id", "int", repr(batch_id))
        self._store = store
        self.topology = topology
        self.batch_id = batch_id
        self.writes = Writes()
        self._reader = LayeredReader(self.writes, store.leader_reader())
        self._engines: dict[str, Engine] = {}
        self._fast: dict[str, tuple[str, type | None, type | None]] = {}
        #: the leader's clock when the entry was started: the time of its depot records unless an append gives one
        self.time_ms = int(time.time() * 1000)

    @property
    def reader(self) -> Reader:  # applied state + staged entries + this builder's writes
        return self._reader

    def _fast_info(self, pstate: str) -> tuple[str, type | None, type | None]:
        s = self._store.schemas.get(pstate)
        if s is None:
            raise PStateNotFound(pstate, tuple(self._store.schemas))
        if isinstance(s, Map) and isinstance(s.key, Scalar) and isinstance(s.value, Scalar) \
                and pstate not in self._store.migrations:  # (a migrating PState's reads go through its engine)
            return pstate_cf(pstate), s.key.pytype, s.value.pytype
        return pstate_cf(pstate), None, None

    def transform(self, pstate: str, t: Transform | Path) -> None:
        """Resolve a path transform against current state into key writes."""
        t = as_transform(t)
        eng = self._engines.get(pstate)
        if eng is None:
            eng = self._engines[pstate] = self._store.engine(pstate, self._reader, self.writes)
        # Written in place, undone if it raises: no transaction object per call. Reads may see this call's own
        # earlier writes, which the engine never reads back (a node is read before it is written, and a parent's
        # count lives apart from its children's keys), so the writes are those of a separate transaction.
        mark = self.writes.savepoint()
        try:
            eng.transform(t.path.navs, t.term, t.arg)
        except BaseException:
            self.writes.rollback(mark)
            raise

    def set(self, pstate: str, key: Any, value: Any) -> None:
        """Shorthand for ``transform(pstate, P.key(key).set(value))`` with no read (the batch hot path)."""
        fast = self._fast.get(pstate)
        if fast is None:
            fast = self._fast[pstate] = self._fast_info(pstate)
        cf, kt, vt = fast
        if type(key) is kt and type(value) is vt and (vt is not float or value == value):
            # scalar key and value of exactly the schema's types: nothing left to validate
            self.writes.put(cf, top_key(kt, key), _packb(value))
            return
        eng = self._engines.get(pstate)
        if eng is None:
            eng = self._engines[pstate] = self._store.engine(pstate, self._reader, self.writes)
        s = eng.root.schema
        if isinstance(s, Map) and not s.value.storage and value is not None:
            s.key.validate(key, f"{pstate}[{key!r}] (key)")
            s.value.validate(value, f"{pstate}[{key!r}]")
            self.writes.put(eng.cf, b"\x02" + encode_key(key), encode_value(s.value, value))
        else:
            self.transform(pstate, P.key(key).set(value))

    def update(self, pstate: str, key: Any, fn: Callable[[Any], Any]) -> None:
        """``transform(pstate, P.key(key).update(fn))``: one read and one write for a map of scalars (counters)."""
        cf, kt, vt = self._fast.get(pstate) or self._fast.setdefault(pstate, self._fast_info(pstate))
        if type(key) is not kt:
            return self.transform(pstate, P.key(key).update(fn))
        ek = top_key(kt, key)
        raw = self._reader.get(cf, ek)
        old = None if raw is None else unpack(raw)
        new = fn(old)
        if type(new) is vt and (vt is not float or new == new):
            self.writes.put(cf, ek, _packb(new))
        elif new is not old:
            self.transform(pstate, P.key(key).set(new))  # validates (or removes) as update would

    def set_many(self, pstate: str, items: Iterable[tuple[Any, Any]]) -> None:
        """Many top-level ``set``s; validated all first, so a mismatch writes none of them."""
        items = list(items)
        s = self._store.schemas.get(pstate)
        if s is None:
            raise PStateNotFound(pstate, tuple(self._store.schemas))
        if not isinstance(s, Map) or s.value.storage:
            for k, v in items:
                self.set(pstate, k, v)
            return
        ks, vs = s.key, s.value
        for k, v in items:
            ks.validate(k, f"{pstate}[{k!r}] (key)")
            vs.validate(v, f"{pstate}[{k!r}]")
            if v is None:
                raise SchemaMismatch(f"{pstate}[{k!r}]", vs.describe(), "None (use remove())")
        cf = pstate_cf(pstate)
        put = self.writes.put
        if vs.plain:
            for k, v in items:
                put(cf, b"\x02" + encode_key(k), _packb(v))
        else:
            for k, v in items:
                put(cf, b"\x02" + encode_key(k), encode_value(vs, v))

    def depot_append(self, depot: str, partition: int, records: Iterable[Any], time_ms: int | None = None) -> list[int]:
        """Append records to a depot partition; return their offsets (assigned here, on the leader).

        ``time_ms`` is the records' time (an event time); None: this entry's :attr:`time_ms`.
        """
        encoded = []
        for r in records:
            try:
                encoded.append(pack(r))
            except (TypeError, ValueError, OverflowError) as exc:
                raise SchemaMismatch(f"{depot}[{partition}]", "a msgpack-able record", type(r).__name__) from exc
        return self.depot_append_encoded(depot, partition, encoded, time_ms)

    def depot_append_encoded(self, depot: str, partition: int, records: Sequence[bytes],
                             time_ms: int | None = None) -> list[int]:
        """`depot_append` of records already msgpack-encoded (a client's bytes), stored as they are.

        The caller vouches that each is one valid msgpack object (the node decodes
        client records anyway, to validate them or to run topologies over them).
        """
        if depot not in self._store.depots:
            raise DepotNotFound(depot, self._store.depots)
        p = check_partition(partition)
        info, last = read_partition_meta(self._reader, depot, partition)
        start = info.end
        end = start + len(records)
        if records:  # the time run first: a bad event time fails the append before anything is written
            run, last = time_run(depot, p, start, self.time_ms if time_ms is None else time_ms, last)
            if run is not None:
                self.writes.put(META, *run)
        # one key for the whole append (a batch value) or for its one record: pstate.depot_batches
        self.writes.put_many(depot_cf(depot), *append_writes(partition, start, records))
        if len(records) > 1 and self._reader.get(META, batched_key(depot, p)) is None:
            self.writes.put(META, batched_key(depot, p), b"")  # its first batch: reads go key by key (pstate.depots)
        added = info.appended_bytes + sum(map(len, records))
        self.writes.put(META, depot_meta_key(depot, p), encode_partition_meta(PartitionInfo(info.start, end, added),
                                                                              last))
        return list(range(start, end))

    def depot_trim(self, depot: str, partition: int, before: int) -> None:
        """Delete records below ``before`` (clamped to the partition's range), and the time runs only they had."""
        if depot not in self._store.depots:
            raise DepotNotFound(depot, self._store.depots)
        p = check_partition(partition)
        check_offset(before, "before")
        info, last = read_partition_meta(self._reader, depot, partition)
        new_start = min(max(before, info.start), info.end)
        if new_start == info.start:
            return
        self.depot_trim_writes(depot, partition, info, last, new_start, times_below(self._reader, depot, p, new_start))

    def depot_trim_writes(self, depot: str, partition: int, info: PartitionInfo, last: tuple[int, int] | None,
                        new_start: int, runs: tuple[bytes, bytes] | None) -> None:
        """:meth:`depot_trim`'s writes, its reads done by the caller: the partition's meta as this builder reads
        it (:func:`read_partition_meta`), and the time runs below ``new_start`` (:func:`times_below`, which a
        retention plan reads off the task thread: runs below an applied offset change only with the start)."""
        p = check_partition(partition)
        assert info.start < new_start <= info.end, (info, new_start)
        self.writes.delete_range(depot_cf(depot), p + info.start.to_bytes(8, "big"), p + new_start.to_bytes(8, "big"))
        if runs is not None:
            self.writes.delete_range(META, *runs)
        self.writes.put(META, depot_meta_key(depot, p),
                        encode_partition_meta(PartitionInfo(new_start, info.end, info.appended_bytes), last))

    def select(self, pstate: str, path: Path = P) -> list[Any]:
        """Read through this builder's pending writes (what a transform would see)."""
        return self._store.engine(pstate, self._reader, None).select(path.navs)

    def encode(self) -> bytes:
        """The replog entry payload."""
        return ChangeSet(self.writes.cfs, self.writes.runs, self.topology, self.batch_id).encode()

    def changeset(self) -> ChangeSet:
        return ChangeSet(self.writes.cfs, self.writes.runs, self.topology, self.batch_id)

    def __len__(self) -> int:
        return len(self.writes)
