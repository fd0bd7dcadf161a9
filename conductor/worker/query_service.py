"""The worker's side of queries: paged scans (``Scan`` a page a call, ``ScanStream`` every page on one server
stream) and query topologies' calls (``QueryRun``).

Both read a group leader's applied state off the event loop, on :data:`MAX_RUNNING` threads of their
own (module code runs there: named ``filter``/``view`` functions and query functions; a request past its
deadline holds its thread until its next read). Both are bounded per call: a page holds at most
``pstate.scan.MAX_PAGE`` results and about :data:`MAX_PAGE_BYTES` of values, whatever the client asks;
a query request holds its calls, hops and partial result (``topology.query`` bounds them) and stops at
its deadline. The services in ``services.py`` delegate here (``ClientService.Scan``/``QueryRun``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from conductor.metastore.module_spec import PATH_VERSION
from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest
from conductor.worker.replica_host import ReplicaHost
from conductor.worker.runtime import Leader, LocalModules
from conductor.worker.scan_prefetch import ScanPrefetch, forget_result
from pstate.errors import PStateError
from pstate.path import Path
from pstate.query import ResolveFn, decode_query
from pstate.store import TaskGroupStore
from topology.code_loader import ALIAS_PREFIX
from topology.errors import QueryFailed, QueryTimeout
from topology.partitioners import task_for_key
from topology.query import Call, OverBudget, QueryRun, run_calls
from topology.refs import module_code_function

#: query requests and scan pages running at once on one worker, and the threads they run on (more wait)
MAX_RUNNING = 4
#: bytes of values one scan page holds at most
MAX_PAGE_BYTES = 4 << 20
#: scan streams reading a page ahead at once on one worker (more read a page at a time)
MAX_AHEAD_STREAMS = 16
#: the CPU time a query request runs inline on the event loop before it is dropped at its next read and run
#: again on the queries' threads: the thread hops cost more than a small request's reads
INLINE_BUDGET_S = 0.002
#: the longest deadline a query request may ask for
MAX_DEADLINE_MS = 10 * 60 * 1000

log = logging.getLogger("millrace.node")
#: a resume point no page has (see ``_page_reader``'s walk)
_NOWHERE = b"\xff" * 16


@dataclass
class _Walk:
    """The pages a scan reader served in order from the start of the whole PState: the resume point of the next
    one (:data:`_NOWHERE` once the reader served anything else) and the keys read so far."""

    after: bytes | None = None
    keys: int = 0


Damage = Callable[[ReplicaHost], contextlib.AbstractContextManager[None]]


def _unpack(raw: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData) as e:
        raise InvalidRequest(what, f"undecodable msgpack: {e}") from None


def resolver(module_ref: str, version: str) -> ResolveFn:
    """Named ``filter``/``view`` functions are looked up in the module's own code only: its top package, in code
    ``version`` (shipped code is imported under an alias package; ``path:`` versions are the worker's path)."""
    package = module_ref.partition(":")[0].split(".")[0]
    alias = None if version.startswith(PATH_VERSION) else ALIAS_PREFIX + version

    def resolve(ref: str) -> Callable[[Any], Any]:
        fn = module_code_function(ref, package, alias)

        def guarded(value: Any) -> Any:  # the app's code failing is the request's typed error, never the worker's
            try:
                return fn(value)
            except Exception as e:
                raise QueryFailed(ref, -1, f"{type(e).__name__}: {e}") from None

        return guarded

    return resolve


class QueryService:
    """Scan pages and query requests on the local group leaders (``modules``); ``damage`` reports a damaged read."""

    def __init__(self, modules: LocalModules, damage: Damage) -> None:
        self.modules = modules
        self.damage = damage
        self._slots: asyncio.Semaphore | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(MAX_RUNNING, thread_name_prefix="millrace-query")
        self._lock = threading.Lock()
        self._prefetch = ScanPrefetch()
        #: scan streams reading ahead now (at most MAX_AHEAD_STREAMS)
        self.ahead_streams = 0
        #: query requests whose thread is still running (a request past its deadline stops at its next read)
        self.running = 0

    def resolve_fn(self, module: str) -> ResolveFn | None:
        """How the worker finds the named functions of ``module``'s paths (None: the module is not open here)."""
        rt = self.modules.get(module)
        return resolver(rt.spec.module_ref, rt.spec.version) if rt is not None else None

    def _leader(self, module: str, task: int) -> Leader:
        rt = self.modules.get(module)
        if rt is not None and not 0 <= task < rt.spec.tasks:
            raise ValueError(f"task {task} is outside [0, {rt.spec.tasks}) for module {module}")
        return self.modules.leader(module, rt.spec.group_of(task) if rt is not None else 0)

    async def _in_thread(self, fn: Callable[[], Any]) -> Any:
        """``fn`` on the queries' own threads (never the loop's default executor, which the worker's ZooKeeper
        reads and far-horizon copies need): at most MAX_RUNNING run at once, even past their deadlines."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_RUNNING)
        async with self._slots:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _page_reader(self, request: pb.ScanRequest) -> Callable[[bytes | None], pb.ScanReply]:
        """What reads ``request``'s pages (on the queries' threads): ``read(after)`` is the page after ``after``.
        Each page asks for the group's local leader again (NotLeader once it moved: the client follows it)."""
        leader = self._leader(request.module, request.task)
        spec = leader.spec
        code = leader.store.code
        version = code.applied if code is not None else spec.version
        path = decode_query(request.path, resolver(spec.module_ref, version)) if request.path else Path()
        start = _unpack(request.start, "start") if request.start else None
        end = _unpack(request.end, "end") if request.end else None
        task, tasks = request.task, spec.tasks

        def keep(k: Any) -> bool:  # the group's store holds the keys of all its tasks
            return task_for_key(k, tasks) == task

        limit = max(1, request.limit or 1000)
        max_bytes = min(MAX_PAGE_BYTES, request.max_bytes or MAX_PAGE_BYTES)
        task_keep = None if request.all_tasks else keep
        walked = _Walk()

        def walk(after: bytes | None, page_after: bytes | None, scanned: int, now: Leader, store: TaskGroupStore) -> None:
            """A scan of the whole PState, page after page, reports its keys at its end (pstate.hidden_versions)."""
            if start is not None or end is not None or after != walked.after:
                walked.after = _NOWHERE  # (not a walk from the start: this reader reports nothing)
                return
            walked.after, walked.keys = page_after, (walked.keys if after else 0) + scanned
            if page_after is None and store.scanned_whole(request.pstate, walked.keys):
                self._flush_for_scans(now.host, store)

        def page(after: bytes | None) -> pb.ScanReply:
            now = self._leader(request.module, request.task)  # (still this worker's to serve)
            store = now.store.current()
            with self.damage(now.host):
                applied = max(store.applied_offset, 0)
                view = store.pstate(request.pstate)
                if request.packed and not path.navs:  # values as stored, keys unparsed: no decoding here
                    pp = view.packed_scan_page(start, end, after, limit, max_bytes, task_keep)
                    if pp is not None:
                        walk(after, pp.after, pp.scanned, now, store)
                        d = pp.pairs
                        return pb.ScanReply(after=pp.after or b"", done=pp.after is None, applied_offset=applied,
                                            packed=True, count=d.count, str_keys=d.str_keys, keys=d.keys,
                                            values=d.values)
                p = view.scan_page(start, end, after, limit, max_bytes, task_keep, path.navs)
                walk(after, p.after, p.scanned, now, store)
                items = msgpack.packb(p.items, use_bin_type=True)
            return pb.ScanReply(items=items, after=p.after or b"", done=p.after is None, applied_offset=applied)

        return page

    async def scan(self, request: pb.ScanRequest) -> pb.ScanReply:
        """One page (``Scan``); the next one of a packed scan is read ahead (:class:`ScanPrefetch`)."""
        page = self._page_reader(request)

        async def read(after: bytes) -> pb.ScanReply:
            reply: pb.ScanReply = await self._in_thread(lambda: page(after or None))
            return reply

        return await self._prefetch.page(request, read)

    async def scan_stream(self, request: pb.ScanRequest) -> AsyncIterator[pb.ScanReply]:
        """Every page from ``request.after`` to the range's end (``ScanStream``), each read while the one before
        is on its way: a stream holds two pages at most, and gRPC's flow control stops it while the client does
        not read (the send waits). Past :data:`MAX_AHEAD_STREAMS` streams reading ahead at once on this worker, a
        stream reads a page once the one before is sent (one page held, as a ``Scan`` call)."""
        page = self._page_reader(request)
        ahead_ok = self.ahead_streams < MAX_AHEAD_STREAMS
        self.ahead_streams += ahead_ok  # (the event loop's own count: no lock)
        after: bytes | None = request.after or None
        try:
            ahead = asyncio.ensure_future(self._in_thread(lambda a=after: page(a)))  # type: ignore[misc]
            try:
                while True:
                    reply: pb.ScanReply = await ahead
                    if reply.done:
                        yield reply
                        return
                    after = reply.after
                    if ahead_ok:  # the next page read while this one is sent
                        ahead = asyncio.ensure_future(self._in_thread(lambda a=after: page(a)))  # type: ignore[misc]
                        yield reply
                    else:
                        yield reply
                        ahead = asyncio.ensure_future(self._in_thread(lambda a=after: page(a)))  # type: ignore[misc]
            finally:
                ahead.cancel()  # (the client went away: a page waiting for a thread never runs)
                ahead.add_done_callback(forget_result)
        finally:
            self.ahead_streams -= ahead_ok

    async def run(self, request: pb.QueryRunRequest) -> pb.QueryRunReply:
        leader = self.modules.leader(request.module, request.group)
        spec = leader.spec
        code = leader.store.code
        assert code is not None, request.module  # (a leader's store has its code versions)
        definition = code.module.get(code.applied)  # the code of the applied state
        calls = _calls(_unpack(request.calls, "calls"), spec.group_of, request.group)
        timeout_s = min(request.deadline_ms or MAX_DEADLINE_MS, MAX_DEADLINE_MS) / 1000
        deadline = time.monotonic() + timeout_s
        run = QueryRun(definition, leader.store.current(), spec.tasks, spec.threads, request.group, request.query,
                       deadline, timeout_s)

        def calls_in_thread() -> tuple[Any, list[Call]]:
            with self._lock:
                self.running += 1
            try:
                with self.damage(leader.host):
                    return run_calls(run, calls)
            finally:
                with self._lock:
                    self.running -= 1

        inline = QueryRun(definition, leader.store.current(), spec.tasks, spec.threads, request.group, request.query,
                          deadline, timeout_s, INLINE_BUDGET_S)
        try:
            with self.damage(leader.host):
                result, hops = run_calls(inline, calls)
        except OverBudget:  # a bigger request: again from the start, on the queries' threads
            try:
                result, hops = await asyncio.wait_for(self._in_thread(calls_in_thread), timeout_s)
            except TimeoutError:  # (waiting for a slot, or computing: the thread stops at its next read)
                raise QueryTimeout(request.query, timeout_s) from None
        if inline.flush_due or run.flush_due:
            self._flush_for_scans(leader.host, inline.store)
        try:
            packed = msgpack.packb(result, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"query {request.query}: its result cannot be sent ({e}); return plain values") from None
        with self._lock:
            running = self.running
        return pb.QueryRunReply(result=packed, hops=msgpack.packb(hops, use_bin_type=True), running=running)

    def _flush_for_scans(self, host: ReplicaHost, store: TaskGroupStore) -> None:
        """Flush ``store``'s memtables on a query thread (a checkpoint of every column family: milliseconds, and
        never on the event loop), once the old versions its scans stepped over cost as much
        (:mod:`pstate.hidden_versions`). Not the request's business: it has its result, and a flush that fails
        is logged (a store that cannot flush fails its next write, and the replica stops then)."""

        def flush() -> None:
            try:
                with self.damage(host):
                    store.flush_for_scans()
            except PStateError as e:  # (closed under us: a far-horizon install, a fault, the worker stopping)
                log.warning("%s: a flush for scans failed: %s", host.name, e)

        self._pool.submit(flush)


def _calls(raw: Any, group_of: Callable[[int], int], group: int) -> list[Call]:
    """The request's calls, checked: each ``[task, name, [args]]`` with a task of ``group``."""
    if not isinstance(raw, list):
        raise InvalidRequest("calls", "expected a list of [task, query, [args]]")
    out: list[Call] = []
    for c in raw:
        if not (isinstance(c, list) and len(c) == 3 and type(c[0]) is int and isinstance(c[1], str)
                and isinstance(c[2], list)):
            raise InvalidRequest("calls", f"bad call {c!r:.80}; expected [task, query, [args]]")
        if group_of(c[0]) != group:
            raise ValueError(f"a query call for task {c[0]} was sent to group {group}; route by task")
        out.append((c[0], c[1], c[2]))
    return out

