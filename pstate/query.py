"""The wire form of a PState query: a path of data navigators as msgpack.

Clients encode, the worker decodes. Only data navigators travel: ``filter``
and ``view`` hold functions, and a worker never runs code it received over
the network, so both ends refuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from pstate.errors import InvalidPath
from pstate.path import FILTER, VIEW, P, Path

_WIRE_FORBIDDEN = {FILTER: "filter", VIEW: "view"}


def encode_query(key: Any, path: Sequence[Any] | Path | None = None) -> bytes:
    """Client side: `key` (or a whole `P...` path) plus further navigators, as msgpack."""
    if isinstance(key, Path):
        navs = key.navs
    else:
        navs = P.key(key).navs
    if isinstance(path, Path):
        navs = navs + path.navs
    elif path:
        for p in path:
            if not isinstance(p, Path):
                raise InvalidPath("query", f"navigators after the key must be P... paths, got {p!r}")
            navs = navs + p.navs
    for kind, _a, _b in navs:
        if kind in _WIRE_FORBIDDEN:
            raise InvalidPath("query", f"{_WIRE_FORBIDDEN[kind]}() holds a function and cannot be sent to a node; "
                              "select without it and filter the results in your app")
    raw: bytes = msgpack.packb([list(n) for n in navs], use_bin_type=True)
    return raw


def decode_query(raw: bytes) -> Path:
    """Worker side: the path a client encoded; InvalidPath for anything else (never runs code)."""
    try:
        navs = msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=False)
    except (ValueError, msgpack.ExtraData) as e:
        raise InvalidPath("query", f"undecodable path: {type(e).__name__} {str(e) or '(invalid msgpack)'}") from e
    out = []
    for n in navs:
        if not isinstance(n, tuple) or len(n) != 3 or not isinstance(n[0], int) or n[0] in _WIRE_FORBIDDEN:
            raise InvalidPath("query", f"bad navigator {n!r}")
        out.append((n[0], n[1], n[2]))
    return Path(tuple(out))
