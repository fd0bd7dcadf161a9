"""Reads of a task group's applied state straight from RocksDB (:class:`DbReader`).

The store's bottom read layer: what followers and queries read, and what a
leader's staged overlay and a change set's own writes are layered over
(:class:`pstate.engine.LayeredReader`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
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
                return self._reverse(db.items(backwards=True, read_opt=ro), lo, ro)
            return self._forward(db.items(from_key=lo, read_opt=ro), ro)
        except Exception as exc:
            raise translate(exc, "scan", self._path) from exc

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
                chunk = list(itertools.islice(it, min(_VALUES_CHUNK, limit - len(out))))
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
        except Exception as exc:
            raise translate(exc, "scan", self._path) from exc
        del ro  # rocksdict's iterator does not keep its ReadOptions (and upper bound) alive: we do, until here
        return out

    @staticmethod
    def _forward(items: Iterator[tuple[bytes, bytes]], ro: rocksdict.ReadOptions) -> Iterator[tuple[bytes, bytes]]:
        yield from items
        del ro

    @staticmethod
    def _reverse(items: Iterator[tuple[bytes, bytes]], lo: bytes,
                 ro: rocksdict.ReadOptions) -> Iterator[tuple[bytes, bytes]]:
        for k, v in items:
            if k < lo:
                return
            yield k, v
