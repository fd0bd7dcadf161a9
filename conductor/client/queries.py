"""The app's side of queries: paged scans (:func:`scan_pages`) and query topologies (:func:`run_query`).

A scan is a series of bounded pages, each with a resume point, that the group leader pushes on a server
stream (:class:`~conductor.client.scan_stream.GroupPages`: two pages at most ahead on the worker, then
gRPC's flow control). A scan of every task streams from every group's leader at once and takes their pages
in turn (a page of group 0, then of group 1, ...; a group that is done drops out), so the leaders read in
parallel; the client holds the page it returns. A :class:`ScanPage`'s ``token`` (the next group's turn and
each group's resume point) resumes right after it, in another process too. The worker keeps the requested
task's keys (a group's store holds all its tasks'), so no other key crosses the network.

A query topology (``@m.query``, :mod:`topology.query`) is driven from here: the first calls go to the
leader of each group concerned (the task owning the first argument, or every task, grouped by group),
each request answers with its calls' combined result and the hops its calls made to other groups, which
go to those groups' leaders next (a wave: the requests of one wave go out together from the calling thread,
which makes the last one itself, see :class:`_Sent`); results are combined with the query's combiner. At most
:data:`MAX_INFLIGHT` requests are out at once, each with at most :data:`MAX_CALLS_PER_REQUEST` calls, and
at most :data:`MAX_CALLS` calls per query in all; past its deadline the query is cancelled everywhere
(each worker stops at the deadline it was given) and raises :class:`~topology.errors.QueryTimeout`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import msgpack

from conductor.client.errors import ClientError
from conductor.client.retry import Retry
from conductor.client.scan_stream import GroupPages
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import Unavailable
from pstate.packed_page import PackedPage, unpack_pairs
from pstate.path import Path
from pstate.query import encode_navs, path_navs
from replog.errors import NotLeader
from topology.errors import QueryFailed, QueryTimeout
from topology.partitioners import task_for_key
from topology.refs import path_function_ref

if TYPE_CHECKING:
    from conductor.client.cluster import Cluster

#: query requests out at once, per query
MAX_INFLIGHT = 16
#: calls in one request to a group leader
MAX_CALLS_PER_REQUEST = 4096
#: calls one query makes in all (its first ones and every hop)
MAX_CALLS = 1_000_000
#: threads kept to send the requests of a wave that the calling thread does not send itself (:class:`Senders`)
SENDERS = MAX_INFLIGHT - 1


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: its results, and the token that resumes the scan right after it (None: done)."""

    items: list[Any]
    token: bytes | None


def scan_pages(c: Cluster, module: str, pstate: str, task: int | None, start: Any, end: Any,
               path: tuple[Path, ...], page_size: int, resume: bytes | None) -> Iterator[ScanPage]:
    """The pages of a scan (see the module docstring); ``task`` None: every task."""
    if page_size <= 0:
        raise ClientError(f"page_size must be positive, got {page_size}")
    spec = c._module(module).spec
    if task is not None and not 0 <= task < spec.tasks:
        raise ClientError(f"task {task} is outside [0, {spec.tasks}) for module {module}")
    # where each part of the scan is routed: one task, or a task of each group (the worker keeps them all)
    parts = [task] if task is not None else [next(t for t in range(spec.tasks) if spec.group_of(t) == g)
                                             for g in range(spec.threads)]
    turn, afters = 0, [b""] * len(parts)  # (each group's resume point: b"" its start, None done)
    if resume is not None:
        turn, afters = _resume_point(resume, len(parts))
    raw_path = encode_navs(path_navs(Path(), path), path_function_ref) if path else b""
    pack = msgpack.Packer(use_bin_type=True).pack
    bounds = (b"" if start is None else pack(start), b"" if end is None else pack(end))

    def request(t: int) -> Callable[[bytes], pb.ScanRequest]:
        return lambda after: pb.ScanRequest(module=module, pstate=pstate, task=t, all_tasks=task is None,
                                            start=bounds[0], end=bounds[1], after=after, limit=page_size,
                                            path=raw_path, packed=True)

    groups = [GroupPages(c, module, spec.group_of(t), request(t), after or b"") for t, after in zip(parts, afters,
                                                                                                     strict=True)]
    for g, after in zip(groups, afters, strict=True):
        g.done = after is None
    try:
        for g in groups:
            g.open()  # every group's leader reads at once
        while not groups[turn].done:
            reply = groups[turn].next()
            turn = _next_turn(groups, turn)
            token = None if groups[turn].done else pack([turn, [None if g.done else g.after for g in groups]])
            yield ScanPage(_items(reply, bool(path)), token)
    finally:
        for g in groups:
            g.close()


def _next_turn(groups: list[GroupPages], turn: int) -> int:
    """The group whose page comes after ``turn``'s: the next one not done, round the groups (``turn``: all done)."""
    n = len(groups)
    return next(((turn + i) % n for i in range(1, n + 1) if not groups[(turn + i) % n].done), turn)


def _resume_point(token: bytes, parts: int) -> tuple[int, list[Any]]:
    """(the group whose page is next, each group's resume point or None: done) from a :class:`ScanPage` token;
    a token of the page-per-call scans before streams (``[index, after]``: the groups before ``index`` done)
    resumes the same keys."""
    try:
        turn, afters = _unpack(token)
    except (ValueError, TypeError, msgpack.ExtraData):
        raise ClientError("not a scan token (pass a ScanPage.token of the same scan)") from None
    if type(turn) is int and 0 <= turn < parts and isinstance(afters, bytes):
        afters = [None] * turn + [afters] + [b""] * (parts - turn - 1)
    if not (type(turn) is int and 0 <= turn < parts and isinstance(afters, list) and len(afters) == parts
            and all(a is None or isinstance(a, bytes) for a in afters) and afters[turn] is not None):
        raise ClientError("the scan token belongs to another scan (another task, or another module layout)")
    return turn, afters


def _items(reply: pb.ScanReply, path: bool) -> list[Any]:
    """A page's results: packed pairs decoded in C (pstate/packed_page.py), or the msgpack list of items."""
    if reply.packed:
        return unpack_pairs(PackedPage(reply.count, reply.str_keys, reply.keys, reply.values))
    items = _unpack(reply.items)
    return items if path else list(map(tuple, items))  # (pairs as tuples, like select)


def run_query(c: Cluster, module: str, name: str, args: tuple[Any, ...], timeout_s: float) -> Any:
    """``cluster.query``: run query topology ``name`` and return its combined result (see the module docstring)."""
    meta = c._module(module)
    decl = meta.definition.queries.get(name)
    if decl is None:
        raise ClientError(f"module {module} has no query {name!r}; its queries: {sorted(meta.definition.queries)}")
    spec = meta.spec
    if decl.every_task:
        first = [(t, name, list(args)) for t in range(spec.tasks)]
    else:
        if not args:
            raise ClientError(f"query {name} starts on the task owning its first argument: pass one")
        first = [(task_for_key(args[0], spec.tasks), name, list(args))]
    deadline = time.monotonic() + timeout_s
    acc: Any = None
    calls = 0
    queue: list[tuple[int, list[Any]]] = []  # (group, calls)

    def enqueue(more: list[Any]) -> None:
        nonlocal calls
        calls += len(more)
        if calls > MAX_CALLS:
            raise QueryFailed(name, -1, f"more than {MAX_CALLS} calls (hops included) in one query")
        by_group: dict[int, list[Any]] = {}
        for call in more:
            by_group.setdefault(spec.group_of(call[0]), []).append(call)
        for g, cs in by_group.items():
            for i in range(0, len(cs), MAX_CALLS_PER_REQUEST):
                queue.append((g, cs[i:i + MAX_CALLS_PER_REQUEST]))

    enqueue(first)
    while queue:  # a wave: the requests queued (hops included), at most MAX_INFLIGHT, out at once
        wave, queue[:] = queue[:MAX_INFLIGHT], queue[MAX_INFLIGHT:]
        for reply in _wave(c, module, name, wave, deadline, timeout_s):
            acc = decl.combine.combine(acc, _unpack(reply.result))
            hops = _unpack(reply.hops)
            if hops:
                enqueue(hops)
    return acc


def _wave(c: Cluster, module: str, name: str, wave: list[tuple[int, list[Any]]], deadline: float,
          timeout_s: float) -> list[pb.QueryRunReply]:
    """The replies to ``wave``'s requests, all sent at once from this thread (see :class:`_Sent`); past the
    deadline the query raises :class:`QueryTimeout` and cancels what is still out (each worker also stops at
    its deadline)."""
    def request(group: int, cs: list[Any]) -> pb.QueryRunRequest:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise QueryTimeout(name, timeout_s)
        return pb.QueryRunRequest(module=module, group=group, query=name, deadline_ms=left_ms,
                                  calls=msgpack.packb(cs, use_bin_type=True))

    sent: list[_Sent] = []
    try:
        for i, (group, cs) in enumerate(wave):  # the last one in this thread, while the others are out
            sent.append(_Sent(c, module, group, "QueryRun", request(group, cs), deadline - time.monotonic(),
                              lambda group=group, cs=cs: request(group, cs),  # type: ignore[misc]
                              block=i == len(wave) - 1))
        return [s.result() for s in sent]
    finally:
        for s in sent:
            s.cancel()  # (done: nothing; an error or the deadline: nothing of the query stays out)


class Senders:
    """The threads a cluster client keeps to send a wave's requests but its last (at most :data:`SENDERS` at once).

    A blocking call on a kept thread costs the calling thread a wake-up; a gRPC future costs it a new thread
    whenever its channel has no other call out (gRPC's channel thread stops with its last call), which is every
    query's first request: about 170 us of the calling thread's CPU and 150-250 us of a query's 3 ms on the loaded
    reference box (measured alternately on one cluster, issue 31). When every kept thread is busy (many queries
    at once), :meth:`submit` says so and the request goes out as a gRPC future, as before: no request ever waits
    here. A request on a kept thread that its query no longer wants (another failed, the deadline passed) runs on
    to its reply or its deadline (the worker stops it at the deadline either way).
    """

    def __init__(self, n: int = SENDERS) -> None:
        assert n > 0, n
        self._n = n
        self._lock = threading.Lock()
        self._busy = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any] | None:
        """``fn(*args, **kwargs)`` on a kept thread; None when they are all busy (or the client is closed)."""
        with self._lock:
            if self._closed or self._busy >= self._n:
                return None
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self._n, thread_name_prefix="millrace-query-send")
            self._busy += 1
            pool = self._pool
        try:
            fut = pool.submit(fn, *args, **kwargs)
        except RuntimeError:  # (closed meanwhile)
            self._done(None)
            return None
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _fut: Any) -> None:
        with self._lock:
            self._busy -= 1
            assert self._busy >= 0, self._busy

    def close(self) -> None:
        """No more requests; those not started are dropped (their queries have gone: the client is closing)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class _Sent:
    """A request sent from the calling thread on the group leader's blocking stub: on a kept thread
    (:class:`Senders`) or as a gRPC future, or (``block``) answered before the constructor returns, the wave's
    last request.

    Query requests are small calls: a hop to the client's event loop and back costs each more than its reads.
    A request whose first try fails goes through the client's call loop (leader moves, retries, typed errors)
    with ``again()``'s request (a query's carries the time left).
    """

    def __init__(self, c: Cluster, module: str, group: int, method: str, request: Any, timeout_s: float,
                 again: Callable[[], Any], block: bool = False) -> None:
        self._c, self._module, self._group, self._method, self._again = c, module, group, method, again
        self._fut: Any = None
        self._reply: Any = None
        try:
            _, address = c._leader(Retry(c.timeout_s, f"{module}/{group}"), (module, group))
            call = getattr(c._sync_stub(address), method)
            if block:
                self._reply = call(request, timeout=max(0.001, timeout_s))
            else:
                self._fut = (c._senders.submit(call, request, timeout=max(0.001, timeout_s))
                             or call.future(request, timeout=max(0.001, timeout_s)))
        except (grpc.RpcError, Unavailable, NotLeader):  # (asked again in result(), through the call loop)
            pass

    def result(self) -> Any:
        if self._reply is not None:
            return self._reply
        if self._fut is not None:
            try:
                return self._fut.result()
            except grpc.RpcError:
                pass
        return self._c._call_sync(self._module, self._group, self._method, self._again())

    def cancel(self) -> None:
        if self._fut is not None:
            self._fut.cancel()  # (a gRPC future: the call ends; one on a kept thread: only if not started yet)
