"""Paths over RocksDB: the storage layout of a PState and the select/transform engine.

Layout inside a PState's column family.  Every storage node (the top level,
a subindexed collection, a record holding one) has a *slot* ``(vkey, sub)``:
``vkey`` holds the node's own small value (a collection's element count, a
record's blob of plain fields; the top level has none), and ``sub`` is the
prefix of its children::

    element/field k:   vkey = sub + 02 + enc(k)     (its value blob, count or record blob)
                       sub  = sub + 03 + enc(k)     (its own children, if it is a storage node)

Elements of one node are therefore exactly the keys in ``[sub+02, sub+03)``,
sorted by key (``enc`` preserves order, see :mod:`pstate.keys`) and never
mixed with deeper keys, so ``all``/``sorted_range``/``first``/``last`` are
plain bounded scans, and removing a node is a point delete plus one
``delete_range`` over ``sub``.  Plain values (everything not subindexed) are
one msgpack blob per slot and are navigated by the reference semantics in
:mod:`pstate.path`, which is what makes the store agree with plain Python by
construction for those parts.

Reads go through a ``Reader`` (RocksDB, or RocksDB under overlays of writes
not yet applied); writes go into a :class:`~pstate.changes.Writes`, never to
RocksDB directly — the store applies them as a replog entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from pstate.changes import Overlay, Writes
from pstate.codec import _packb as _packb
from pstate.codec import pack as pack
from pstate.codec import unpack as unpack
from pstate.codec import unpack_many as unpack_many
from pstate.errors import InvalidPath, SchemaMismatch
from pstate.keys import decode_key_at, encode_key, prefix_end
from pstate.path import (
    ALL,
    COUNT,
    FILTER,
    FIRST,
    KEY,
    LAST,
    MAP_VALS,
    NULL_TO_VAL,
    RANGE,
    REMOVED,
    T_ADD,
    T_DISCARD,
    T_REMOVE,
    T_SET,
    Nav,
    check_bounds,
    check_pair,
    describe,
    select_value,
    transform_value,
)
from pstate.schema import Map, Record, Schema, Set

_EMPTY = b""
_ELEM = b"\x02"
_SUB = b"\x03"


def top_key(kt: type | None, key: Any) -> bytes:
    """The RocksDB key of top-level map entry ``key`` of scalar type ``kt`` (str inline: the hottest case)."""
    if kt is str:
        text: str = key
        return _ELEM + b"\x05" + text.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + b"\x00\x01"
    return _ELEM + encode_key(key)


class Reader(Protocol):
    """Read access to committed (or committed + pending) state."""

    def get(self, cf: str, key: bytes) -> bytes | None: ...

    def scan(self, cf: str, lo: bytes, hi: bytes | None, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        ...


class LayeredReader:
    """``overlay`` on top of ``below``: what a leader sees while entries are in flight."""

    def __init__(self, overlay: Overlay | Writes, below: Reader) -> None:
        self.overlay = overlay
        self.below = below

    def get(self, cf: str, key: bytes) -> bytes | None:
        known, v = self.overlay.lookup(cf, key)
        return v if known else self.below.get(cf, key)

    def scan(self, cf: str, lo: bytes, hi: bytes | None, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        return self.overlay.scan(cf, self.below.scan(cf, lo, hi, reverse), lo, hi, reverse)


class Slot:
    """Where a storage node lives: its own value key (None for the top level) and its children's prefix."""

    __slots__ = ("schema", "sub", "vkey")

    def __init__(self, vkey: bytes | None, sub: bytes, schema: Schema) -> None:
        self.vkey = vkey
        self.sub = sub
        self.schema = schema

    def child(self, ek: bytes, schema: Schema) -> Slot:
        return Slot(self.sub + _ELEM + ek, self.sub + _SUB + ek, schema)


def decode_value(schema: Schema, raw: bytes) -> Any:
    v = unpack(raw)
    return v if schema.plain else schema.from_wire(v)


def encode_value(schema: Schema, v: Any) -> bytes:
    r: bytes = _packb(v if schema.plain else schema.to_wire(v))
    return r


def _submap_types(s: Schema) -> tuple[type | None, type | None, type | None]:
    """(key, inner key, value) types of a map of subindexed maps of scalars, for ``Engine._set_in_submap``; Nones
    (which no value's type is) for any other shape, or where a float is involved (NaN needs validating)."""
    sub = s.value if isinstance(s, Map) else None
    if not (isinstance(sub, Map) and sub.storage):
        return None, None, None
    assert isinstance(s, Map)
    types = (getattr(s.key, "pytype", None), getattr(sub.key, "pytype", None), getattr(sub.value, "pytype", None))
    return (None, None, None) if float in types else types


class Engine:
    """Select and transform one PState (column family ``cf``) through ``reader``, writing into ``writes``."""

    def __init__(self, cf: str, name: str, schema: Map | Set, reader: Reader, writes: Writes | None) -> None:
        self.cf = cf
        self.name = name
        self.root = Slot(None, _EMPTY, schema)
        self.reader = reader
        self.w = writes
        self._submap_types: tuple[type | None, type | None, type | None] | None = None

    # -- low level ------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        return self.reader.get(self.cf, key)

    def _writes(self) -> Writes:
        if self.w is None:
            raise InvalidPath(self.name, "this handle is read-only; transform through a ChangeSetBuilder")
        return self.w

    def put(self, key: bytes, value: bytes) -> None:
        self._writes().put(self.cf, key, value)

    def delete(self, key: bytes) -> None:
        self._writes().delete(self.cf, key)

    def exists(self, slot: Slot) -> bool:
        return slot.vkey is None or self.get(slot.vkey) is not None

    def where(self, navs: tuple[Nav, ...], i: int) -> str:
        return describe(navs, i, self.name)

    def elems(self, slot: Slot, bound: Nav | None, where: str) -> list[tuple[Any, bytes, bytes]]:
        """(key, element vkey, raw value) of the node's elements within ``bound``, in key order."""
        sub = slot.sub
        lo = sub + _ELEM
        hi: bytes = sub + _SUB
        reverse = False
        limit = -1
        if bound is not None:
            kind, a, b = bound
            if kind == RANGE:
                s = slot.schema
                assert isinstance(s, Map | Set)
                check_bounds(s, a, b, where)
                if a is not None:
                    lo = lo + encode_key(a)
                if b is not None:
                    hi = sub + _ELEM + encode_key(b)
                if lo >= hi:
                    return []
            elif kind == FIRST:
                limit = a
            else:
                limit = a
                reverse = True
        if limit == 0:
            return []
        p = len(sub) + 1
        out: list[tuple[Any, bytes, bytes]] = []
        it = self.reader.scan(self.cf, lo, hi, reverse)
        if not reverse and limit < 0:  # hot path: a plain bounded scan
            append = out.append
            for k, v in it:
                if k[p] == 0x05 and k.find(b"\x00", p) == len(k) - 2:
                    append((k[p + 1:-2].decode("utf-8", "surrogatepass"), k, v))
                else:
                    append((decode_key_at(k, p)[0], k, v))
            return out
        for k, v in it:
            if reverse and k < lo:
                break
            if k[p] == 0x05 and k[-2:] == b"\x00\x01" and b"\x00" not in k[p + 1:-2]:
                key: Any = k[p + 1:-2].decode("utf-8", "surrogatepass")
            else:
                key, _ = decode_key_at(k, p)
            out.append((key, k, v))
            if len(out) == limit:
                break
        if reverse:
            out.reverse()
        return out

    def sub_slot(self, slot: Slot, vkey: bytes, schema: Schema) -> Slot:
        return Slot(vkey, slot.sub + _SUB + vkey[len(slot.sub) + 1:], schema)

    def count(self, slot: Slot) -> int:
        if slot.vkey is None:
            return sum(1 for _ in self.reader.scan(self.cf, _ELEM, _SUB))
        raw = self.get(slot.vkey)
        return 0 if raw is None else int(unpack(raw))

    # -- materialize / write whole nodes ------------------------------------------
    def materialize(self, slot: Slot) -> Any:
        """The node as a plain Python value (None if absent)."""
        s = slot.schema
        if isinstance(s, Record):
            raw = self.get(slot.vkey) if slot.vkey is not None else None
            if raw is None:
                return None
            d: dict[str, Any] = decode_value(s, raw)
            for f, fs in s.storage_fields.items():
                m = self.materialize(slot.child(encode_key(f), fs))
                if m is not None:
                    d[f] = m
            return d
        if not self.exists(slot):
            return None
        if isinstance(s, Set):
            return {k for k, _, _ in self.elems(slot, None, "")}
        assert isinstance(s, Map)
        vs = s.value
        out: dict[Any, Any] = {}
        for k, vkey, raw in self.elems(slot, None, ""):
            out[k] = self.materialize(self.sub_slot(slot, vkey, vs)) if vs.storage else decode_value(vs, raw)
        return out

    def delete_node(self, slot: Slot) -> None:
        w = self._writes()
        if slot.vkey is None:
            w.delete_range(self.cf, _ELEM, b"\x04")
            return
        w.delete(self.cf, slot.vkey)
        end = prefix_end(slot.sub)
        assert end is not None
        w.delete_range(self.cf, slot.sub, end)

    def write_node(self, slot: Slot, value: Any, fresh: bool = False) -> None:
        """Store a validated Python value as this node, replacing whatever was there."""
        if not fresh:
            self.delete_node(slot)
        s = slot.schema
        if isinstance(s, Record):
            assert slot.vkey is not None
            inline = {f: x for f, x in value.items() if f in s.inline_fields}
            self.put(slot.vkey, encode_value(s, inline))
            for f, fs in s.storage_fields.items():
                if f in value:
                    self.write_node(slot.child(encode_key(f), fs), value[f], fresh=True)
            return
        if slot.vkey is not None:
            self.put(slot.vkey, pack(len(value)))
        if isinstance(s, Set):
            for e in value:
                self.put(slot.sub + _ELEM + encode_key(e), _EMPTY)
            return
        assert isinstance(s, Map)
        vs = s.value
        for k, x in value.items():
            ek = encode_key(k)
            if vs.storage:
                self.write_node(slot.child(ek, vs), x, fresh=True)
            else:
                self.put(slot.sub + _ELEM + ek, encode_value(vs, x))

    def adjust_count(self, slot: Slot, existed: bool, delta: int) -> None:
        if slot.vkey is None or (delta == 0 and existed):
            return
        raw = self.get(slot.vkey) if existed else None
        n = 0 if raw is None else int(unpack(raw))
        self.put(slot.vkey, pack(n + delta))

    # -- select --------------------------------------------------------------
    def select(self, navs: tuple[Nav, ...]) -> list[Any]:
        out: list[Any] = []
        self.select_node(self.root, navs, 0, out)
        return out

    def select_node(self, slot: Slot, navs: tuple[Nav, ...], i: int, out: list[Any]) -> None:
        s = slot.schema
        if i == len(navs):
            out.append(self.materialize(slot))
            return
        kind, a, _ = navs[i]
        if kind == KEY and isinstance(s, Map):
            s.key.validate(a, f"{self.name} key")  # a key of another type is a mistake, not an absent key
            ek = encode_key(a)
            vs = s.value
            if vs.storage:
                self.select_node(slot.child(ek, vs), navs, i + 1, out)
            else:
                raw = self.get(slot.sub + _ELEM + ek)
                select_value(vs, None if raw is None else decode_value(vs, raw), navs, i + 1, out)
            return
        if kind == KEY and isinstance(s, Record) and a in s.storage_fields:
            self.select_node(slot.child(encode_key(a), s.fields[a]), navs, i + 1, out)
            return
        if kind == KEY and isinstance(s, Record):
            raw = self.get(slot.vkey) if slot.vkey is not None else None
            select_value(s, None if raw is None else decode_value(s, raw), navs, i, out)
            return
        if isinstance(s, Map | Set):
            bound: Nav | None = None
            j = i
            if kind in (RANGE, FIRST, LAST) and i + 1 < len(navs) and navs[i + 1][0] in (ALL, MAP_VALS):
                bound = navs[i]
                j = i + 1
                kind = navs[j][0]
            if kind in (ALL, MAP_VALS):
                if kind == MAP_VALS and isinstance(s, Set):
                    raise InvalidPath(self.where(navs, j), f"map_vals() needs a map, not {s.describe()}")
                items = self.elems(slot, bound, self.where(navs, i))
                if j + 1 == len(navs) and isinstance(s, Map) and not s.value.storage:
                    vs = s.value  # hot path: ALL/MAP_VALS is the last navigator over plain values
                    if vs.plain:
                        vals = unpack_many([raw for _, _, raw in items])
                        if kind == ALL:
                            out.extend(zip([k for k, _, _ in items], vals, strict=True))
                        else:
                            out.extend(vals)
                        return
                if j + 1 == len(navs) and isinstance(s, Set):
                    out.extend([k for k, _, _ in items])
                    return
                for k, vkey, raw in items:
                    if isinstance(s, Set):
                        select_value(s.elem, k, navs, j + 1, out)
                        continue
                    vs = s.value
                    if kind == MAP_VALS and vs.storage:
                        self.select_node(self.sub_slot(slot, vkey, vs), navs, j + 1, out)
                        continue
                    v = self.materialize(self.sub_slot(slot, vkey, vs)) if vs.storage else decode_value(vs, raw)
                    if kind == MAP_VALS:
                        select_value(vs, v, navs, j + 1, out)
                    else:
                        select_value(None, (k, v), navs, j + 1, out)
                return
            if kind in (RANGE, FIRST, LAST):
                if not self.exists(slot):
                    if kind == RANGE:
                        check_bounds(s, a, navs[i][2], self.where(navs, i))
                    return
                sub_value = self.sub_value(slot, navs[i], self.where(navs, i))[0]
                select_value(s, sub_value, navs, i + 1, out)
                return
            if kind == COUNT:
                select_value(None, self.count(slot), navs, i + 1, out)
                return
        select_value(s, self.materialize(slot), navs, i, out)

    def sub_value(self, slot: Slot, nav: Nav, where: str) -> tuple[Any, dict[Any, bytes]]:
        """Materialize the sub-collection RANGE/FIRST/LAST navigates to, plus each element's vkey."""
        s = slot.schema
        items = self.elems(slot, nav, where)
        vkeys = {k: vk for k, vk, _ in items}
        if isinstance(s, Set):
            return {k for k, _, _ in items}, vkeys
        assert isinstance(s, Map)
        vs = s.value
        if vs.storage:
            return {k: self.materialize(self.sub_slot(slot, vk, vs)) for k, vk, _ in items}, vkeys
        return {k: decode_value(vs, raw) for k, _, raw in items}, vkeys

    # -- transform -----------------------------------------------------------
    def transform(self, navs: tuple[Nav, ...], term: int, arg: Any) -> None:
        if (term == T_SET and len(navs) == 1 and navs[0][0] == KEY and arg is not None
                and isinstance(self.root.schema, Map) and not self.root.schema.value.storage):
            # hot path: a blind top-level put needs no read
            s = self.root.schema
            k = navs[0][1]
            s.key.validate(k, self.where(navs, 0) + f"[{k!r}] (key)")
            s.value.validate(arg, self.where(navs, 1))
            self.put(_ELEM + encode_key(k), encode_value(s.value, arg))
            return
        if term == T_SET and len(navs) == 2 and self._set_in_submap(navs[0], navs[1], arg):
            return
        self.transform_node(self.root, navs, 0, term, arg)

    def _set_in_submap(self, nav1: Nav, nav2: Nav, v: Any) -> bool:
        """``P.key(a).key(b).set(v)`` into a subindexed map of scalars (timelines, indexes): 2 reads, 2 writes.

        The same writes, in the same order, as the general path below
        (``key_into_map`` twice, then the child's count); False when the shape
        or the types do not fit it exactly, and the general path decides.
        """
        types = self._submap_types
        if types is None:
            types = self._submap_types = _submap_types(self.root.schema)
        if (nav1[0] != KEY or nav2[0] != KEY or type(nav1[1]) is not types[0] or type(nav2[1]) is not types[1]
                or type(v) is not types[2]):
            return False
        ek = encode_key(nav1[1])
        cv = _SUB + ek + _ELEM + encode_key(nav2[1])
        fresh = self.get(cv) is None
        self.put(cv, _packb(v))
        if fresh:
            vkey = _ELEM + ek
            raw = self.get(vkey)
            self.put(vkey, pack((0 if raw is None else int(unpack(raw))) + 1))
        return True

    def fallback(self, slot: Slot, navs: tuple[Nav, ...], i: int, term: int, arg: Any) -> tuple[bool, bool]:
        """Materialize the node, transform it as a plain value, write it back if it changed."""
        cur = self.materialize(slot)
        r = transform_value(slot.schema, cur, navs, i, term, arg)
        existed = cur is not None
        if r is cur:
            return existed, existed
        if r is REMOVED:
            if existed:
                self.delete_node(slot)
            return existed, slot.vkey is None
        self.write_node(slot, r)
        return existed, True

    def transform_node(self, slot: Slot, navs: tuple[Nav, ...], i: int, term: int, arg: Any) -> tuple[bool, bool]:
        """Transform a storage node; return (existed before, exists after) so parents can keep counts."""
        s = slot.schema
        n = len(navs)
        if i == n:
            if term == T_REMOVE:
                existed = self.exists(slot)
                if existed:
                    self.delete_node(slot)
                return existed, slot.vkey is None
            if term == T_SET:
                if type(arg) is not getattr(s, "pytype", None) or type(arg) is float:
                    s.validate(arg, self.where(navs, i))
                existed = self.exists(slot)
                self.write_node(slot, arg, fresh=not existed)
                return existed, True
            if term in (T_ADD, T_DISCARD) and isinstance(s, Set):
                return self.set_add_discard(slot, term, arg, self.where(navs, i))
            return self.fallback(slot, navs, i, term, arg)
        kind, a, _ = navs[i]
        if kind == KEY and isinstance(s, Map):
            return self.key_into_map(slot, navs, i, term, arg)
        if kind == KEY and isinstance(s, Record):
            return self.key_into_record(slot, navs, i, term, arg)
        if isinstance(s, Map | Set):
            if kind in (ALL, MAP_VALS):
                return self.iterate(slot, None, navs, i, term, arg)
            if kind in (RANGE, FIRST, LAST):
                if i + 1 < n and navs[i + 1][0] in (ALL, MAP_VALS):
                    return self.iterate(slot, navs[i], navs, i + 1, term, arg)
                return self.range_transform(slot, navs, i, term, arg)
        if kind == FILTER:
            if not a(self.materialize(slot)):
                e = self.exists(slot)
                return e, e
            return self.transform_node(slot, navs, i + 1, term, arg)
        if kind == NULL_TO_VAL and self.exists(slot):
            return self.transform_node(slot, navs, i + 1, term, arg)
        return self.fallback(slot, navs, i, term, arg)

    def key_into_map(self, slot: Slot, navs: tuple[Nav, ...], i: int, term: int, arg: Any) -> tuple[bool, bool]:
        s = slot.schema
        assert isinstance(s, Map)
        k = navs[i][1]
        if type(k) is not getattr(s.key, "pytype", None) or type(k) is float:  # (the where text costs more)
            s.key.validate(k, self.where(navs, i) + f"[{k!r}] (key)")
        ek = encode_key(k)
        vs = s.value
        if vs.storage:
            e, a = self.transform_node(slot.child(ek, vs), navs, i + 1, term, arg)
        else:
            cv = slot.sub + _ELEM + ek
            raw = self.get(cv)
            cur = None if raw is None else decode_value(vs, raw)
            r = transform_value(vs, cur, navs, i + 1, term, arg)
            e = raw is not None
            if r is cur:
                a = e
            elif r is REMOVED:
                if e:
                    self.delete(cv)
                a = False
            else:
                self.put(cv, encode_value(vs, r))
                a = True
        if slot.vkey is None:
            return True, True
        if e == a:
            existed = self.exists(slot)
            return existed, existed
        existed = self.exists(slot)
        self.adjust_count(slot, existed, int(a) - int(e))
        return existed, True

    def key_into_record(self, slot: Slot, navs: tuple[Nav, ...], i: int, term: int, arg: Any) -> tuple[bool, bool]:
        s = slot.schema
        assert isinstance(s, Record) and slot.vkey is not None
        f = navs[i][1]
        if f not in s.fields:
            raise InvalidPath(self.where(navs, i), f"record has no field {f!r}; fields: {sorted(s.fields)}")
        raw = self.get(slot.vkey)
        existed = raw is not None
        if f in s.storage_fields:
            _, a = self.transform_node(slot.child(encode_key(f), s.fields[f]), navs, i + 1, term, arg)
            if a and not existed:
                self.put(slot.vkey, encode_value(s, {}))
            return existed, existed or a
        blob = None if raw is None else decode_value(s, raw)
        r = transform_value(s, blob, navs, i, term, arg)
        if r is blob:
            return existed, existed
        self.put(slot.vkey, encode_value(s, r))
        return existed, True

    def iterate(self, slot: Slot, bound: Nav | None, navs: tuple[Nav, ...], i: int, term: int,
                arg: Any) -> tuple[bool, bool]:
        """ALL / MAP_VALS (optionally within a RANGE/FIRST/LAST bound) over a subindexed node."""
        s = slot.schema
        kind = navs[i][0]
        where = self.where(navs, i)
        items = self.elems(slot, bound, self.where(navs, i - 1 if bound else i))
        removed = 0
        if isinstance(s, Set):
            if kind == MAP_VALS:
                raise InvalidPath(where, f"map_vals() needs a map, not {s.describe()}")
            gone: list[bytes] = []
            added: list[Any] = []
            for e, vkey, _ in items:
                r = transform_value(s.elem, e, navs, i + 1, term, arg)
                if r is e:
                    continue
                gone.append(vkey)
                if r is not REMOVED:
                    added.append(r)
            if not gone:
                e = bool(items) or self.exists(slot)
                return e, e
            for vkey in gone:
                self.delete(vkey)
            gone_set = set(gone)
            delta = -len(gone)
            seen: set[bytes] = set()
            for r in added:
                vkey = slot.sub + _ELEM + encode_key(r)
                if vkey in seen:
                    continue
                seen.add(vkey)
                if vkey in gone_set or self.get(vkey) is None:
                    delta += 1
                self.put(vkey, _EMPTY)
            self.adjust_count(slot, True, delta)
            return True, True
        assert isinstance(s, Map)
        vs = s.value
        for k, vkey, raw in items:
            child = self.sub_slot(slot, vkey, vs)
            if kind == MAP_VALS:
                if vs.storage:
                    e, a = self.transform_node(child, navs, i + 1, term, arg)
                    removed += int(e and not a)
                    continue
                cur = decode_value(vs, raw)
                r = transform_value(vs, cur, navs, i + 1, term, arg)
            else:
                cur = self.materialize(child) if vs.storage else decode_value(vs, raw)
                pair = (k, cur)
                r = check_pair(s, k, cur, pair, transform_value(None, pair, navs, i + 1, term, arg), where)
            if r is cur:
                continue
            if r is REMOVED:
                if vs.storage:
                    self.delete_node(child)
                else:
                    self.delete(vkey)
                removed += 1
            elif vs.storage:
                self.write_node(child, r)
            else:
                self.put(vkey, encode_value(vs, r))
        if not items:
            e = self.exists(slot)
            return e, e
        if removed:
            self.adjust_count(slot, True, -removed)
        return True, True

    def range_transform(self, slot: Slot, navs: tuple[Nav, ...], i: int, term: int, arg: Any) -> tuple[bool, bool]:
        """RANGE/FIRST/LAST followed by anything but ALL/MAP_VALS: transform the sub-collection as a value."""
        s = slot.schema
        assert isinstance(s, Map | Set)
        where = self.where(navs, i)
        if not self.exists(slot):
            if navs[i][0] == RANGE:
                check_bounds(s, navs[i][1], navs[i][2], where)
            return False, False
        sub, vkeys = self.sub_value(slot, navs[i], where)
        r = transform_value(s, sub, navs, i + 1, term, arg)
        if r is sub:
            return True, True
        delta = 0
        keep = set() if r is REMOVED else set(r)
        vs = s.value if isinstance(s, Map) else None
        for k, vkey in vkeys.items():
            if k not in keep:
                if vs is not None and vs.storage:
                    self.delete_node(self.sub_slot(slot, vkey, vs))
                else:
                    self.delete(vkey)
                delta -= 1
        if r is not REMOVED:
            for k in r:
                if k in vkeys:
                    if isinstance(s, Set) or r[k] is sub[k]:
                        continue
                    vkey = vkeys[k]
                else:
                    vkey = slot.sub + _ELEM + encode_key(k)
                    if self.get(vkey) is None:
                        delta += 1
                if vs is None:
                    self.put(vkey, _EMPTY)
                elif vs.storage:
                    self.write_node(self.sub_slot(slot, vkey, vs), r[k])
                else:
                    self.put(vkey, encode_value(vs, r[k]))
        self.adjust_count(slot, True, delta)
        return True, True

    def set_add_discard(self, slot: Slot, term: int, items: tuple[Any, ...], where: str) -> tuple[bool, bool]:
        s = slot.schema
        assert isinstance(s, Set)
        existed = self.exists(slot)
        delta = 0
        if term == T_ADD:
            for x in items:
                s.elem.validate(x, f"{where}.add()")
            for x in dict.fromkeys(items):
                vkey = slot.sub + _ELEM + encode_key(x)
                if not existed or self.get(vkey) is None:
                    self.put(vkey, _EMPTY)
                    delta += 1
            if delta or not existed:
                self.adjust_count(slot, existed, delta)
            return existed, True
        if not existed:
            return False, False
        for x in dict.fromkeys(items):
            try:
                vkey = slot.sub + _ELEM + encode_key(x)
            except SchemaMismatch:
                continue
            if self.get(vkey) is not None:
                self.delete(vkey)
                delta -= 1
        if delta:
            self.adjust_count(slot, True, delta)
        return True, True
