"""Reads of a task group's applied state straight from RocksDB (:class:`DbReader`).

The store's bottom read layer: what followers and queries read, and what a
leader's staged overlay and a change set's own writes are layered over
(:class:`pstate.engine.LayeredReader`).

Every read is verified. rocksdict's ``items``/``values`` iterators end quietly
when RocksDB finds a damaged block (they look at ``Valid()`` and never at
``status()``), so a scan over a flipped byte returned a prefix as if it were
all. A scan that runs to its end therefore positions one more raw iterator just
past the last key it returned and checks that iterator's status: the same
damaged block fails the same checksum, so the scan raises :class:`CorruptStore`
instead of returning partial data. :func:`verify_column_families` reads every
block of a store this way (at open: damage is found before the replica serves).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import rocksdict

from pstate.errors import translate

#: values fetched per C call by :meth:`DbReader.values`
_VALUES_CHUNK = 4096

class DbReader:
    """Reads committed (applied) state straight from RocksDB."""

    def __init__(self, cfs: dict[str, rocksdict.Rdict], path: str) -> None:
        self._cfs = cfs
        self._path = path

    def get(self, cf: str, key: bytes) -> bytes | None:
        try:
            r: bytes | None = self._cfs[cf].get(key)
        except Exception as exc:
            raise translate(exc, "get", self._path) from exc
        return r

    def scan(self, cf: str, lo: bytes, hi: bytes | None, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        # The generators below keep ``ro`` alive while rocksdict's iterator runs: rocksdict does
        # not, and an iterator outliving its ReadOptions reads past a freed upper bound (found by
        # the crash test as scans returning keys beyond their range).
        ro = rocksdict.ReadOptions()
        if hi is not None:
            ro.set_iterate_upper_bound(hi)
        db: Any = self._cfs[cf]  # raw mode: keys and values are bytes (the stubs cannot say so)
        try:
            if reverse:
                return self._reverse(db, db.items(backwards=True, read_opt=ro), lo, ro, self._path)
            return self._forward(db, db.items(from_key=lo, read_opt=ro), lo, ro, self._path)
        except Exception as exc:
            raise translate(exc, "scan", self._path) from exc

    def scan_chunks(self, cf: str, lo: bytes, hi: bytes | None,
                    want: Callable[[], int]) -> Iterator[list[tuple[bytes, bytes]]]:
        """:meth:`scan` forward, ``want()`` items per list, each read in one C call (no Python step per item);
        a list shorter than asked for is the last, verified like :meth:`scan`'s end before it is returned."""
        ro = rocksdict.ReadOptions()
        if hi is not None:
            ro.set_iterate_upper_bound(hi)
        db: Any = self._cfs[cf]
        last = None
        try:
            items = db.items(from_key=lo, read_opt=ro)
            while True:
                n = want()
                assert n > 0, n
                chunk: list[tuple[bytes, bytes]] = list(itertools.islice(items, n))
                if chunk:
                    last = chunk[-1][0]
                if len(chunk) < n:
                    _verify_after(db, ro, last, lo, False)
                    if chunk:
                        yield chunk
                    return
                yield chunk
        except Exception as exc:
            raise translate(exc, "scan", self._path) from exc
        finally:
            del ro  # (kept alive while rocksdict's iterator runs: see scan)

    def values(self, cf: str, lo: bytes, hi: bytes, limit: int, max_bytes: int) -> list[bytes]:
        """Values of keys in ``[lo, hi)``, at most ``limit``, stopping once ``max_bytes`` are read.

        The keys are not built as Python objects and the loop runs in C, a
        chunk at a time: a depot read serving Spark spends a third of its node
        time on keys it only needs to count.
        """
        ro = rocksdict.ReadOptions()
        ro.set_iterate_upper_bound(hi)
        db: Any = self._cfs[cf]
        out: list[bytes] = []
        total = 0
        try:
            it = db.values(from_key=lo, read_opt=ro)
            while len(out) < limit and total < max_bytes:
                want = min(_VALUES_CHUNK, limit - len(out))
                chunk = list(itertools.islice(it, want))
                ended = len(chunk) < want
                if ended:  # the iterator ended: at the range's end, or at a damaged block?
                    # Values carry no keys, so the check walks the range's keys again; only a read that
                    # reaches its range's end pays it (a depot read asks for the records it knows exist).
                    _verify_keys(db, ro, lo)
                if not chunk:
                    break
                size = sum(map(len, chunk))
                if total + size >= max_bytes:  # keep up to the record that reaches max_bytes, as scan() readers do
                    cut = next(i for i, c in enumerate(itertools.accumulate(map(len, chunk), initial=total))
                               if c >= max_bytes)
                    chunk = chunk[:max(1, cut)]
                    size = sum(map(len, chunk))
                out.extend(chunk)
                total += size
                if ended:
                    break
        except Exception as exc:
            raise translate(exc, "scan", self._path) from exc
        del ro  # rocksdict's iterator does not keep its ReadOptions (and upper bound) alive: we do, until here
        return out

    @staticmethod
    def _forward(db: Any, items: Iterator[tuple[bytes, bytes]], lo: bytes, ro: rocksdict.ReadOptions,
                 path: str) -> Iterator[tuple[bytes, bytes]]:
        item = None
        for item in items:  # (passed on as is: this loop runs once per entry of every scan)
            yield item
        last = None if item is None else item[0]
        try:
            _verify_after(db, ro, last, lo, False)
        except Exception as exc:
            raise translate(exc, "scan", path) from exc
        del ro

    @staticmethod
    def _reverse(db: Any, items: Iterator[tuple[bytes, bytes]], lo: bytes,
                 ro: rocksdict.ReadOptions, path: str) -> Iterator[tuple[bytes, bytes]]:
        last = None
        for k, v in items:
            if k < lo:
                return  # stopped by the range, not by the iterator: every block read was verified
            last = k
            yield k, v
        try:
            _verify_after(db, ro, last, lo, True)
        except Exception as exc:
            raise translate(exc, "scan", path) from exc


def scan_chunks(reader: Any, cf: str, lo: bytes, hi: bytes | None,
                want: Callable[[], int]) -> Iterator[list[tuple[bytes, bytes]]]:
    """:meth:`DbReader.scan_chunks` of any reader (a layered one: its merged scan, a chunk at a time)."""
    if isinstance(reader, DbReader):
        return reader.scan_chunks(cf, lo, hi, want)
    it = reader.scan(cf, lo, hi)
    return iter(lambda: list(itertools.islice(it, want())), [])


def _verify_after(db: Any, ro: rocksdict.ReadOptions, last: bytes | None, lo: bytes, reverse: bool) -> None:
    """Raise RocksDB's error if an iterator that ended after ``last`` ended on damage, not at the range's end.

    A fresh raw iterator is put where the ended one stopped and moved one step;
    ``status()`` raises (``Corruption: block checksum mismatch ...``) when that
    step reads the damaged block, and is silent at a true end.
    """
    it = db.iter(ro)
    if reverse:
        if last is None:
            it.seek_to_last()
        else:
            it.seek_for_prev(last)
            if it.valid():
                it.prev()
    else:
        it.seek(lo if last is None else last)
        if last is not None and it.valid():
            it.next()
    it.status()


def _verify_keys(db: Any, ro: rocksdict.ReadOptions, lo: bytes) -> None:
    """Walk the keys of ``[lo, upper bound)`` in C and verify where the walk ended (see :func:`_verify_after`)."""
    tail = collections.deque(db.keys(from_key=lo, read_opt=ro), maxlen=1)
    _verify_after(db, ro, tail[0] if tail else None, lo, False)


def verify_column_families(cfs: Iterable[Any]) -> None:
    """Read every block of every column family with checksums on; raise RocksDB's error at the first damage.

    The keys stream through C (a one-slot deque keeps the last), about 1.5 M
    keys a second; bypassing the block cache keeps the store's hot blocks hot.
    """
    for cf in cfs:
        ro = rocksdict.ReadOptions()
        ro.fill_cache(False)  # type: ignore[call-arg]  # the stub drops the argument
        ro.set_verify_checksums(True)
        _verify_keys(cf, ro, b"")
