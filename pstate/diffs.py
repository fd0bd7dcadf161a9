"""Fine-grained diffs of one watched PState node, read off an entry's writes (reactive subscriptions).

Why from the writes and not by comparing values: a replog entry already holds every key it writes
(:mod:`pstate.changes`), so the diff of a watched node is a pure function of the entry's
:class:`~pstate.changes.ChangeSet` and the PState's schema: no read, no copy of the old value, and the
same function runs on the leader as entries apply and on a new leader replaying the entries a
subscriber missed (its recent applied entries) after a failover. Every diff is an *assignment* (a key
set to a value, a key removed, a collection's size set to n), so folding the diffs of entries
``(a, b]`` into the value at ``a`` gives the value at ``b`` (:func:`fold`).

A watch is a top-level key of a PState (``P.key(k)``) or the whole PState (``key=WHOLE``). The layout is
:mod:`pstate.engine`'s: a storage node has a value key ``vkey`` (a subindexed collection's size, a plain
value's blob) and its children under ``sub`` (``sub + 02 + enc(k)`` an element, ``sub + 03 + enc(k)`` the
children of a subindexed element). Diffs, each a list ``[kind, keys, value]`` where ``keys`` is the path
below the watched node::

    ["set",   [k, ...], v]     a key (or the watched value itself, keys == []) set to v
    ["add",   [k, ...], None]  an element added to a set
    ["del",   [k, ...], None]  a key or element removed (keys == []: the watched value is gone)
    ["size",  [k, ...], n]     a subindexed collection's size is now n
    ["clear", [k, ...], None]  every element of a subindexed collection removed

What the writes cannot say exactly (a record's blob, a range delete that cuts a node partly) makes
:func:`diffs_of` return None: the caller sends the whole value instead (a resync), which is always
exact in value terms. A rewrite of a key with the same value is a ``set`` too: diffs report what the
entry wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from pstate.changes import OP_DELETE, OP_DELETE_RANGE, OP_PUT, ChangeSet
from pstate.codec import unpack
from pstate.errors import InvalidPath
from pstate.keys import decode_key_at, encode_key, prefix_end
from pstate.schema import Map, Record, Schema, Set

#: the ``key`` of a watch on a whole PState (a top-level key is any other value)
WHOLE: Any = ...

_ELEM = 0x02
_SUB = 0x03

Diff = list[Any]


@dataclass(frozen=True)
class Watch:
    """What one topic watches: a column family, and the node's value key, children prefix and schema."""

    cf: str
    vkey: bytes | None  # None: the whole PState (no value key of its own)
    sub: bytes
    schema: Schema

    @staticmethod
    def of(cf: str, root: Map | Set, key: Any) -> Watch:
        """The watch of ``key`` (or ``WHOLE``) in a PState stored in ``cf`` with top-level schema ``root``."""
        if key is WHOLE:
            return Watch(cf, None, b"", root)
        if not isinstance(root, Map):
            raise InvalidPath(cf, "a set PState is watched whole: subscribe without a key")
        root.key.validate(key, f"{cf} key")
        ek = encode_key(key)
        return Watch(cf, b"\x02" + ek, b"\x03" + ek, root.value)


def _value(schema: Schema, raw: bytes) -> Any:
    v = unpack(raw)
    return v if schema.plain else schema.from_wire(v)


def _element(schema: Schema, rest: bytes, keys: list[Any], op: int, raw: bytes | None) -> Diff | None:
    """The diff of a write at ``rest`` (the key after a node's children prefix) below a node of ``schema``."""
    if not isinstance(schema, Map | Set) or not rest:
        return None
    try:
        k, end = decode_key_at(rest, 1)
    except Exception:
        return None
    child = schema.value if isinstance(schema, Map) else None
    if rest[0] == _SUB:
        if child is None or not isinstance(child, Map | Set) or not child.storage or end == len(rest):
            return None  # a record's subindexed field, or something the layout does not have
        return _element(child, rest[end:], [*keys, k], op, raw)
    if rest[0] != _ELEM or end != len(rest):
        return None
    path = [*keys, k]
    if op == OP_DELETE:
        return ["del", path, None]
    assert raw is not None
    if child is None:
        return ["add", path, None]
    if isinstance(child, Record):
        return None
    if child.storage:
        return ["size", path, int(unpack(raw))]
    return ["set", path, _value(child, raw)]


def _clear(w: Watch, begin: bytes, end: bytes) -> Diff | bool | None:
    """A range delete: False if it misses the node, a ``clear`` diff if it empties one node, else None."""
    if w.vkey is None:
        if begin <= b"\x02" and end >= b"\x04":
            return ["clear", [], None]
    else:
        hi = prefix_end(w.sub)
        assert hi is not None
        if not (begin <= w.vkey < end) and (end <= w.sub or begin >= hi):
            return False
        if begin == w.sub and end == hi:
            return ["clear", [], None]
    if not begin.startswith(w.sub) or prefix_end(begin) != end:
        return None
    rest = begin[len(w.sub):]
    keys: list[Any] = []
    schema = w.schema
    while rest:  # a chain of 03 + enc(k): the children of one nested subindexed node
        if rest[0] != _SUB or not isinstance(schema, Map):
            return None
        try:
            k, pos = decode_key_at(rest, 1)
        except Exception:
            return None
        keys.append(k)
        schema = schema.value
        rest = rest[pos:]
    return ["clear", keys, None] if keys else None


def diffs_of(cs: ChangeSet, w: Watch) -> list[Diff] | None:
    """The diffs one applied entry makes to the watched node, in write order; None when only a resync is exact."""
    try:
        ci = cs.cfs.index(w.cf)
    except ValueError:
        return []
    out: list[Diff] = []
    vkey, sub, n = w.vkey, w.sub, len(w.sub)
    for op, c, items in cs.runs:
        if c != ci:
            continue
        if op == OP_DELETE_RANGE:
            for j in range(0, len(items), 2):
                d = _clear(w, items[j], items[j + 1])
                if d is None:
                    return None
                if d is not False:
                    out.append(d)  # type: ignore[arg-type]
            continue
        step = 2 if op == OP_PUT else 1
        for j in range(0, len(items), step):
            key = items[j]
            raw = items[j + 1] if op == OP_PUT else None
            if vkey is not None and key == vkey:
                d = _own(w.schema, op, raw)
            elif key.startswith(sub) and len(key) > n:
                d = _element(w.schema, key[n:], [], op, raw)
            else:
                continue
            if d is None:
                return None
            out.append(d)
    return out


def _own(schema: Schema, op: int, raw: bytes | None) -> Diff | None:
    """A write of the watched node's own value key."""
    if op == OP_DELETE:
        return ["del", [], None]
    assert raw is not None
    if isinstance(schema, Record):
        return None
    if schema.storage:
        return ["size", [], int(unpack(raw))]
    return ["set", [], _value(schema, raw)]


def fold(value: Any, diffs: list[Diff]) -> Any:
    """The value after ``diffs`` (a consumer's copy of the watched node: dicts, sets and plain values)."""
    for kind, keys, v in diffs:
        if not keys:
            if kind == "set":
                value = v
            elif kind == "del":
                value = None
            elif kind == "clear" and isinstance(value, dict | set):
                value = type(value)()
            continue  # the node's own "size": its elements' diffs say the same
        creates = kind in ("set", "add")
        if value is None:
            if not creates:
                continue
            value = set() if kind == "add" and len(keys) == 1 else {}
        node = value
        for i, k in enumerate(keys[:-1]):
            want_set = kind == "add" and i == len(keys) - 2
            nxt = node.get(k) if isinstance(node, dict) else None
            if nxt is None or (want_set and not nxt and not isinstance(nxt, set)):
                if not creates:
                    node = None
                    break
                nxt = node[k] = set() if want_set else {}
            node = nxt
        if node is None:
            continue
        last = keys[-1]
        if kind == "set":
            node[last] = v
        elif kind == "add":
            node.add(last)
        elif kind == "del":
            if isinstance(node, set):
                node.discard(last)
            else:
                node.pop(last, None)
        elif kind == "clear" and isinstance(node.get(last), dict | set):
            node[last].clear()
    return value




# ---------------------------------------------------------------- events on the wire

#: an event's kind: the value when a subscription starts, one applied entry's diffs, a fresh value that
#: replaces the consumer's (a slow consumer, or diffs the leader could not produce)
VALUE, DIFFS, RESYNC = 0, 1, 2
_BIGINT, _SET = 1, 2


def _wire_default(o: Any) -> Any:
    if type(o) is int:
        return msgpack.ExtType(_BIGINT, o.to_bytes((o.bit_length() + 8) // 8, "big", signed=True))
    if isinstance(o, set | frozenset):
        return msgpack.ExtType(_SET, msgpack.packb(list(o), use_bin_type=True, default=_wire_default))  # (not the packer: it is not reentrant)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"cannot send a {type(o).__name__} value")


def _wire_ext(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int.from_bytes(data, "big", signed=True)
    if code == _SET:
        return set(_unpack_event(data))
    return msgpack.ExtType(code, data)


_event_packer = msgpack.Packer(use_bin_type=True, default=_wire_default).pack


def _unpack_event(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False, ext_hook=_wire_ext)


def pack_event(kind: int, offset: int, payload: Any) -> bytes:
    """One event as sent to every subscriber of a topic (encoded once, whatever their number)."""
    out: bytes = _event_packer([kind, offset, payload])
    return out


def unpack_event(raw: bytes) -> tuple[int, int, Any]:
    """(kind, applied offset, value or list of diffs) of one event."""
    kind, offset, payload = _unpack_event(raw)
    return kind, offset, payload


__all__ = ["DIFFS", "RESYNC", "VALUE", "WHOLE", "Diff", "Watch", "diffs_of", "fold", "pack_event", "unpack_event"]
