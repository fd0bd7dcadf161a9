"""A scan page as packed bytes: what a worker ships and a client decodes without a Python loop per entry.

A page of a plain-valued map PState read without navigators is ``count`` (key, value) pairs. Its values are
sent as stored (each is already msgpack) after one msgpack array header, so the client decodes them all in
one C call and the worker never decodes them. Its keys are stored in the order-preserving encoding of
:mod:`pstate.keys`; the common case, every key a str without a NUL (``02 05 <utf-8> 00 01`` in RocksDB),
is sent as the keys' RocksDB bytes concatenated minus the first two and last two bytes: the UTF-8 of each
key joined by ``00 01 02 05`` (a sequence no such key holds), split and decoded on the client in C. Any
other page's keys are decoded on the worker and sent as one msgpack array.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import msgpack

from pstate.codec import unpack
from pstate.keys import decode_key_at

#: what separates two str keys in :attr:`PackedPage.str_keys` (the end of one RocksDB key, the start of the next)
STR_SEP = b"\x00\x01\x02\x05"
_STR_SEP_TEXT = STR_SEP.decode()
_HEAD = b"\x02\x05"
_TAIL = b"\x00\x01"
_array_header = msgpack.Packer(use_bin_type=True).pack_array_header
_packb = msgpack.Packer(use_bin_type=True).pack


@dataclass(frozen=True)
class PackedPage:
    """``count`` pairs: keys in ``str_keys`` (every key a plain str) or else ``keys``; ``values`` as stored."""

    count: int
    str_keys: bytes
    keys: bytes
    values: bytes


def top_key(k: bytes) -> Any:
    """The top-level key of RocksDB element key ``k`` (a str without NULs decoded inline: the common case)."""
    if k[1] == 0x05 and k.find(b"\x00", 2) == len(k) - 2:
        return k[2:-2].decode("utf-8", "surrogatepass")
    return decode_key_at(k, 1)[0]


def pack_page(keys: list[bytes], values: list[bytes], str_typed: bool = False) -> PackedPage:
    """The packed form of the pairs of RocksDB element keys ``keys`` and stored plain ``values``; ``str_typed``:
    the PState's key schema is ``str`` (see :func:`_str_keys`)."""
    n = len(keys)
    assert n == len(values), (n, len(values))
    inner = _str_keys(keys, str_typed)
    if inner is not None:
        return PackedPage(n, inner, b"", _array_header(n) + b"".join(values))
    return PackedPage(n, b"", _packb([top_key(k) for k in keys]), _array_header(n) + b"".join(values))


def top_keys(keys: list[bytes], str_typed: bool = False) -> list[Any]:
    """:func:`top_key` of each of ``keys``, plain str keys decoded in C (``str_typed``: as in :func:`pack_page`)."""
    inner = _str_keys(keys, str_typed)
    return list(map(top_key, keys)) if inner is None else _decode_str_keys(inner)


def _str_keys(keys: list[bytes], str_typed: bool = False) -> bytes | None:
    """The UTF-8 of ``keys`` joined by STR_SEP when every key is a plain str (``02 05 <utf-8> 00 01``), else None.

    ``str_typed`` (the key schema is ``str``, and an update never changes a key schema): every key ends with its
    terminator's NUL, so n NULs in all, each in one of the n - 1 separators or the tail, mean no key holds an
    escaped NUL and the separators are the keys' boundaries, without looking at each key."""
    n = len(keys)
    joined = b"".join(keys)
    if n and joined.count(0) == n and joined.startswith(_HEAD) and joined.endswith(_TAIL):
        if str_typed and joined.count(STR_SEP) == n - 1:
            return joined[2:-2]
        # n NULs in all, and each part between separators 4 bytes shorter than its key: every key is 02 05 .. 00 01
        inner = joined[2:-2]
        if len(parts := inner.split(STR_SEP)) == n and set(map(operator.sub, map(len, keys), map(len, parts))) == {4}:
            return inner
    return None


def _decode_str_keys(inner: bytes) -> list[str]:
    """The keys of :attr:`PackedPage.str_keys`: the UTF-8 decoded at once, then split (the separator's bytes are
    their own characters: no key holds a NUL)."""
    try:
        return inner.decode().split(_STR_SEP_TEXT)
    except UnicodeDecodeError:  # (a lone surrogate: stored with surrogatepass)
        return inner.decode("utf-8", "surrogatepass").split(_STR_SEP_TEXT)


def unpack_pairs(page: PackedPage) -> list[tuple[Any, Any]]:
    """The page's (key, value) pairs, decoded as the worker's own reads decode them."""
    values = unpack(page.values)
    if page.str_keys or (page.count == 1 and not page.keys):
        keys: list[Any] = _decode_str_keys(page.str_keys)
    else:
        keys = unpack(page.keys) if page.keys else []
    if not (len(keys) == len(values) == page.count):
        raise ValueError(f"a packed scan page of {page.count} pairs holds {len(keys)} keys, {len(values)} values")
    return list(zip(keys, values, strict=True))
