"""Paged scans of a top-level Map PState: bounded pages and a resume point, never one unbounded read.

A page is the entries of ``[start, end)`` strictly after ``after`` (the RocksDB key of the last entry the
previous page scanned; None: from ``start``), at most ``limit`` results and about ``max_bytes`` of stored
values, read from a lazy iterator (only the page is ever held). ``keep`` filters keys before their values
are decoded (a task group's store holds the keys of all its tasks: the worker keeps one task's), and
``navs`` navigate each ``(key, value)`` pair like the navigators after ``all()`` in a select (``filter``
and ``view`` included). The resume point is a scanned key, not a result, so a page that filters everything
out still moves forward; a page with a resume point may be short, even empty.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pstate.engine import Engine, decode_value, unpack_many
from pstate.errors import InvalidPath
from pstate.keys import encode_key
from pstate.packed_page import PackedPage, pack_page, top_key, top_keys
from pstate.path import Nav, select_value
from pstate.reader import scan_chunks
from pstate.schema import Map, Scalar, Schema

_ELEM = b"\x02"
_SUB = b"\x03"

#: the most results one page holds, whatever the caller asks
MAX_PAGE = 10_000
#: the most entries one page scans (a filter that keeps nothing still returns, with its resume point)
MAX_SCANNED = 50_000
#: entries read from RocksDB per C call, growing from the first to the last (a page's bytes bound may stop it
#: early: small first reads keep what is read past it small when values are big)
_CHUNKS = (64, 256, 1024, 4096)
_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


@dataclass(frozen=True)
class ScanPage:
    """One page: its results and where the next one starts (None: the range is done)."""

    items: list[Any]
    after: bytes | None
    scanned: int


@dataclass(frozen=True)
class PackedScanPage:
    """One page of plain pairs in packed form (:mod:`pstate.packed_page`) and where the next one starts."""

    pairs: PackedPage
    after: bytes | None
    scanned: int


def scan_page(engine: Engine, start: Any, end: Any, after: bytes | None, limit: int, max_bytes: int,
              keep: Callable[[Any], bool] | None = None, navs: tuple[Nav, ...] = ()) -> ScanPage:
    """The page of ``engine``'s PState described in the module docstring."""
    vs, lo, hi = _range(engine, start, end, after, limit, max_bytes)
    limit = min(limit, MAX_PAGE)
    out: list[Any] = []
    if lo >= hi:
        return ScanPage(out, None, 0)
    if not navs and not vs.storage and vs.plain:
        keys, raws, last, scanned = _plain_raw(engine, lo, hi, limit, max_bytes, keep)
        return ScanPage(list(zip(top_keys(keys, _str_typed(engine)), unpack_many(raws), strict=True)), last, scanned)
    scanned = nbytes = 0
    for k, raw in engine.reader.scan(engine.cf, lo, hi):
        scanned += 1
        key = top_key(k)
        if keep is None or keep(key):
            nbytes += len(raw)
            v = engine.materialize(engine.sub_slot(engine.root, k, vs)) if vs.storage else decode_value(vs, raw)
            if navs:
                select_value(None, (key, v), navs, 0, out)
            else:
                out.append((key, v))
        if len(out) >= limit or scanned >= MAX_SCANNED or nbytes >= max_bytes:
            return ScanPage(out, k, scanned)
    return ScanPage(out, None, scanned)


def packed_scan_page(engine: Engine, start: Any, end: Any, after: bytes | None, limit: int, max_bytes: int,
                     keep: Callable[[Any], bool] | None = None) -> PackedScanPage | None:
    """:func:`scan_page` without navigators, its pairs packed and never decoded here (None: the PState's values
    are not plain, ask :func:`scan_page`). The same bounds and resume point as :func:`scan_page`."""
    vs, lo, hi = _range(engine, start, end, after, limit, max_bytes)
    if vs.storage or not vs.plain:
        return None
    if lo >= hi:
        return PackedScanPage(pack_page([], []), None, 0)
    keys, raws, last, scanned = _plain_raw(engine, lo, hi, min(limit, MAX_PAGE), max_bytes, keep)
    return PackedScanPage(pack_page(keys, raws, _str_typed(engine)), last, scanned)


def _range(engine: Engine, start: Any, end: Any, after: bytes | None, limit: int,
           max_bytes: int) -> tuple[Schema, bytes, bytes]:
    """The map's value schema and the RocksDB keys ``[lo, hi)`` a page reads, checked."""
    schema = engine.root.schema
    if not isinstance(schema, Map):
        raise InvalidPath(engine.name, f"scan() needs a map PState, not {schema.describe()}")
    assert limit > 0 and max_bytes > 0, (limit, max_bytes)
    lo = _ELEM if start is None else _bound(schema, start, f"{engine.name} scan start")
    hi = _SUB if end is None else _bound(schema, end, f"{engine.name} scan end")
    if after is not None:
        if not after.startswith(_ELEM):
            raise InvalidPath(engine.name, "scan resume token does not belong to this PState")
        lo = max(lo, after + b"\x00")  # the smallest key above `after`
    return schema.value, lo, hi


def _str_typed(engine: Engine) -> bool:
    """The map's keys are all str (its key schema; an update never changes one): see ``pstate.packed_page``."""
    schema = engine.root.schema
    return isinstance(schema, Map) and isinstance(schema.key, Scalar) and schema.key.pytype is str


def _bound(schema: Map, key: Any, where: str) -> bytes:
    schema.key.validate(key, where)
    return _ELEM + encode_key(key)


def _plain_raw(engine: Engine, lo: bytes, hi: bytes, limit: int, max_bytes: int,
               keep: Callable[[Any], bool] | None) -> tuple[list[bytes], list[bytes], bytes | None, int]:
    """The RocksDB keys and stored values of a page of plain values without navigators, its resume point and
    the entries it scanned. Without ``keep`` it reads a chunk of entries per C call and never decodes a key."""
    keys: list[bytes] = []
    raws: list[bytes] = []
    scanned = nbytes = 0
    it = engine.reader.scan(engine.cf, lo, hi)
    if keep is not None:
        for k, raw in it:
            scanned += 1
            if keep(top_key(k)):
                keys.append(k)
                raws.append(raw)
                nbytes += len(raw)
            if len(keys) >= limit or scanned >= MAX_SCANNED or nbytes >= max_bytes:
                return keys, raws, k, scanned
        return keys, raws, None, scanned
    chunks = 0

    def want() -> int:  # growing chunks, never past the page's bounds, fewer when values are big
        nonlocal chunks
        chunks += 1
        n = min(limit - scanned, MAX_SCANNED - scanned, _CHUNKS[min(chunks, len(_CHUNKS)) - 1])
        return max(1, min(n, (max_bytes - nbytes) * scanned // nbytes + 1)) if nbytes else n

    for chunk in scan_chunks(engine.reader, engine.cf, lo, hi, want):
        ks = list(map(_first, chunk))
        vals = list(map(_second, chunk))
        size = sum(map(len, vals))
        if nbytes + size >= max_bytes:  # the page ends at the entry that reaches max_bytes
            cut = bisect.bisect_left(list(itertools.accumulate(map(len, vals), initial=nbytes)), max_bytes, 1)
            keys.extend(ks[:cut])
            raws.extend(vals[:cut])
            return keys, raws, ks[cut - 1], scanned + cut
        keys.extend(ks)
        raws.extend(vals)
        scanned += len(chunk)
        nbytes += size
        if scanned >= limit or scanned >= MAX_SCANNED:
            return keys, raws, ks[-1], scanned
    return keys, raws, None, scanned
