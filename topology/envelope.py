"""Hop messages and the envelopes that carry them between task groups (wire format, msgpack).

A *message* asks the task group that owns a key to run some of the module's
code there::

    [handler, task, key, args]

``handler`` names a ``@m.handler`` function of the module, or one of the
built-ins below that ``ctx.update/set/remove/transform`` and
``ctx.depot_append`` turn into when the key lives elsewhere; ``task`` is the
task that owns ``key``; ``args`` are plain values (msgpack, with tuples and
sets kept as such, so a tuple key arrives as the same key). Functions inside a built-in
travel by name (:mod:`topology.refs`).

One entry's messages to one destination group travel in one *envelope*
(several when they pass :data:`MAX_ENVELOPE_BYTES`)::

    [parents, messages]

``parents`` (flat ``[src, seq, src, seq, ...]``) names the work that sent the
messages: an envelope ``seq`` the entry consumed from group ``src``, or
``src = -1`` for the entry's own input (a client append, a microbatch commit).
The completion tracker follows these links to tell when a record's whole tree
of hops is applied; they are read without decoding the messages.
"""

from __future__ import annotations

from typing import Any

import msgpack

from pstate.path import FILTER, T_UPDATE, VIEW, Path, Transform
from topology.refs import MissingModule, fn_ref, resolve

#: built-in handlers (names users cannot declare: a Python function name never starts with "$")
UPDATE = "$update"
SET = "$set"
REMOVE = "$remove"
TRANSFORM = "$transform"
APPEND = "$append"
BUILTINS = frozenset((UPDATE, SET, REMOVE, TRANSFORM, APPEND))

#: parent marker: the entry's own input (client append, microbatch commit), not a consumed envelope
ROOT = -1
#: an envelope holding more than this is split (a destination consumes whole envelopes only)
MAX_ENVELOPE_BYTES = 1 << 20

Message = list[Any]  # [handler, task, key, args]

# msgpack ext types: message values round-trip as sent (a tuple key stays a tuple, a set stays a set)
_BIGINT, _TUPLE, _SET = 1, 2, 3


def _default(o: Any) -> Any:
    # A Packer is not reentrant: nested values get a packer of their own (tuples and sets are rare).
    if isinstance(o, tuple):
        return msgpack.ExtType(_TUPLE, _pack_nested(list(o)))
    if isinstance(o, (set, frozenset)):
        return msgpack.ExtType(_SET, _pack_nested(list(o)))
    if isinstance(o, int) and not isinstance(o, bool):
        if type(o) is not int:
            return int(o)  # an IntEnum and the like: its value
        return msgpack.ExtType(_BIGINT, o.to_bytes((o.bit_length() + 8) // 8, "big", signed=True))
    base: Any
    for base in (str, bytes, float, dict, list):
        if isinstance(o, base):
            return base(o)  # a subclass (str enum, OrderedDict...): its plain value
    raise TypeError(f"cannot send a {type(o).__name__} value")


def _pack_nested(v: list[Any]) -> bytes:
    raw: bytes = msgpack.packb(v, use_bin_type=True, strict_types=True, default=_default)
    return raw


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TUPLE:
        return tuple(_unpack(data))
    if code == _SET:
        return set(_unpack(data))
    if code == _BIGINT:
        return int.from_bytes(data, "big", signed=True)
    return msgpack.ExtType(code, data)


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False, ext_hook=_ext_hook)


_packer = msgpack.Packer(use_bin_type=True, strict_types=True, default=_default)
_pack = _packer.pack
_header = _packer.pack_array_header


def pack_message(message: Message) -> bytes:
    """One message, packed when it is sent (so a value that cannot travel fails at the ``ctx`` call)."""
    raw: bytes = _pack(message)
    return raw


def encode_envelopes(parents: list[int], messages: list[bytes],
                     max_bytes: int = MAX_ENVELOPE_BYTES) -> list[bytes]:
    """The envelopes carrying packed ``messages`` (in order), each about ``max_bytes`` at most.

    Every piece lists all of ``parents``: a parent then waits for a piece it
    has no message in, which completes anyway, so this only costs a little
    latency on huge fanouts.
    """
    head = _header(2) + _pack(parents)
    out: list[bytes] = []
    start = size = 0
    for i, m in enumerate(messages):
        if size and size + len(m) > max_bytes:
            out.append(head + _header(i - start) + b"".join(messages[start:i]))
            start, size = i, 0
        size += len(m)
    out.append(head + _header(len(messages) - start) + b"".join(messages[start:]))
    return out


def decode_envelope(raw: bytes) -> tuple[list[int], list[Message]]:
    """``(parents, messages)``; ValueError when the bytes are not an envelope."""
    try:
        parents, messages = _unpack(raw)
    except Exception as e:
        raise ValueError(f"not a dataflow envelope: {e}") from e
    if not isinstance(parents, list) or not isinstance(messages, list) or len(parents) % 2:
        raise ValueError("not a dataflow envelope: bad header")
    return parents, messages


def envelope_parents(raw: bytes) -> list[int]:
    """The parents alone, without decoding the messages (a new leader reads every live envelope's)."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=_ext_hook)
    u.feed(raw)
    if u.read_array_header() != 2:
        raise ValueError("not a dataflow envelope: bad header")
    parents = u.unpack()
    if not isinstance(parents, list) or len(parents) % 2:
        raise ValueError("not a dataflow envelope: bad parents")
    return parents


# -------------------------------------------------------------------------------- transforms


def has_functions(t: Transform) -> bool:
    """True when ``t`` holds a function (``update``, ``filter``, ``view``) that would travel by name."""
    if t.term == T_UPDATE:
        return True
    for kind, _a, _b in t.path.navs:  # noqa: SIM110 (a loop, not any(): this runs for every ctx.transform)
        if kind in _FN_NAVS:
            return True
    return False


_FN_NAVS = frozenset((FILTER, VIEW))


def encode_transform(t: Transform, what: str) -> list[Any]:
    """A path transform as plain values; its functions (filter, view, update) by name."""
    navs = []
    for kind, a, b in t.path.navs:
        if kind in (FILTER, VIEW):
            a = fn_ref(a, what)
        navs.append([kind, a, b])
    arg = fn_ref(t.arg, what) if t.term == T_UPDATE else t.arg
    return [navs, t.term, arg]


def decode_transform(wire: list[Any], on_missing: MissingModule | None = None) -> Transform:
    """A transform from :func:`encode_transform`; its functions resolved by name (see :func:`resolve`)."""
    navs_wire, term, arg = wire
    navs = []
    for kind, a, b in navs_wire:
        if kind in (FILTER, VIEW):
            a = resolve(a, on_missing)
        navs.append((kind, a, b))
    if term == T_UPDATE:
        arg = resolve(arg, on_missing)
    return Transform(Path(tuple(navs)), term, arg)
