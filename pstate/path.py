"""Paths: how PStates are read and changed (Rama's navigators, in plain Python).

A path is built fluently from ``P`` and is immutable, so paths can be kept in
module-level constants and reused::

    from pstate import P

    P.key("alice").key("follows").sorted_range("b", "d").all()      # navigate
    P.key("alice").key("age").update(lambda n: n + 1)              # transform
    P.key(word).null_to_val(0).update(lambda n: n + 1)             # count words
    P.key("alice").key("follows").add("bob")                       # set insert

Navigators (each maps one value to zero or more values):

``key(k)``            map value at ``k`` (``None`` if absent) or a record field
``all()``             each ``(k, v)`` pair of a map, each element of a set/list
``map_vals()``        each value of a map
``sorted_range(s, e)`` the sub-map / sub-set of keys ``s <= k < e`` (``None``: open)
``first(n)``/``last(n)`` the sub-collection of the first/last ``n`` entries
``filter(pred)``      stop unless ``pred(value)``
``view(fn)``          navigate to ``fn(value)`` (read-only)
``null_to_val(v)``    navigate to ``v`` where the value is ``None``
``count()``           the collection's size (O(1) on subindexed collections; read-only)

Terminal transforms: ``set(v)``, ``update(fn)``, ``remove()``, ``add(*items)``
(set insert / list append), ``discard(*items)`` (set delete).  A path that
ends in ``null_to_val(v)`` may be used as a transform on its own: it writes
``v`` where nothing was.

The semantics are defined here on plain Python values (dicts, sets, lists) by
:func:`select_value` and :func:`transform_value`; the RocksDB store must give
identical results (the property tests check exactly that), and reuses these
functions for every part of a value that is stored as one blob.
Maps and sets are visited in sorted key order, as they are on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pstate.errors import InvalidPath
from pstate.schema import List as ListSchema
from pstate.schema import Map, Optional, Record, Schema, Set

# navigator kinds
KEY: Final = 0
ALL: Final = 1
MAP_VALS: Final = 2
RANGE: Final = 3
FIRST: Final = 4
LAST: Final = 5
FILTER: Final = 6
VIEW: Final = 7
NULL_TO_VAL: Final = 8
COUNT: Final = 9

# terminal kinds
T_SET: Final = 0
T_UPDATE: Final = 1
T_REMOVE: Final = 2
T_ADD: Final = 3
T_DISCARD: Final = 4
T_IDENTITY: Final = 5

_NAV_NAMES = {KEY: "key", ALL: "all", MAP_VALS: "map_vals", RANGE: "sorted_range", FIRST: "first",
              LAST: "last", FILTER: "filter", VIEW: "view", NULL_TO_VAL: "null_to_val", COUNT: "count"}


class _Removed:
    """Sentinel: the transform removed the value it navigated to."""

    _inst: _Removed | None = None

    def __repr__(self) -> str:
        return "REMOVED"


REMOVED: Final = _Removed()

Nav = tuple[int, Any, Any]  # (kind, arg1, arg2)


class Path:
    """An immutable sequence of navigators (build it from ``P``)."""

    __slots__ = ("navs",)

    def __init__(self, navs: tuple[Nav, ...] = ()) -> None:
        self.navs = navs

    def _add(self, kind: int, a: Any = None, b: Any = None) -> Path:
        return Path((*self.navs, (kind, a, b)))

    def key(self, k: Any) -> Path:
        """Navigate to the value at map key ``k`` (``None`` if absent) or to record field ``k``."""
        return self._add(KEY, k)

    def all(self) -> Path:
        """Navigate to each ``(k, v)`` of a map / each element of a set or list, in order."""
        return self._add(ALL)

    def map_vals(self) -> Path:
        """Navigate to each value of a map, in key order."""
        return self._add(MAP_VALS)

    def sorted_range(self, start: Any = None, end: Any = None) -> Path:
        """Navigate to the sub-map/sub-set with ``start <= key < end`` (``None`` leaves a side open)."""
        return self._add(RANGE, start, end)

    def first(self, n: int) -> Path:
        """Navigate to the sub-collection of the first ``n`` entries."""
        return self._add(FIRST, _check_n(n))

    def last(self, n: int) -> Path:
        """Navigate to the sub-collection of the last ``n`` entries."""
        return self._add(LAST, _check_n(n))

    def filter(self, pred: Callable[[Any], bool]) -> Path:
        """Continue only where ``pred(value)`` is true."""
        return self._add(FILTER, pred)

    def view(self, fn: Callable[[Any], Any]) -> Path:
        """Navigate to ``fn(value)`` (read-only: not allowed in transforms)."""
        return self._add(VIEW, fn)

    def null_to_val(self, v: Any) -> Path:
        """Navigate to ``v`` where the value is ``None`` (Rama's ``nullToVal``)."""
        return self._add(NULL_TO_VAL, v)

    def count(self) -> Path:
        """Navigate to the size of the collection (0 for ``None``); read-only."""
        return self._add(COUNT)

    # terminals -------------------------------------------------------------
    def set(self, v: Any) -> Transform:
        """Replace the navigated value(s) with ``v``."""
        return Transform(self, T_SET, v)

    def update(self, fn: Callable[[Any], Any]) -> Transform:
        """Replace each navigated value ``x`` with ``fn(x)`` (run on the leader only)."""
        return Transform(self, T_UPDATE, fn)

    def remove(self) -> Transform:
        """Remove the navigated value(s) from their map, set or list."""
        return Transform(self, T_REMOVE, None)

    def add(self, *items: Any) -> Transform:
        """Insert ``items`` into the navigated set (or append to a list); creates it if absent."""
        return Transform(self, T_ADD, items)

    def discard(self, *items: Any) -> Transform:
        """Delete ``items`` from the navigated set (absent items are ignored)."""
        return Transform(self, T_DISCARD, items)

    def __repr__(self) -> str:
        return describe(self.navs, len(self.navs))


def _check_n(n: int) -> int:
    if type(n) is not int or n < 0:
        raise InvalidPath("P", f"first/last need a non-negative int, got {n!r}")
    return n


class Transform:
    """A path plus a terminal operation; give it to ``ChangeSetBuilder.transform``."""

    __slots__ = ("arg", "path", "term")

    def __init__(self, path: Path, term: int, arg: Any) -> None:
        self.path = path
        self.term = term
        self.arg = arg

    def __repr__(self) -> str:
        names = {T_SET: "set", T_UPDATE: "update", T_REMOVE: "remove", T_ADD: "add",
                 T_DISCARD: "discard", T_IDENTITY: "identity"}
        return f"{self.path!r}.{names[self.term]}(...)"


#: the empty path; start every path here
P: Final = Path()


def as_transform(t: Transform | Path) -> Transform:
    """A bare path is an identity transform (useful when it ends in ``null_to_val``)."""
    if isinstance(t, Transform):
        return t
    if isinstance(t, Path):
        return Transform(t, T_IDENTITY, None)
    raise InvalidPath("P", f"expected a path or a transform, got {type(t).__name__}")


def describe(navs: tuple[Nav, ...], upto: int, root: str = "P") -> str:
    """Render the first ``upto`` navigators, for error messages."""
    parts = [root]
    for kind, a, _ in navs[:upto]:
        if kind == KEY:
            parts.append(f"[{a!r}]")
        else:
            parts.append(f".{_NAV_NAMES[kind]}()")
    return "".join(parts)


# ---------------------------------------------------------------------------
# reference semantics on plain Python values
# ---------------------------------------------------------------------------

def unwrap(schema: Schema | None) -> Schema | None:
    """Optional(T) navigates like T (None is handled by every navigator)."""
    while isinstance(schema, Optional):
        schema = schema.inner
    return schema


def in_range(k: Any, start: Any, end: Any) -> bool:
    return (start is None or start <= k) and (end is None or k < end)


def check_bounds(schema: Map | Set, start: Any, end: Any, where: str) -> None:
    ks = schema.key if isinstance(schema, Map) else schema.elem
    if start is not None:
        ks.validate(start, f"{where}.sorted_range(start)")
    if end is not None:
        ks.validate(end, f"{where}.sorted_range(end)")


def sub_collection(schema: Schema, value: Any, nav: Nav, where: str) -> Any:
    """The sub-map/sub-set/sub-list that RANGE/FIRST/LAST navigate to (value is not None)."""
    kind, a, b = nav
    if isinstance(schema, Map):
        keys = sorted(value)
        if kind == RANGE:
            check_bounds(schema, a, b, where)
            keys = [k for k in keys if in_range(k, a, b)]
        elif kind == FIRST:
            keys = keys[:a]
        else:
            keys = keys[max(0, len(keys) - a):]
        return {k: value[k] for k in keys}
    if isinstance(schema, Set):
        elems = sorted(value)
        if kind == RANGE:
            check_bounds(schema, a, b, where)
            return {e for e in elems if in_range(e, a, b)}
        return set(elems[:a]) if kind == FIRST else set(elems[max(0, len(elems) - a):])
    if isinstance(schema, ListSchema) and kind != RANGE:
        return value[:a] if kind == FIRST else value[max(0, len(value) - a):]
    raise InvalidPath(where, f"{_NAV_NAMES[kind]}() needs a sorted map or set, not {_desc(schema)}")


def _desc(schema: Schema | None) -> str:
    return "an untyped value" if schema is None else schema.describe()


def select_value(schema: Schema | None, value: Any, navs: tuple[Nav, ...], i: int, out: list[Any]) -> None:
    """Append every value ``navs[i:]`` reaches from ``value`` to ``out``."""
    n = len(navs)
    while i < n:
        schema = unwrap(schema)
        kind, a, b = navs[i]
        where = describe(navs, i)
        if kind == KEY:
            if isinstance(schema, Map):
                value = None if value is None else value.get(a)
                schema = schema.value
            elif isinstance(schema, Record):
                if a not in schema.fields:
                    raise InvalidPath(where, f"record has no field {a!r}; fields: {sorted(schema.fields)}")
                value = None if value is None else value.get(a)
                schema = schema.fields[a]
            else:
                raise InvalidPath(where, f"key() needs a map or record, not {_desc(schema)}")
        elif kind == FILTER:
            if not a(value):
                return
        elif kind == VIEW:
            value = a(value)
            schema = None
        elif kind == NULL_TO_VAL:
            if value is None:
                value = a
        elif kind == COUNT:
            if not isinstance(schema, Map | Set | ListSchema):
                raise InvalidPath(where, f"count() needs a collection, not {_desc(schema)}")
            value = 0 if value is None else len(value)
            schema = None
        elif kind in (ALL, MAP_VALS):
            if kind == MAP_VALS and not isinstance(schema, Map):
                raise InvalidPath(where, f"map_vals() needs a map, not {_desc(schema)}")
            if value is None:
                return
            if isinstance(schema, Map):
                vs = schema.value
                for k in sorted(value):
                    if kind == ALL:
                        select_value(None, (k, value[k]), navs, i + 1, out)
                    else:
                        select_value(vs, value[k], navs, i + 1, out)
            elif isinstance(schema, Set):
                for e in sorted(value):
                    select_value(schema.elem, e, navs, i + 1, out)
            elif isinstance(schema, ListSchema):
                for e in value:
                    select_value(schema.elem, e, navs, i + 1, out)
            else:
                raise InvalidPath(where, f"all() needs a map, set or list, not {_desc(schema)}")
            return
        else:  # RANGE, FIRST, LAST
            if schema is None or not isinstance(schema, Map | Set | ListSchema):
                raise InvalidPath(where, f"{_NAV_NAMES[kind]}() needs a sorted map or set, not {_desc(schema)}")
            if value is None:
                if kind == RANGE and isinstance(schema, Map | Set):
                    check_bounds(schema, a, b, where)
                return
            value = sub_collection(schema, value, navs[i], where)
        i += 1
    out.append(value)


def validate_at(schema: Schema | None, v: Any, where: str) -> None:
    if schema is not None:
        schema.validate(v, where)


def terminal(schema: Schema | None, value: Any, term: int, arg: Any, where: str) -> Any:
    """Apply a terminal transform to one value; return the new value, ``REMOVED`` or ``value`` itself."""
    if term == T_SET:
        validate_at(schema, arg, where)
        return arg
    if term == T_UPDATE:
        nv = arg(value)
        if nv is value:
            return value
        validate_at(schema, nv, where)
        return nv
    if term == T_REMOVE:
        return REMOVED
    if term == T_IDENTITY:
        return value
    s = unwrap(schema)
    if term == T_ADD:
        if isinstance(s, Set):
            for x in arg:
                s.elem.validate(x, f"{where}.add()")
            base = value if value is not None else set()
            if value is not None and all(x in base for x in arg):
                return value
            return base | set(arg)
        if isinstance(s, ListSchema):
            for x in arg:
                s.elem.validate(x, f"{where}.add()")
            if not arg and value is not None:
                return value
            return [*(value or []), *arg]
        raise InvalidPath(where, f"add() needs a set or list, not {_desc(s)}")
    # T_DISCARD
    if not isinstance(s, Set):
        raise InvalidPath(where, f"discard() needs a set, not {_desc(s)}")
    if value is None or not any(x in value for x in arg):
        return value
    return value - set(arg)


def transform_value(schema: Schema | None, value: Any, navs: tuple[Nav, ...], i: int, term: int, arg: Any) -> Any:
    """Apply ``navs[i:]`` + terminal to ``value``; return the new value, ``REMOVED``, or ``value`` if unchanged.

    Values are never mutated in place: a changed value is a new object and an
    unchanged one is returned as the same object, which is how parents (and
    the store) know whether anything must be written.
    """
    where = describe(navs, i)
    if i == len(navs):
        return terminal(schema, value, term, arg, where)
    schema = unwrap(schema)
    kind, a, b = navs[i]
    if kind == KEY:
        if isinstance(schema, Map):
            schema.key.validate(a, f"{where}[{a!r}] (key)")
            child_schema: Schema | None = schema.value
        elif isinstance(schema, Record):
            if a not in schema.fields:
                raise InvalidPath(where, f"record has no field {a!r}; fields: {sorted(schema.fields)}")
            child_schema = schema.fields[a]
        else:
            raise InvalidPath(where, f"key() needs a map or record, not {_desc(schema)}")
        cur = None if value is None else value.get(a)
        new = transform_value(child_schema, cur, navs, i + 1, term, arg)
        if new is cur:
            return value
        if new is REMOVED:
            if value is None or a not in value:
                return value
            c = dict(value)
            del c[a]
            return c
        c = {} if value is None else dict(value)
        c[a] = new
        return c
    if kind == FILTER:
        return transform_value(schema, value, navs, i + 1, term, arg) if a(value) else value
    if kind == NULL_TO_VAL:
        if value is None:
            validate_at(schema, a, where)
            return transform_value(schema, a, navs, i + 1, term, arg)
        return transform_value(schema, value, navs, i + 1, term, arg)
    if kind in (VIEW, COUNT):
        raise InvalidPath(where, f"{_NAV_NAMES[kind]}() is read-only; use update(fn) to change values")
    if kind in (ALL, MAP_VALS):
        if kind == MAP_VALS and not isinstance(schema, Map):
            raise InvalidPath(where, f"map_vals() needs a map, not {_desc(schema)}")
        if not isinstance(schema, Map | Set | ListSchema):
            raise InvalidPath(where, f"all() needs a map, set or list, not {_desc(schema)}")
        if value is None:
            return value
        if isinstance(schema, Map):
            changed = False
            out: dict[Any, Any] = {}
            for k in sorted(value):
                v = value[k]
                if kind == MAP_VALS:
                    nv = transform_value(schema.value, v, navs, i + 1, term, arg)
                else:
                    pair = (k, v)
                    r = transform_value(None, pair, navs, i + 1, term, arg)
                    nv = check_pair(schema, k, v, pair, r, where)
                if nv is REMOVED:
                    changed = True
                    continue
                if nv is not v:
                    changed = True
                out[k] = nv
            return out if changed else value
        if isinstance(schema, Set):
            changed = False
            outs: set[Any] = set()
            for e in sorted(value):
                ne = transform_value(schema.elem, e, navs, i + 1, term, arg)
                if ne is REMOVED:
                    changed = True
                    continue
                if ne is not e:
                    changed = True
                outs.add(ne)
            return outs if changed else value
        changed = False
        outl: list[Any] = []
        for e in value:
            ne = transform_value(schema.elem, e, navs, i + 1, term, arg)
            if ne is REMOVED:
                changed = True
                continue
            if ne is not e:
                changed = True
            outl.append(ne)
        return outl if changed else value
    # RANGE / FIRST / LAST
    if schema is None or not isinstance(schema, Map | Set | ListSchema):
        raise InvalidPath(where, f"{_NAV_NAMES[kind]}() needs a sorted map or set, not {_desc(schema)}")
    if value is None:
        if kind == RANGE and isinstance(schema, Map | Set):
            check_bounds(schema, a, b, where)
        return value
    sub = sub_collection(schema, value, navs[i], where)
    r = transform_value(schema, sub, navs, i + 1, term, arg)
    if r is sub:
        return value
    return merge_sub(schema, value, sub, r, kind, a)


def check_pair(schema: Map, k: Any, v: Any, pair: tuple[Any, Any], r: Any, where: str) -> Any:
    """Result of a transform of one ``(k, v)`` map entry: the new value, REMOVED or ``v``."""
    if r is pair or r is REMOVED:
        return v if r is pair else REMOVED
    if type(r) is not tuple or len(r) != 2 or r[0] != k:
        raise InvalidPath(where, "all() on a map may change values (return (k, new_v)) but not keys; "
                                 "remove the entry and set the new key instead")
    if r[1] is v:
        return v
    schema.value.validate(r[1], f"{where}[{k!r}]")
    return r[1]


def merge_sub(schema: Map | Set | ListSchema, value: Any, sub: Any, r: Any, kind: int, n: int) -> Any:
    """Put a transformed sub-collection back in place of ``sub``."""
    if isinstance(schema, ListSchema):
        rest = value[n:] if kind == FIRST else value[:max(0, len(value) - n)]
        if r is REMOVED:
            return rest
        return [*r, *rest] if kind == FIRST else [*rest, *r]
    if isinstance(schema, Map):
        out = {k: v for k, v in value.items() if k not in sub}
        if r is not REMOVED:
            out.update(r)
        return out
    outs = {e for e in value if e not in sub}
    if r is not REMOVED:
        outs |= r
    return outs
