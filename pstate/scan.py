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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pstate.engine import Engine, decode_value, unpack_many
from pstate.errors import InvalidPath
from pstate.keys import decode_key_at, encode_key
from pstate.path import Nav, select_value
from pstate.schema import Map

_ELEM = b"\x02"
_SUB = b"\x03"

#: the most results one page holds, whatever the caller asks
MAX_PAGE = 10_000
#: the most entries one page scans (a filter that keeps nothing still returns, with its resume point)
MAX_SCANNED = 50_000


@dataclass(frozen=True)
class ScanPage:
    """One page: its results and where the next one starts (None: the range is done)."""

    items: list[Any]
    after: bytes | None
    scanned: int


def scan_page(engine: Engine, start: Any, end: Any, after: bytes | None, limit: int, max_bytes: int,
              keep: Callable[[Any], bool] | None = None, navs: tuple[Nav, ...] = ()) -> ScanPage:
    """The page of ``engine``'s PState described in the module docstring."""
    schema = engine.root.schema
    if not isinstance(schema, Map):
        raise InvalidPath(engine.name, f"scan() needs a map PState, not {schema.describe()}")
    assert limit > 0 and max_bytes > 0, (limit, max_bytes)
    limit = min(limit, MAX_PAGE)
    vs = schema.value
    lo = _ELEM if start is None else _bound(schema, start, f"{engine.name} scan start")
    hi = _SUB if end is None else _bound(schema, end, f"{engine.name} scan end")
    if after is not None:
        if not after.startswith(_ELEM):
            raise InvalidPath(engine.name, "scan resume token does not belong to this PState")
        lo = max(lo, after + b"\x00")  # the smallest key above `after`
    out: list[Any] = []
    if lo >= hi:
        return ScanPage(out, None, 0)
    if not navs and not vs.storage and vs.plain:
        return _plain_page(engine, lo, hi, limit, max_bytes, keep)
    scanned = nbytes = 0
    for k, raw in engine.reader.scan(engine.cf, lo, hi):
        scanned += 1
        key = _key(k)
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


def _bound(schema: Map, key: Any, where: str) -> bytes:
    schema.key.validate(key, where)
    return _ELEM + encode_key(key)


def _key(k: bytes) -> Any:
    """The top-level key of RocksDB key ``k`` (a str without NULs decoded inline: the common case)."""
    if k[1] == 0x05 and k.find(b"\x00", 2) == len(k) - 2:
        return k[2:-2].decode("utf-8", "surrogatepass")
    return decode_key_at(k, 1)[0]


def _plain_page(engine: Engine, lo: bytes, hi: bytes, limit: int, max_bytes: int,
                keep: Callable[[Any], bool] | None) -> ScanPage:
    """:func:`scan_page` of plain values without navigators: values decoded in one C loop at the end."""
    keys: list[Any] = []
    raws: list[bytes] = []
    scanned = nbytes = 0
    last = None
    for k, raw in engine.reader.scan(engine.cf, lo, hi):
        scanned += 1
        key = _key(k)
        if keep is None or keep(key):
            keys.append(key)
            raws.append(raw)
            nbytes += len(raw)
        if len(keys) >= limit or scanned >= MAX_SCANNED or nbytes >= max_bytes:
            last = k
            break
    return ScanPage(list(zip(keys, unpack_many(raws), strict=True)), last, scanned)
