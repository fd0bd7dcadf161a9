"""Order-preserving key encoding.

RocksDB sorts keys bytewise, and PStates promise sorted maps and sets with
range queries, so a key's encoding must sort exactly like the Python value:
``a < b  <=>  encode(a) < encode(b)`` for values of one comparable type.
Every encoding starts with a type tag byte, so values of different types
never interleave (they sort by tag: None < bool < int < float < str < bytes
< tuple), and every encoding is self-delimiting, so tuples (composite keys)
are just concatenations and a key can be decoded from the middle of a longer
RocksDB key (subindexed collections nest keys inside keys).

* int: sign/length class byte then big-endian magnitude; negative numbers
  store the one's complement so larger magnitudes sort first.  Unbounded
  (Python big ints) via an 8-byte length escape beyond 125 bytes.
* float: IEEE-754 big-endian with the sign bit flipped (positives) or all
  bits flipped (negatives); ``-0.0`` is stored as ``0.0`` because Python
  treats them as the same dict key; NaN is refused (it has no order).
* str / bytes: UTF-8 (str, ``surrogatepass``) with ``00`` escaped as
  ``00 FF`` and terminated by ``00 01`` — escaping keeps prefix order
  (``"a" < "ab"``) and makes the field self-delimiting.
* tuple: elements, then a ``00`` terminator (lower than any tag, so a
  prefix tuple sorts first, as in Python).
"""

from __future__ import annotations

import struct
from typing import Any

from pstate.errors import CorruptStore, SchemaMismatch

T_NONE = 0x01
T_BOOL = 0x02
T_INT = 0x03
T_FLOAT = 0x04
T_STR = 0x05
T_BYTES = 0x06
T_TUPLE = 0x07

_BIG_POS = 0xFF
_BIG_NEG = 0x00
_MAX_SHORT = 125  # magnitudes up to 125 bytes use the one-byte class

_pack_d = struct.Struct(">d").pack
_unpack_Q = struct.Struct(">Q").unpack
_pack_Q = struct.Struct(">Q").pack
_SIGN = 1 << 63
_MASK64 = (1 << 64) - 1

KeyValue = Any  # None | bool | int | float | str | bytes | tuple of these


def _enc_int(n: int, out: bytearray) -> None:
    out.append(T_INT)
    if n >= 0:
        ln = (n.bit_length() + 7) >> 3
        if ln <= _MAX_SHORT:
            out.append(0x80 + ln)
        else:
            out.append(_BIG_POS)
            out += _pack_Q(ln)
        out += n.to_bytes(ln, "big")
    else:
        m = -n
        ln = (m.bit_length() + 7) >> 3
        if ln <= _MAX_SHORT:
            out.append(0x7F - ln)
        else:
            out.append(_BIG_NEG)
            out += _pack_Q(_MASK64 - ln)
        out += ((1 << (8 * ln)) - 1 - m).to_bytes(ln, "big")


def _enc_float(f: float, out: bytearray) -> None:
    if f != f:
        raise SchemaMismatch("<key>", "an orderable float key", "NaN")
    if f == 0.0:
        f = 0.0  # -0.0 == 0.0 in Python dicts, so it must be one key here too
    (u,) = _unpack_Q(_pack_d(f))
    u = (u ^ _MASK64) if u & _SIGN else (u | _SIGN)
    out.append(T_FLOAT)
    out += _pack_Q(u)


def _enc_text(b: bytes, tag: int, out: bytearray) -> None:
    out.append(tag)
    out += b.replace(b"\x00", b"\x00\xff")
    out += b"\x00\x01"


def _enc(v: Any, out: bytearray) -> None:
    t = type(v)
    if t is str:
        _enc_text(v.encode("utf-8", "surrogatepass"), T_STR, out)
    elif t is int:
        _enc_int(v, out)
    elif t is bytes:
        _enc_text(v, T_BYTES, out)
    elif t is tuple:
        out.append(T_TUPLE)
        for item in v:
            _enc(item, out)
        out.append(0x00)
    elif t is float:
        _enc_float(v, out)
    elif t is bool:
        out.append(T_BOOL)
        out.append(1 if v else 0)
    elif v is None:
        out.append(T_NONE)
    else:
        raise SchemaMismatch("<key>", "None, bool, int, float, str, bytes or tuple key", t.__name__)


def encode_key(v: KeyValue) -> bytes:
    """Encode one key value (see the module docstring for the format)."""
    t = type(v)
    if t is str:  # the hot path: most keys are strings
        r: bytes = b"\x05" + v.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + b"\x00\x01"
        return r
    if t is int and 0 <= v < _SMALL_INT:  # the next hottest: ids, counters, timestamps
        ln = (v.bit_length() + 7) >> 3
        r = _INT_HEADS[ln] + v.to_bytes(ln, "big")
        return r
    out = bytearray()
    _enc(v, out)
    return bytes(out)


_SMALL_INT = 1 << 64
#: what _enc_int writes before the bytes of a non-negative int of 0..8 bytes
_INT_HEADS = [bytes((T_INT, 0x80 + ln)) for ln in range(9)]


def _dec_text(buf: bytes, pos: int) -> tuple[bytes, int]:
    parts: list[bytes] = []
    while True:
        j = buf.find(b"\x00", pos)
        if j < 0 or j + 1 >= len(buf):
            raise CorruptStore("key", f"unterminated string at byte {pos}")
        nxt = buf[j + 1]
        parts.append(buf[pos:j])
        if nxt == 0xFF:
            parts.append(b"\x00")
            pos = j + 2
        elif nxt == 0x01:
            return b"".join(parts), j + 2
        else:
            raise CorruptStore("key", f"bad string escape at byte {j}")


def decode_key_at(buf: bytes, pos: int) -> tuple[KeyValue, int]:
    """Decode the key starting at ``buf[pos]``; return it and the position after it."""
    try:
        tag = buf[pos]
        if tag == T_STR:
            raw, pos = _dec_text(buf, pos + 1)
            return raw.decode("utf-8", "surrogatepass"), pos
        if tag == T_INT:
            cls = buf[pos + 1]
            pos += 2
            if cls == _BIG_POS:
                (ln,) = _unpack_Q(buf[pos : pos + 8])
                pos += 8
                return int.from_bytes(buf[pos : pos + ln], "big"), pos + ln
            if cls == _BIG_NEG:
                (c,) = _unpack_Q(buf[pos : pos + 8])
                ln = _MASK64 - c
                pos += 8
            elif cls >= 0x80:
                ln = cls - 0x80
                return int.from_bytes(buf[pos : pos + ln], "big"), pos + ln
            else:
                ln = 0x7F - cls
            comp = int.from_bytes(buf[pos : pos + ln], "big")
            return -((1 << (8 * ln)) - 1 - comp), pos + ln
        if tag == T_BYTES:
            return _dec_text(buf, pos + 1)
        if tag == T_FLOAT:
            (u,) = _unpack_Q(buf[pos + 1 : pos + 9])
            u = (u ^ _SIGN) if u & _SIGN else (u ^ _MASK64)
            return struct.unpack(">d", _pack_Q(u))[0], pos + 9
        if tag == T_BOOL:
            return buf[pos + 1] == 1, pos + 2
        if tag == T_NONE:
            return None, pos + 1
        if tag == T_TUPLE:
            items: list[Any] = []
            pos += 1
            while buf[pos] != 0x00:
                item, pos = decode_key_at(buf, pos)
                items.append(item)
            return tuple(items), pos + 1
    except (IndexError, struct.error) as exc:
        raise CorruptStore("key", f"truncated key {buf!r}") from exc
    raise CorruptStore("key", f"unknown type tag {tag:#x} at byte {pos}")


def decode_key(buf: bytes) -> KeyValue:
    """Decode a whole encoded key (the inverse of :func:`encode_key`)."""
    v, end = decode_key_at(buf, 0)
    if end != len(buf):
        raise CorruptStore("key", f"{len(buf) - end} trailing byte(s) after key")
    return v


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix`` (None: no bound)."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None
