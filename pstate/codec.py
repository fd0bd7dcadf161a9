"""How PState values are stored: msgpack, with ints beyond 64 bits as an extension type.

Kept apart from the engine (which decides *where* values go) because every
reader and writer of stored values needs the codec, and the engine only some.
"""

from __future__ import annotations

from typing import Any

import msgpack

_BIGINT = 1  # msgpack ext type: ints beyond 64 bits, as signed big-endian bytes


def _default(o: Any) -> Any:
    if type(o) is int:
        return msgpack.ExtType(_BIGINT, o.to_bytes((o.bit_length() + 8) // 8, "big", signed=True))
    raise TypeError(f"cannot store a {type(o).__name__} value")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int.from_bytes(data, "big", signed=True)
    return msgpack.ExtType(code, data)


_packb = msgpack.Packer(use_bin_type=True, default=_default).pack


def unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def unpack_many(raws: list[bytes]) -> list[Any]:
    """Decode many values in one C loop: concatenated msgpack values are a valid msgpack stream."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=_ext_hook, max_buffer_size=0)
    u.feed(b"".join(raws))
    return list(u)


def pack(v: Any) -> bytes:
    r: bytes = _packb(v)
    return r
