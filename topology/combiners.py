"""How a query topology's results come back together: a :class:`Combiner` per query.

A query runs its function on many tasks (every task, or the tasks its hops reach); each call returns a
value, and the values are combined where they meet, in any order and grouping: on the worker that ran
several calls, then on the client that gathers the workers' partial results. So a combiner is a ``lift``
(one call's result to a partial result) and an associative, commutative ``merge`` of two partial results;
``None`` is "nothing" on both sides (a call that returns None adds nothing). Partial results travel as
msgpack, so they are plain values (tuples come back as lists; the built-in combiners accept both).
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Combiner:
    """``lift`` one call's result into a partial result; ``merge`` two partial results (see the module docstring)."""

    name: str
    lift: Callable[[Any], Any]
    merge: Callable[[Any, Any], Any]
    #: ``lift`` consumes an iterable lazily (a call may return ``q.scan(...)`` without holding it all)
    streams: bool = False
    #: ``lift`` of a concatenation is the ``merge`` of the lifts of its parts (true of ``top_n``, ``count`` and
    #: ``merge``): the ``q.scan(...)`` several calls return un-read may be read as one pass, a page at a time
    chunks: bool = False

    def add(self, acc: Any, result: Any) -> Any:
        """``acc`` with one call's ``result`` combined in."""
        return self.combine(acc, None if result is None else self.lift(result))

    def combine(self, a: Any, b: Any) -> Any:
        """Two partial results as one (None: nothing)."""
        if a is None:
            return b
        if b is None:
            return a
        return self.merge(a, b)


def _same(v: Any) -> Any:
    return v


def _count_of(v: Any) -> int:
    return len(v) if isinstance(v, list | tuple | set | dict) else 1


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b}
    if isinstance(a, set | frozenset) and isinstance(b, set | frozenset):
        return a | b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return [*a, *b]
    raise TypeError(f"merge combines dicts, sets or lists, got {type(a).__name__} and {type(b).__name__}")


#: the sum of the results (numbers)
sum_ = Combiner("sum", _same, operator.add)
#: how many values came back: a list, tuple, set or dict counts its elements, anything else one
count = Combiner("count", _count_of, operator.add, chunks=True)
#: dicts merged (disjoint keys: each task owns its own), sets united, lists concatenated
merge = Combiner("merge", _same, _merge, chunks=True)


def _as_tuple(v: Any) -> Any:
    return tuple(_as_tuple(x) for x in v) if isinstance(v, list | tuple) else v


#: items :func:`top_n` looks at per pass
_TOP_CHUNK = 4096


def _candidates(chunk: list[Any], by: Callable[[Any], Any], n: int) -> list[Any]:
    """The items of ``chunk`` that may be among its ``n`` best: those whose key reaches the n-th largest key
    (found in C: only they are converted to tuples and ordered with their tie-breaks)."""
    if len(chunk) <= n:
        return chunk
    try:
        keys = list(map(by, chunk))
        cut = heapq.nlargest(n, keys)[-1]
        return list(itertools.compress(chunk, map(operator.ge, keys, itertools.repeat(cut))))
    except TypeError:  # (keys a list here, a tuple there: compared once converted, as the items are)
        return chunk


def top_n(n: int, key: int | Callable[[Any], Any] | None = None) -> Combiner:
    """The ``n`` largest items of the lists the calls return, largest first.

    ``key``: an index into each item (``1`` for ``(word, count)`` pairs), a function of the item, or None (the
    item itself). Ties are broken by the item itself (larger first), so the result is the same however the
    calls were grouped; items come back as tuples.
    """
    if type(n) is not int or n <= 0:
        raise ValueError(f"top_n needs a positive int, got {n!r}")
    by: Callable[[Any], Any]
    if key is None:
        by = _same
    elif isinstance(key, int):
        by = operator.itemgetter(key)
    else:
        by = key

    def order(item: Any) -> tuple[Any, Any]:
        return by(item), item

    def best(items: Iterable[Any]) -> list[Any]:
        top: list[Any] = []
        it = iter(items)  # (a streamed result: read a chunk at a time, never held whole)
        while chunk := list(itertools.islice(it, _TOP_CHUNK)):
            top = heapq.nlargest(n, [*top, *map(_as_tuple, _candidates(chunk, by, n))], key=order)
        return top

    return Combiner(f"top_n({n})", best, lambda a, b: best([*a, *b]), streams=True, chunks=True)


def combiner(fn: Callable[[Any, Any], Any], name: str | None = None) -> Combiner:
    """A combiner from a function ``fn(a, b) -> c`` of the module (associative and commutative)."""
    return Combiner(name or str(getattr(fn, "__name__", "combiner")), _same, fn)


def as_combiner(c: Combiner | Callable[[Any, Any], Any]) -> Combiner:
    """A :class:`Combiner` as is; a plain function through :func:`combiner`."""
    if isinstance(c, Combiner):
        return c
    if callable(c):
        return combiner(c)
    raise TypeError(f"a query combines with a Combiner (sum_, count, merge, top_n(n)) or a function, got {c!r}")
