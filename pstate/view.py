"""A read view of one PState of a task group's store: ``select``, ``select_one`` (with the hot paths for a
top-level key) and bounded scan pages; what ``TaskGroupStore.pstate`` and a leader's reads hand out."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pstate.codec import unpack
from pstate.engine import Reader, decode_value
from pstate.errors import InvalidPath, translate
from pstate.families import pstate_cf
from pstate.keys import encode_key
from pstate.path import KEY, Nav, P, Path
from pstate.scan import PackedScanPage, ScanPage, packed_scan_page, scan_page
from pstate.schema import Map, Scalar

if TYPE_CHECKING:
    from pstate.store import TaskGroupStore


class PStateView:
    """Queries on one PState: ``select(path) -> list``, ``select_one(path)``."""

    def __init__(self, store: TaskGroupStore, name: str, reader: Reader) -> None:
        self._engine = store.engine(name, reader, None)
        self._store = store
        s = self._engine.root.schema
        self._fast = isinstance(s, Map) and not s.value.storage
        self._key = s.key if isinstance(s, Map) else None
        #: str keys take the hottest path (no validation needed: the type is checked on the spot)
        self._str_keys = self._fast and isinstance(self._key, Scalar) and self._key.pytype is str
        self._vs = s.value if isinstance(s, Map) else None
        # point reads of applied state go straight to the column family (no reader layers)
        self._cfget = store._cfs[pstate_cf(name)].get \
            if reader is store._reader and name not in store.migrations else None
        self._plain = self._vs is not None and self._vs.plain

    def select(self, path: Path = P) -> list[Any]:
        """Every value the path reaches, in order."""
        if not isinstance(path, Path):
            raise InvalidPath(self._engine.name, f"select() takes a path (P...), got {type(path).__name__}")
        return self._engine.select(path.navs)

    def select_one(self, path: Path | Any = P) -> Any:
        """The single value the path reaches (None if none); a bare key means ``P.key(key)``."""
        if type(path) is str and self._str_keys and self._cfget is not None and self._plain:
            try:  # the hottest path: a str key of a top-level map of plain values
                raw = self._cfget(b"\x02\x05" + path.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff")
                                  + b"\x00\x01")
            except Exception as exc:
                raise translate(exc, "get", self._store.path) from exc
            return None if raw is None else unpack(raw)
        if not isinstance(path, Path):
            if self._fast and self._vs is not None and self._key is not None:  # hot path: a top-level key
                self._key.validate(path, f"{self._engine.name} key")
                ek = encode_key(path)
                raw = self._engine.get(b"\x02" + ek)
                return None if raw is None else decode_value(self._vs, raw)
            path = P.key(path)
        navs = path.navs
        if self._fast and len(navs) == 1 and navs[0][0] == KEY:
            return self.select_one(navs[0][1])
        out = self.select(path)
        if len(out) > 1:
            raise InvalidPath(self._engine.name, f"select_one() reached {len(out)} values; use select()")
        return out[0] if out else None

    def scan_page(self, start: Any, end: Any, after: bytes | None, limit: int, max_bytes: int,
                  keep: Callable[[Any], bool] | None = None, navs: tuple[Nav, ...] = ()) -> ScanPage:
        """One bounded page of a map PState's entries in ``[start, end)`` after ``after`` (see pstate/scan.py)."""
        return scan_page(self._engine, start, end, after, limit, max_bytes, keep, navs)

    def packed_scan_page(self, start: Any, end: Any, after: bytes | None, limit: int, max_bytes: int,
                         keep: Callable[[Any], bool] | None = None) -> PackedScanPage | None:
        """:meth:`scan_page` without navigators, packed for the wire (None: values not plain; see pstate/scan.py)."""
        return packed_scan_page(self._engine, start, end, after, limit, max_bytes, keep)
