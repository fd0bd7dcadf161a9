"""The Python client: append to depots and query PStates of a running Millrace cluster.

    cluster = Cluster.connect("127.0.0.1:2181")
    cluster.depot("WordCount", "*sentences").append("the cat sat", ack="applied")
    cluster.pstate("WordCount", "$$counts").select_one("cat")

The client reads module metadata from ZooKeeper (never data), routes each record
with the depot's own partitioner to the leader of the task group that owns its
task, and refreshes metadata and retries when a leader moves (``NotLeader``) or a
node is unreachable. A metastore watch abandons calls in flight to a leader
that lost its leadership (it is fenced and would never answer) and retries them
on the new one.

Python pays per object and per gRPC message, so the hot paths avoid both:

* blocking calls (``append``, reads, queries) are synchronous gRPC calls made
  in the calling thread (about half the latency of a ``grpc.aio`` call driven
  through another thread's event loop);
* ``append`` sends its request on a long-lived ``AppendStream`` per group
  leader (:class:`_SyncAppendStream`) rather than as a unary call: a message on
  an open stream costs the node about a third of the CPU of a unary RPC (no call
  set-up, task, metadata or status) and the round trip about half;
* ``append_many`` encodes and routes in the calling thread, builds one request
  per task group (split at ``max_batch_records``, two in flight per group) and
  crosses to the event loop once per call, not once per record;
* ``append_async`` queues records in a thread-safe deque and wakes the event
  loop once per burst; the loop frames every record waiting for the same group
  into one request while ``max_inflight_per_group`` requests are out, and sends
  them on an ``AppendStream`` per group leader (:class:`_AioAppendStream`).

Leader addresses are cached and looked up again only after ``NotLeader``,
``Unavailable`` or a leader change seen by the watch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import msgpack

from conductor.metastore import GroupState, Metastore, MetastoreError
from conductor.metastore.module_spec import ModuleSpec
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import MillraceError, Unavailable, error_from_json, error_from_rpc
from conductor.wire.options import GRPC_OPTIONS
from replog.errors import Backpressure, NotLeader, StalledGroup
from topology.module import ModuleDefinition, load_module
from topology.partitioners import task_for_key

log = logging.getLogger("millrace.client")

ACKS = {"none": pb.ACK_NONE, "append": pb.ACK_APPEND, "applied": pb.ACK_APPLIED}


class ClientError(MillraceError):
    """Bad use of the client (unknown module, depot or ack level); the message says what exists."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_ARGUMENT", message)


def _ack(ack: str) -> int:
    try:
        return ACKS[ack]
    except KeyError:
        raise ClientError(f"ack must be one of {sorted(ACKS)}, got {ack!r}") from None


@dataclass(frozen=True)
class PartitionStatus:
    """A depot partition as its leader sees it: records in [start, end) are applied; `epoch` is the leader's."""

    start: int
    end: int
    epoch: int


@dataclass(frozen=True)
class DepotBatch:
    """Records [start, next) of one partition, read from the leader of `epoch` (KIP-320 style checks)."""

    records: list[Any]
    start: int
    next: int
    epoch: int


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    tasks: int
    groups: int
    depots: list[str]
    pstates: list[str]


@dataclass
class _ModuleMeta:
    spec: ModuleSpec
    definition: ModuleDefinition
    groups: dict[int, GroupState]
    fetched: float = field(default_factory=time.monotonic)


class Cluster:
    """A connection to one Millrace cluster (through its ZooKeeper)."""

    def __init__(self, zk_hosts: str, *, timeout_s: float = 45.0, linger_ms: float = 0.0,
                 max_batch_records: int = 10_000, max_inflight_per_group: int = 8) -> None:
        self.zk_hosts = zk_hosts
        self.timeout_s = timeout_s
        self.linger_ms = linger_ms
        self.max_batch_records = max_batch_records
        self.max_inflight_per_group = max_inflight_per_group
        self._ms = Metastore(zk_hosts, session_timeout=10.0)
        self._meta: dict[str, _ModuleMeta] = {}
        self._meta_lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="millrace-client", daemon=True)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sync_channels: dict[str, grpc.Channel] = {}
        #: guards the sync channels and the registry of calls in flight (any thread)
        self._calls_lock = threading.Lock()
        #: per group: bumped by every leader change the watch sees
        self._generation: dict[tuple[str, int], int] = defaultdict(int)
        #: per group: calls in flight to its leader (aio calls and sync futures), to abandon on a move
        self._inflight: dict[tuple[str, int], set[Any]] = defaultdict(set)
        #: calls the watch cancelled because their group's leader moved
        self._abandoned: set[int] = set()
        self._batchers: dict[tuple[str, int], _GroupBatcher] = {}
        #: append_async hand-off to the event loop: filled by any thread, drained once per burst
        self._queued: deque[tuple[str, int, int, str, int, bytes, concurrent.futures.Future[int]]] = deque()
        self._queued_lock = threading.Lock()
        self._drain_scheduled = False
        #: blocking appends: one AppendStream per (leader address, module, group), see _SyncAppendStream
        self._append_streams: dict[tuple[str, str, int], _SyncAppendStream] = {}
        #: append_async's requests: one AppendStream per (leader address, module, group), event loop only
        self._aio_streams: dict[tuple[str, str, int], _AioAppendStream] = {}
        self._watchdog: threading.Thread | None = None
        self._closed = False

    @classmethod
    def connect(cls, zk_hosts: str, **kwargs: Any) -> Cluster:
        """Connect to the cluster whose ZooKeeper is at `zk_hosts` ("host:port")."""
        c = cls(zk_hosts, **kwargs)
        try:
            c._ms.start()
        except MetastoreError as e:
            raise Unavailable("UNAVAILABLE", f"cannot reach ZooKeeper at {zk_hosts}: {e}") from e
        c._thread.start()
        return c

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            for ch in self._channels.values():
                await ch.close(grace=None)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        with self._calls_lock:
            channels = list(self._sync_channels.values())
            self._sync_channels.clear()
            streams = list(self._append_streams.values())
            self._append_streams.clear()
        for stream in streams:
            stream.cancel()
        for sch in channels:
            sch.close()
        self._ms.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def depot(self, module: str, name: str) -> Depot:
        meta = self._module(module)
        if name not in meta.definition.depots:
            raise ClientError(f"module {module} has no depot {name!r}; its depots: {meta.definition.depot_names()}")
        return Depot(self, module, name)

    def pstate(self, module: str, name: str) -> PState:
        meta = self._module(module)
        if name not in meta.definition.pstates:
            raise ClientError(f"module {module} has no PState {name!r}; its PStates: {meta.definition.pstate_names()}")
        return PState(self, module, name)

    def modules(self) -> list[str]:
        return self._ms.list_modules()

    def module_info(self, module: str) -> ModuleInfo:
        meta = self._module(module)
        return ModuleInfo(module, meta.spec.tasks, meta.spec.threads, meta.definition.depot_names(),
                          meta.definition.pstate_names())

    def module_definition(self, module: str) -> ModuleDefinition:
        """What the deployed module's code declares (loaded by its reference, as workers do)."""
        return self._module(module).definition

    def call_group(self, module: str, group: int, method: str, request: Any) -> concurrent.futures.Future[Any]:
        """One `Client` RPC to the leader of `group`, following leader moves; for framework code (Spark)."""
        fut: concurrent.futures.Future[Any] = self._run(self._call(module, group, method, request))
        return fut

    # ------------------------------------------------------------------------------ metadata

    def _module(self, module: str, refresh: bool = False) -> _ModuleMeta:
        meta = self._meta.get(module)  # a dict read is atomic; writers hold the lock
        if meta is not None and not refresh:
            return meta
        try:
            spec, _ = self._ms.get_module(module)
            groups = {g: st for g, (st, _v) in self._ms.list_groups(module).items()}
        except MetastoreError as e:
            known = self._ms.list_modules()
            raise ClientError(f"module {module!r} is not deployed ({e}); deployed modules: {known}") from e
        first = meta is None
        definition = meta.definition if meta is not None else load_module(spec.module_ref).build()
        meta = _ModuleMeta(spec, definition, groups)
        with self._meta_lock:
            self._meta[module] = meta
        if first:
            for g in groups:
                self._ms.watch_group(module, g, functools.partial(self._on_group, module, g))
        return meta

    def _on_group(self, module: str, group: int, st: GroupState | None, _version: int) -> None:
        """Metastore watch: a leader change abandons in-flight calls to the old leader at once."""
        with self._meta_lock:
            meta = self._meta.get(module)
            if meta is None or st is None:
                return
            old = meta.groups.get(group)
            meta.groups[group] = st
        if old is None or (old.leader, old.epoch) != (st.leader, st.epoch):
            self._abandon(module, group)

    def _abandon(self, module: str, group: int) -> None:
        """Cancel every call in flight to `group`'s leader; their callers retry on the new leader.

        The old leader can no longer apply them (the new epoch fences it), and a
        SIGSTOPped or partitioned one would never answer. Delivery stays
        at-least-once, like Kafka's: an abandoned append may still have landed.
        Thread-safe: gRPC calls and futures may be cancelled from any thread.
        """
        key = (module, group)
        with self._calls_lock:
            self._generation[key] += 1
            calls = list(self._inflight.get(key, ()))
            self._abandoned.update(id(c) for c in calls)
        for call in calls:
            if isinstance(call, grpc.aio.Call):  # aio calls belong to the event loop
                try:
                    self._loop.call_soon_threadsafe(call.cancel)
                except RuntimeError:  # the loop is closed: so is the client
                    pass
            else:
                call.cancel()

    def _track(self, key: tuple[str, int], call: Any, generation: int) -> None:
        """Register `call` for abandonment; cancel it at once if the leader moved since `generation`."""
        with self._calls_lock:
            self._inflight[key].add(call)
            moved = self._generation[key] != generation
            if moved:
                self._abandoned.add(id(call))
        if moved:
            call.cancel()

    def _untrack(self, key: tuple[str, int], call: Any) -> bool:
        """Forget `call`; True if the watch abandoned it."""
        with self._calls_lock:
            self._inflight[key].discard(call)
            if id(call) in self._abandoned:
                self._abandoned.discard(id(call))
                return True
            return False

    @contextlib.contextmanager
    def _watching(self, key: tuple[str, int], call: Any, generation: int,
                  moved: tuple[type[BaseException], ...]) -> Iterator[None]:
        """Wait for `call` inside the block while a leader move may abandon it.

        A `moved` exception from an abandoned call becomes NotLeader (ask the new
        leader); from a call nobody abandoned it is the call's own failure. A
        plain ``with`` serves blocking and awaited waits alike.
        """
        self._track(key, call, generation)
        try:
            yield
        except moved:
            if not self._untrack(key, call):
                raise
            raise NotLeader(f"{key[0]}/{key[1]}", None, None) from None
        except BaseException:
            self._untrack(key, call)
            raise
        self._untrack(key, call)

    def _cached_address(self, module: str, group: int) -> str | None:
        """The group leader's address if metadata and the node's address are cached (never blocks)."""
        meta = self._meta.get(module)
        if meta is None:
            return None
        st = meta.groups.get(group)
        if st is None or st.leader is None:
            return None
        return self._addresses.get(st.leader)

    def _leader_address(self, module: str, group: int, refresh: bool = False) -> str:
        meta = self._module(module, refresh)
        st = meta.groups[group]
        if st.leader is None:
            meta = self._module(module, True)
            st = meta.groups[group]
            if st.leader is None:
                raise Unavailable("UNAVAILABLE", f"task group {module}/{group} has no leader: no in-sync replica "
                                  f"of {list(st.isr)} is live; it resumes when one returns (see `conductor status`)")
        addr = None if refresh else self._addresses.get(st.leader)
        if addr is None:
            info = self._ms.get_node(st.leader)
            if info is None:
                raise Unavailable("UNAVAILABLE", f"leader {st.leader} of {module}/{group} is not registered")
            addr = self._addresses[st.leader] = info.address
        return addr

    def _stub(self, address: str) -> pbg.ClientStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
        return pbg.ClientStub(ch)

    def _sync_stub(self, address: str) -> pbg.ClientStub:
        with self._calls_lock:
            if self._closed:
                raise ClientError("the cluster client is closed")
            ch = self._sync_channels.get(address)
            if ch is None:
                ch = self._sync_channels[address] = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        return pbg.ClientStub(ch)

    def _run(self, coro: Any) -> Any:
        if self._closed:
            coro.close()
            raise ClientError("the cluster client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _call(self, module: str, group: int, method: str, request: Any) -> Any:
        """One RPC to the group leader on the event loop, following leader moves until `timeout_s`."""
        r = _Retry(self, module, group)
        while True:
            try:
                generation, address = await r.leader_aio()
                call = getattr(self._stub(address), method)(request, timeout=r.remaining())
                with self._watching(r.key, call, generation, (asyncio.CancelledError, grpc.RpcError)):
                    return await call
            except (grpc.RpcError, Unavailable, NotLeader) as e:
                err: Exception = e
            await asyncio.sleep(r.backoff(err))

    def _call_sync(self, module: str, group: int, method: str, request: Any) -> Any:
        """The same as :meth:`_call` as a synchronous gRPC call in the calling thread (blocking APIs)."""
        if self._closed:
            raise ClientError("the cluster client is closed")
        r = _Retry(self, module, group)
        while True:
            try:
                generation, address = r.leader()
                fut = getattr(self._sync_stub(address), method).future(request, timeout=r.remaining())
                with self._watching(r.key, fut, generation, (grpc.FutureCancelledError, grpc.RpcError)):
                    return fut.result()
            except (grpc.RpcError, Unavailable, NotLeader) as e:
                err: Exception = e
            time.sleep(r.backoff(err))

    def _append_stream(self, address: str, module: str, group: int) -> _SyncAppendStream:
        key = (address, module, group)
        stream = self._append_streams.get(key)
        if stream is not None and not stream.broken:
            return stream
        channel = self._sync_stub(address)  # creates the channel (and checks the client is open)
        del channel
        with self._calls_lock:
            stream = self._append_streams.get(key)
            if stream is None or stream.broken:
                stream = self._append_streams[key] = _SyncAppendStream(self._sync_channels[address])
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._expire_streams, name="millrace-client-deadlines",
                                                  daemon=True)
                self._watchdog.start()
        return stream

    def _expire_streams(self) -> None:
        """Fail blocking appends that outlive their deadline (a stream read cannot time out by itself)."""
        while not self._closed:
            time.sleep(_DEADLINE_CHECK_S)
            with self._calls_lock:
                streams = list(self._append_streams.values())
            now = time.monotonic()
            for stream in streams:
                stream.expire(now)

    def _append_sync(self, module: str, group: int, request: pb.AppendRequest) -> pb.AppendReply:
        """`_call_sync(..., "Append", request)` on the group leader's AppendStream: same retries and abandonment."""
        if self._closed:
            raise ClientError("the cluster client is closed")
        r = _Retry(self, module, group)
        while True:
            try:
                generation, address = r.leader()
                stream = self._append_stream(address, module, group)
                ticket = _StreamTicket(stream)  # one per request: abandonment is per request, cancelling the stream
                with self._watching(r.key, ticket, generation, (grpc.RpcError,)):
                    reply = stream.request(request, r.deadline)
                return _checked(reply)
            except (grpc.RpcError, Unavailable, NotLeader) as e:
                err: Exception = e
            time.sleep(r.backoff(err))

    async def _append_aio(self, module: str, group: int, request: pb.AppendRequest) -> pb.AppendReply:
        """Event loop: `_call(..., "Append", request)` on the leader's AppendStream; same retries and abandonment."""
        r = _Retry(self, module, group)
        while True:
            try:
                generation, address = await r.leader_aio()
                skey = (address, module, group)
                stream = self._aio_streams.get(skey)
                if stream is None or stream.broken is not None:
                    stream = self._aio_streams[skey] = _AioAppendStream(self._stub(address))
                ticket = _AioStreamTicket(self._loop, stream)
                with self._watching(r.key, ticket, generation, (asyncio.CancelledError, grpc.RpcError)):
                    try:
                        reply = await asyncio.wait_for(stream.request(request), r.remaining())
                    except TimeoutError:
                        stream.cancel()  # a reply may never come on it: the next request opens another
                        raise Unavailable("DEADLINE_EXCEEDED", "no reply before the client's timeout") from None
                return _checked(reply)
            except (grpc.RpcError, Unavailable, NotLeader) as e:
                err: Exception = e
            await asyncio.sleep(r.backoff(err))

    # ------------------------------------------------------------------------ append_async hand-off

    def _enqueue(self, item: tuple[str, int, int, str, int, bytes, concurrent.futures.Future[int]]) -> None:
        """Any thread: queue one record for the event loop, waking it only if it was not already due."""
        if self._closed:
            raise ClientError("the cluster client is closed")
        with self._queued_lock:
            self._queued.append(item)
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """Event loop: hand every queued record to its group's batcher."""
        with self._queued_lock:
            items = self._queued
            self._queued = deque()
            self._drain_scheduled = False
        batchers = self._batchers
        for module, group, ack, depot, task, data, fut in items:
            b = batchers.get((module, group))
            if b is None:
                b = batchers[(module, group)] = _GroupBatcher(self, module, group)
            b.add(ack, depot, task, data, fut)


class _Retry:
    """One client call's retry budget: its deadline, whether to refresh the leader, and the backoff.

    The blocking and the event-loop call loops both drive it and differ only
    in how they wait.
    """

    __slots__ = ("c", "deadline", "delay", "key", "refresh")

    def __init__(self, c: Cluster, module: str, group: int) -> None:
        self.c = c
        self.key = (module, group)
        self.deadline = time.monotonic() + c.timeout_s
        self.refresh = False
        self.delay = 0.02

    def _target(self) -> tuple[int, str | None]:
        """The leader-move generation to watch, and the leader's address if cached (never blocks)."""
        generation = self.c._generation[self.key]
        return generation, None if self.refresh else self.c._cached_address(*self.key)

    def leader(self) -> tuple[int, str]:
        """The generation to watch and the leader's address, from ZooKeeper if not cached (blocks)."""
        generation, address = self._target()
        return generation, address or self.c._leader_address(*self.key, self.refresh)

    async def leader_aio(self) -> tuple[int, str]:
        """:meth:`leader` on the event loop (a ZooKeeper read goes to a thread)."""
        generation, address = self._target()
        if address is None:
            address = await asyncio.to_thread(self.c._leader_address, *self.key, self.refresh)
        return generation, address

    def remaining(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def backoff(self, exc: Exception) -> float:
        """After a failed try: raise what is not worth another, else the seconds to wait before it.

        Worth another: a moved or unreachable leader, with time left. StalledGroup
        is not retried: the leader already waited the append timeout for its ISR.
        """
        err = error_from_rpc(exc) if isinstance(exc, grpc.RpcError) else exc
        if not isinstance(err, NotLeader | Unavailable) or time.monotonic() + self.delay > self.deadline:
            raise err
        log.debug("%s/%s: %s; refreshing metadata and retrying", *self.key, err)
        self.refresh = True
        delay, self.delay = self.delay, min(0.5, self.delay * 2)
        return delay


def _checked(reply: pb.AppendReply) -> pb.AppendReply:
    """An AppendStream reply, or the error it carries (streams answer errors in-band)."""
    if reply.error:
        raise error_from_json(reply.error)
    return reply


#: how often the client looks for blocking appends past their deadline
_DEADLINE_CHECK_S = 0.5


class _StreamExpired(grpc.RpcError):  # type: ignore[misc]
    """A blocking append outlived its deadline on a stream (the stream is cancelled)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "no reply before the client's timeout"


class _StreamBroken(grpc.RpcError):  # type: ignore[misc]
    """An append stream ended or finished under a request (the node closed it, or it was cancelled).

    UNAVAILABLE, so the requests that shared it are retried like after any broken connection:
    cancelling a stream for one request (its deadline, or its leader moved) must not fail the others.
    """

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the append stream ended"


class _SyncAppendStream:
    """One ``AppendStream`` to a group leader, shared by every thread making blocking appends to it.

    Replies come back in request order, matched by ``seq``. There is no reader
    thread: a waiting caller reads replies itself (one at a time), hands others'
    replies to them and stops at its own, so a lone caller pays no thread
    hand-off. (gRPC's request-iterator thread still carries each request out.)
    A broken or cancelled stream fails every request waiting on it with the
    ``grpc.RpcError``; the client then opens a new one. The client's abandonment
    on a leader move and the deadline watchdog both cancel the whole stream,
    which only ever carries one group's requests to one leader.
    """

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.SimpleQueue[pb.AppendRequest | None] = queue.SimpleQueue()
        self._call = pbg.ClientStub(channel).AppendStream(iter(self._requests.get, None))
        self._cond = threading.Condition(threading.Lock())
        #: seq -> [reply or exception, deadline]; present while the request waits
        self._waiting: dict[int, list[Any]] = {}
        self._seq = 0
        self._reading = False
        self.broken: BaseException | None = None

    def request(self, req: pb.AppendRequest, deadline: float) -> pb.AppendReply:
        cond = self._cond
        with cond:
            if self.broken is not None:
                raise self.broken
            self._seq += 1
            seq = self._seq
            slot: list[Any] = [None, deadline]
            self._waiting[seq] = slot
        req.seq = seq
        self._requests.put(req)
        with cond:
            while seq in self._waiting:
                if self._reading:
                    cond.wait()
                    continue
                self._reading = True
                cond.release()
                try:
                    reply: Any = next(self._call)
                except StopIteration:
                    reply = _StreamBroken()  # the node ended the stream
                except grpc.RpcError as e:
                    reply = e
                finally:
                    cond.acquire()
                    self._reading = False
                if isinstance(reply, BaseException):
                    self._fail_locked(reply)
                else:
                    w = self._waiting.pop(reply.seq, None)
                    if w is not None:
                        w[0] = reply
                cond.notify_all()
        result = slot[0]
        if isinstance(result, BaseException):
            raise result
        reply_out: pb.AppendReply = result
        return reply_out

    def _fail_locked(self, err: BaseException) -> None:
        if self.broken is None:
            self.broken = err
        for w in self._waiting.values():
            w[0] = err
        self._waiting.clear()

    def cancel(self, err: BaseException | None = None) -> None:
        """Fail every request waiting here and end the stream (any thread)."""
        with self._cond:
            self._fail_locked(err if err is not None else _StreamBroken())
            self._cond.notify_all()
        self._call.cancel()
        self._requests.put(None)

    def expire(self, now: float) -> None:
        with self._cond:
            late = any(w[1] <= now for w in self._waiting.values())
        if late:
            self.cancel(_StreamExpired())


class _StreamTicket:
    """One blocking append on a shared stream, as the abandonment registry sees it."""

    __slots__ = ("stream",)

    def __init__(self, stream: _SyncAppendStream) -> None:
        self.stream = stream

    def cancel(self) -> None:
        self.stream.cancel()


class _AioAppendStream:
    """append_async's requests to one group leader on one ``AppendStream`` (event loop only).

    A message on an open stream costs the node about a third of the CPU of a
    unary RPC. Replies are matched by ``seq``; a broken or cancelled stream
    fails every request waiting on it with the ``grpc.RpcError`` (the client
    then opens a new one).
    """

    def __init__(self, stub: pbg.ClientStub) -> None:
        self.call = stub.AppendStream()
        self.waiting: dict[int, asyncio.Future[pb.AppendReply]] = {}
        self.seq = 0
        self.broken: BaseException | None = None
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.ensure_future(self._read())

    async def request(self, req: pb.AppendRequest) -> pb.AppendReply:
        if self.broken is not None:
            raise self.broken
        self.seq += 1
        seq = req.seq = self.seq
        fut: asyncio.Future[pb.AppendReply] = asyncio.get_running_loop().create_future()
        self.waiting[seq] = fut
        try:
            async with self._write_lock:
                try:
                    await self.call.write(req)
                except asyncio.InvalidStateError:  # the call finished before the reader noticed
                    self._fail(_StreamBroken())
                    raise self.broken from None  # type: ignore[misc]
            return await fut
        finally:
            self.waiting.pop(seq, None)

    async def _read(self) -> None:
        err: BaseException
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    err = _StreamBroken()
                    break
                fut = self.waiting.pop(reply.seq, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except asyncio.CancelledError:
            err = _StreamBroken()
        except grpc.RpcError as e:
            err = e
        self._fail(err)

    def _fail(self, err: BaseException) -> None:
        if self.broken is None:
            self.broken = err
        waiting, self.waiting = self.waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(err)

    def cancel(self) -> None:
        self._fail(_StreamBroken())
        self.call.cancel()


class _AioStreamTicket:
    """One append_async request on a shared stream, as the abandonment registry sees it (any thread)."""

    __slots__ = ("loop", "stream")

    def __init__(self, loop: asyncio.AbstractEventLoop, stream: _AioAppendStream) -> None:
        self.loop = loop
        self.stream = stream

    def cancel(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.stream.cancel)
        except RuntimeError:  # the loop is closed: so is the client
            pass


def _encode(record: Any) -> bytes:
    try:
        raw: bytes = msgpack.packb(record, use_bin_type=True)
        return raw
    except TypeError as e:
        raise ClientError(f"record {record!r} cannot be encoded: use str, int, float, bytes, bool, None, "
                          f"lists, tuples and dicts of those ({e})") from None


def _set_result(fut: concurrent.futures.Future[int], value: int) -> None:
    try:
        fut.set_result(value)
    except concurrent.futures.InvalidStateError:  # cancelled by its owner
        pass


def _set_exception(fut: concurrent.futures.Future[int], exc: BaseException) -> None:
    try:
        fut.set_exception(exc)
    except concurrent.futures.InvalidStateError:
        pass


_Item = tuple[str, int, bytes, concurrent.futures.Future[int]]


class _GroupBatcher:
    """Frames the records waiting for one task group into as few requests as possible (event loop only).

    A request goes out at once when fewer than `max_inflight_per_group` are in
    flight; otherwise records wait and leave together with the next free slot,
    so batching grows exactly when the group is busy and costs no latency when
    it is idle (optionally plus `linger_ms`).
    """

    def __init__(self, cluster: Cluster, module: str, group: int) -> None:
        self.c = cluster
        self.module = module
        self.group = group
        self.waiting: dict[int, list[_Item]] = {}
        self.inflight = 0
        self.scheduled = False
        self.tasks: set[asyncio.Future[None]] = set()

    def add(self, ack: int, depot: str, task: int, data: bytes, fut: concurrent.futures.Future[int]) -> None:
        w = self.waiting.get(ack)
        if w is None:
            w = self.waiting[ack] = []
        w.append((depot, task, data, fut))
        if not self.scheduled:
            self.scheduled = True
            if self.c.linger_ms > 0:
                self.c._loop.call_later(self.c.linger_ms / 1000, self._pump)
            else:
                self.c._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self.scheduled = False
        limit = self.c.max_batch_records
        while self.waiting and self.inflight < self.c.max_inflight_per_group:
            ack = next(iter(self.waiting))
            items = self.waiting[ack]
            if len(items) > limit:
                self.waiting[ack] = items[limit:]
                items = items[:limit]
            else:
                del self.waiting[ack]
            self.inflight += 1
            task = asyncio.ensure_future(self._send(ack, items))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _send(self, ack: int, items: list[_Item]) -> None:
        by_part: dict[tuple[str, int], list[_Item]] = {}
        for it in items:
            part = (it[0], it[1])
            lst = by_part.get(part)
            if lst is None:
                lst = by_part[part] = []
            lst.append(it)
        parts = list(by_part.items())
        req = pb.AppendRequest(module=self.module, group=self.group, ack=ack, appends=[  # type: ignore[arg-type]
            pb.DepotRecords(depot=d, task=t, records=[it[2] for it in its]) for (d, t), its in parts])
        try:
            reply = await self.c._append_aio(self.module, self.group, req)
            firsts = list(reply.first_offsets)
            for n, (_key, its) in enumerate(parts):
                base = firsts[n] if n < len(firsts) else None
                for k, it in enumerate(its):
                    _set_result(it[3], base + k if base is not None else -1)
        except Exception as e:
            for it in items:
                _set_exception(it[3], e)
        finally:
            self.inflight -= 1
            if self.waiting and not self.scheduled:
                self.scheduled = True
                self.c._loop.call_soon(self._pump)


def _frame_group(module: str, depot: str, group: int, ack: int, partitions: list[tuple[int, list[int], list[bytes]]],
                 limit: int) -> list[tuple[pb.AppendRequest, list[tuple[int, list[int]]]]]:
    """append_many: requests of at most `limit` records for one group from (task, input indexes, records).

    Whole partitions go together; a partition larger than the room left is split.
    Each request comes with its (task, input indexes) in request order.
    """
    out: list[tuple[pb.AppendRequest, list[tuple[int, list[int]]]]] = []
    parts: list[tuple[int, list[int], list[bytes]]] = []
    size = 0

    def cut() -> None:
        req = pb.AppendRequest(module=module, group=group, ack=ack, appends=[  # type: ignore[arg-type]
            pb.DepotRecords(depot=depot, task=t, records=recs) for t, _idx, recs in parts])
        out.append((req, [(t, idx) for t, idx, _recs in parts]))
        parts.clear()

    for task, idx, recs in partitions:
        pos = 0
        while pos < len(idx):
            take = min(limit - size, len(idx) - pos)
            parts.append((task, idx[pos:pos + take], recs[pos:pos + take]))
            pos += take
            size += take
            if size >= limit:
                cut()
                size = 0
    if parts:
        cut()
    return out


#: append_many: requests in flight per task group within one call
_MANY_INFLIGHT_PER_GROUP = 2


class Depot:
    """Appends to and reads from one depot; records are routed by the depot's partitioner."""

    def __init__(self, cluster: Cluster, module: str, name: str) -> None:
        self.c = cluster
        self.module = module
        self.name = name

    def _route(self, record: Any) -> tuple[int, int]:
        meta = self.c._module(self.module)
        task = meta.definition.depots[self.name].partitioner(record, meta.spec.tasks)
        return task, meta.spec.group_of(task)

    def append_async(self, record: Any, ack: str = "applied") -> concurrent.futures.Future[int]:
        """Queue one record; the future yields its depot offset (ack="applied") or -1."""
        a = _ack(ack)
        data = _encode(record)
        task, group = self._route(record)
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        self.c._enqueue((self.module, group, a, self.name, task, data, fut))
        return fut

    def append(self, record: Any, ack: str = "applied") -> int:
        """Append one record and wait for `ack`; returns its depot offset when ack="applied"."""
        a = _ack(ack)
        data = _encode(record)
        task, group = self._route(record)
        req = pb.AppendRequest(module=self.module, group=group, ack=a,  # type: ignore[arg-type]
                               appends=[pb.DepotRecords(depot=self.name, task=task, records=[data])])
        reply = self.c._append_sync(self.module, group, req)
        return reply.first_offsets[0] if reply.first_offsets else -1

    def append_many(self, records: Sequence[Any] | Iterable[Any], ack: str = "applied") -> list[int]:
        """Append many records: one request per task group, sent in parallel; offsets in input order.

        Records are encoded and routed in the calling thread; a group with more than
        the client's `max_batch_records` gets several requests, two in flight at a time.
        """
        a = _ack(ack)
        c = self.c
        meta = c._module(self.module)
        partitioner = meta.definition.depots[self.name].partitioner
        ntasks = meta.spec.tasks
        pack = msgpack.Packer(use_bin_type=True).pack
        by_task: dict[int, tuple[list[int], list[bytes]]] = {}
        n = 0
        for i, record in enumerate(records):
            try:
                data = pack(record)
            except TypeError:
                _encode(record)  # raises the ClientError that says what can be encoded
                raise
            task = partitioner(record, ntasks)
            slot = by_task.get(task)
            if slot is None:
                slot = by_task[task] = ([], [])
            slot[0].append(i)
            slot[1].append(data)
            n = i + 1
        if n == 0:
            return []
        by_group: dict[int, list[int]] = {}
        for task in sorted(by_task):
            by_group.setdefault(meta.spec.group_of(task), []).append(task)
        limit = max(1, c.max_batch_records)
        requests = {g: _frame_group(self.module, self.name, g, a, [(t, *by_task[t]) for t in tasks], limit)
                    for g, tasks in by_group.items()}
        done: list[tuple[list[tuple[int, list[int]]], Sequence[int]]] = []
        errors: list[BaseException] = []

        async def send_group(group: int, reqs: list[tuple[Any, list[tuple[int, list[int]]]]]) -> None:
            it = iter(reqs)

            async def worker() -> None:
                for req, parts in it:
                    try:
                        reply = await c._call(self.module, group, "Append", req)
                    except Exception as e:
                        errors.append(e)
                        return
                    done.append((parts, reply.first_offsets))

            await asyncio.gather(*(worker() for _ in range(min(_MANY_INFLIGHT_PER_GROUP, len(reqs)))))

        async def send_all() -> None:
            await asyncio.gather(*(send_group(g, r) for g, r in requests.items()))

        c._run(send_all()).result(timeout=c.timeout_s + 5)
        if errors:
            raise errors[0]
        out = [-1] * n
        for parts, firsts in done:  # offsets are filled here, in the caller's thread, not on the event loop
            for k, (_task, idx) in enumerate(parts):
                if k < len(firsts):
                    base = firsts[k]
                    for j, i in enumerate(idx):
                        out[i] = base + j
        return out

    def _group(self, task: int) -> int:
        meta = self.c._module(self.module)
        if not 0 <= task < meta.spec.tasks:
            raise ClientError(f"task {task} is outside [0, {meta.spec.tasks}) for module {self.module}")
        return meta.spec.group_of(task)

    def read_batch(self, task: int, start: int = 0, end: int | None = None, max_bytes: int = 1 << 20) -> DepotBatch:
        """Applied records of partition `task` from `start` (up to `end`, about `max_bytes`), with the epoch."""
        req = pb.DepotReadRequest(module=self.module, depot=self.name, task=task, start=start, end=end or 0,
                                  max_bytes=max_bytes)
        reply = self.c._call_sync(self.module, self._group(task), "DepotRead", req)
        records = [msgpack.unpackb(r, raw=False, strict_map_key=False) for r in reply.records]
        return DepotBatch(records, reply.start, reply.next, reply.epoch)

    def read(self, task: int, start: int = 0, end: int | None = None, max_bytes: int = 1 << 20) -> list[Any]:
        """Applied records of partition `task` in [start, end), at most about `max_bytes`."""
        return self.read_batch(task, start, end, max_bytes).records

    def partition_status(self, task: int) -> PartitionStatus:
        req = pb.PartitionInfoRequest(module=self.module, depot=self.name, task=task)
        reply = self.c._call_sync(self.module, self._group(task), "PartitionInfo", req)
        return PartitionStatus(reply.start, reply.end, reply.epoch)

    def partition_info(self, task: int) -> tuple[int, int]:
        """(start, end) offsets of partition `task`: records in [start, end) are applied and readable."""
        st = self.partition_status(task)
        return st.start, st.end


class PState:
    """Queries one PState; a path's first key picks the task (the one `hash_partition(key)` picks)."""

    def __init__(self, cluster: Cluster, module: str, name: str) -> None:
        self.c = cluster
        self.module = module
        self.name = name

    def _query(self, key: Any, path: Sequence[Any], one: bool, task: int | None) -> Any:
        from pstate.query import encode_query

        meta = self.c._module(self.module)
        if task is None:
            task = task_for_key(key, meta.spec.tasks)
        req = pb.SelectRequest(module=self.module, pstate=self.name, task=task, path=encode_query(key, path),
                               one=one)
        reply = self.c._call_sync(self.module, meta.spec.group_of(task), "Select", req)
        return msgpack.unpackb(reply.values, raw=False, strict_map_key=False)

    def select_one(self, key: Any, *path: Any, task: int | None = None) -> Any:
        """The single value at `key` (then `path` navigators), or None."""
        return self._query(key, path, True, task)

    def select(self, key: Any, *path: Any, task: int | None = None) -> list[Any]:
        """Every value `path` navigates to under `key`."""
        return list(self._query(key, path, False, task))

    def scan(self, task: int, start: Any = None, end: Any = None) -> list[tuple[Any, Any]]:
        """(key, value) pairs of a Map PState on `task` with start <= key < end (None = open), in key order."""
        from pstate import P

        pairs = self._query(P.sorted_range(start, end).all(), (), False, task)
        # A task group's store holds the keys of all its tasks: keep those `task` owns.
        tasks = self.c._module(self.module).spec.tasks
        return [(k, v) for k, v in pairs if task_for_key(k, tasks) == task]


__all__ = ["Backpressure", "ClientError", "Cluster", "Depot", "NotLeader", "PState", "StalledGroup"]
