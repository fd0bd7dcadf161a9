"""The wire form of a PState query: a path of navigators as msgpack.

Clients encode, the worker decodes. Data navigators travel as they are.
``filter`` and ``view`` hold functions, and a worker never runs code it
received over the network: they travel as the *name* of a module-level
function (``pkg.mod:fn``, the way hops name handlers), which the worker looks
up in the module's own deployed code and runs there (server-side filters).
Naming and resolving are the callers' (``name_fn``/``resolve_fn``): this layer
knows neither the module code nor the worker; without them both ends refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from pstate.errors import InvalidPath
from pstate.path import FILTER, VIEW, Nav, P, Path

_WIRE_FUNCTIONS = {FILTER: "filter", VIEW: "view"}

#: a function's wire name (``pkg.mod:fn``); raises ValueError, saying how to name it, for a function without one
NameFn = Callable[[Callable[..., Any], str], str]
#: the worker's lookup of a wire name in the module's code; raises ValueError for a name it will not run
ResolveFn = Callable[[str], Callable[..., Any]]


def path_navs(key: Any, path: Sequence[Any] | Path | None = None) -> tuple[Nav, ...]:
    """`key` (or a whole `P...` path) plus further navigators, as one tuple of navigators."""
    navs = key.navs if isinstance(key, Path) else P.key(key).navs
    if isinstance(path, Path):
        navs = navs + path.navs
    elif path:
        for p in path:
            if not isinstance(p, Path):
                raise InvalidPath("query", f"navigators after the key must be P... paths, got {p!r}")
            navs = navs + p.navs
    return navs


def encode_navs(navs: tuple[Nav, ...], name_fn: NameFn | None = None) -> bytes:
    """Navigators as msgpack; the functions of ``filter``/``view`` by name (``name_fn``), or refused."""
    out = []
    for kind, a, b in navs:
        if kind in _WIRE_FUNCTIONS:
            what = _WIRE_FUNCTIONS[kind]
            if name_fn is None:
                raise InvalidPath("query", f"{what}() holds a function and cannot be sent to a node; "
                                  "select without it and filter the results in your app")
            try:
                a = name_fn(a, f"P.{what}()")
            except ValueError as e:
                raise InvalidPath("query", f"{what}() runs on the worker, so it must name a module-level "
                                  f"function of the module's code: {e}") from None
        out.append([kind, a, b])
    raw: bytes = msgpack.packb(out, use_bin_type=True)
    return raw


def encode_query(key: Any, path: Sequence[Any] | Path | None = None, name_fn: NameFn | None = None) -> bytes:
    """Client side: `key` (or a whole `P...` path) plus further navigators, as msgpack (see the module docstring)."""
    return encode_navs(path_navs(key, path), name_fn)


def decode_query(raw: bytes, resolve_fn: ResolveFn | None = None) -> Path:
    """Worker side: the path a client encoded; InvalidPath for anything else (runs only named module code)."""
    try:
        navs = msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=False)
    except (ValueError, msgpack.ExtraData) as e:
        raise InvalidPath("query", f"undecodable path: {type(e).__name__} {str(e) or '(invalid msgpack)'}") from e
    if not isinstance(navs, tuple):
        raise InvalidPath("query", f"a path is a list of navigators, got {type(navs).__name__}")
    out = []
    for n in navs:
        if not isinstance(n, tuple) or len(n) != 3 or not isinstance(n[0], int):
            raise InvalidPath("query", f"bad navigator {n!r}")
        kind, a, b = n
        if kind in _WIRE_FUNCTIONS:
            if resolve_fn is None or not isinstance(a, str):
                raise InvalidPath("query", f"bad navigator {n!r}: {_WIRE_FUNCTIONS[kind]}() takes a function name")
            try:
                a = resolve_fn(a)
            except ValueError as e:
                raise InvalidPath("query", f"{_WIRE_FUNCTIONS[kind]}({a!r}): {e}") from None
        out.append((kind, a, b))
    return Path(tuple(out))
