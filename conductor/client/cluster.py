"""The Python client: append to depots and query PStates of a running Millrace cluster.

    cluster = Cluster.connect("zk1:2181,zk2:2181,zk3:2181")
    cluster.depot("WordCount", "*sentences").append("the cat sat", ack="applied")
    cluster.pstate("WordCount", "$$counts").select_one("cat")

    # a secured cluster: mutual TLS with the app's certificate (``conductor certs issue --role app``)
    cluster = Cluster.connect("zk1:2181", tls=TlsFiles(Path("ca.pem"), Path("app-billing.pem"),
                                                       Path("app-billing.key")))
    # or a bearer token (``conductor token create --name billing``) and the cluster's CA
    cluster = Cluster.connect("zk1:2181", token="mrt....", ca=Path("ca.pem"))

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

Every queue is bounded. ``append_async`` holds at most ``max_queued_records``
records (and ``max_queued_bytes``) not answered yet, from its call to its
future's result; a blocking ``append`` waits with at most
``max_blocking_appends_per_group`` others on its group leader's stream. A caller
finding the bound reached waits for room up to ``timeout_s``, then gets
:class:`~conductor.client.errors.QueueFull` naming the option to raise.

Leader addresses are cached and looked up again only after ``NotLeader``,
``Unavailable`` or a leader change seen by the watch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from conductor.client.batching import GroupBatcher, StickyTasks
from conductor.client.code import CodeCache, CodeUnavailable, default_cache, load_deployed
from conductor.client.credentials import app_credentials
from conductor.client.errors import ClientError, QueueFull
from conductor.client.handles import Depot, PState
from conductor.client.metrics import ClientMetrics
from conductor.client.producer import Producer
from conductor.client.queries import Senders, run_query
from conductor.client.retry import Retry
from conductor.client.router import LeaderRouter, ModuleRoutes
from conductor.client.streams import (
    DEADLINE_CHECK_S,
    AioAppendStream,
    AioStreamTicket,
    StreamTicket,
    SyncAppendStream,
    checked,
)
from conductor.metastore import GroupState, Metastore, MetastoreError
from conductor.metastore.module_spec import NAME_RE, ModuleSpec
from conductor.security.tls import TlsFiles, TlsSource
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import Channels, open_aio_channel
from conductor.wire.errors import PermissionDenied, Unauthenticated, Unavailable
from conductor.wire.options import GRPC_OPTIONS
from replog.errors import NotLeader
from topology.module import ModuleDefinition

T = TypeVar("T")


@dataclass(frozen=True)
class _Module:
    """What the client keeps of a deployed module: its spec and its code's declarations."""

    spec: ModuleSpec
    definition: ModuleDefinition


@dataclass(frozen=True, slots=True)
class _Try:
    """One try of a call loop: the group, the leader-move generation to watch, the leader, the budget."""

    key: tuple[str, int]
    generation: int
    address: str
    retry: Retry


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    tasks: int
    groups: int
    depots: list[str]
    pstates: list[str]


class Cluster:
    """A connection to one Millrace cluster (through its ZooKeeper)."""

    def __init__(self, zk_hosts: str, *, timeout_s: float = 45.0, linger_ms: float = 0.0,
                 max_batch_records: int = 10_000, max_inflight_per_group: int = 8,
                 max_queued_records: int = 100_000, max_queued_bytes: int = 64 << 20,
                 max_blocking_appends_per_group: int = 1024,
                 code_cache: CodeCache | None = None, idempotent: bool = True,
                 tls: TlsFiles | TlsSource | None = None, metrics: ClientMetrics | None = None,
                 token: str | None = None, ca: Path | bytes | None = None) -> None:
        self.zk_hosts = zk_hosts
        #: the app's histogram of call latencies (conductor.client.metrics); None: nothing is timed
        self.metrics = metrics
        #: the app's certificate: every channel is mutual TLS with the files' current content (a rotation is
        #: used by the channels opened after it); None: plaintext (or the process's, conductor.wire.channels).
        #: Or `token` (and `ca`): server-only TLS to the workers' token ports (conductor.client.credentials)
        auth = app_credentials(tls, token, ca)
        self.tls = auth.tls
        self._credentials = auth.credentials
        self._token_port = auth.token_port
        #: where deployed modules' code is fetched to (default: ~/.cache/millrace/code)
        self.code_cache = code_cache or default_cache()
        if linger_ms < 0 or max_batch_records < 1 or max_inflight_per_group < 1:
            raise ValueError(f"append batching options out of range: linger_ms={linger_ms} (>= 0), max_batch_records="
                             f"{max_batch_records} (>= 1), max_inflight_per_group={max_inflight_per_group} (>= 1)")
        self.timeout_s = timeout_s
        #: append_async: how long a group's first waiting record waits for others (Kafka's linger.ms), the
        #: records one request carries at most (append_many's too), and the requests a group has in flight
        self.linger_ms = linger_ms
        self.max_batch_records = max_batch_records
        self.max_inflight_per_group = max_inflight_per_group
        #: append_async: records (and their bytes) taken and not answered yet, at most (see the module docstring)
        self.max_queued_records = max_queued_records
        self.max_queued_bytes = max_queued_bytes
        #: blocking appends waiting on one group leader's stream, at most
        self.max_blocking_appends_per_group = max_blocking_appends_per_group
        #: numbers every append request, so a retry is answered with the original offsets (exactly once);
        #: None sends un-numbered requests (a retry may then append twice: at-least-once)
        self.producer = Producer() if idempotent else None
        self._ms = Metastore(zk_hosts, session_timeout=10.0)
        #: where every group is led (kept current by the group watches installed in `_module`)
        self.router = LeaderRouter(self._ms, self._token_port)
        #: per module: its spec and code, loaded once (tasks and task groups never change under a client)
        self._modules: dict[str, _Module] = {}
        self._modules_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="millrace-client", daemon=True)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sync_channels = Channels(credentials=self._credentials)
        #: a blocking stub per address, on its channel in _sync_channels (which never replaces one)
        self._sync_stubs: dict[str, pbg.ClientStub] = {}
        #: guards the sync channels and the registry of calls in flight (any thread)
        self._calls_lock = threading.Lock()
        #: per group: bumped by every leader change the watch sees
        self._generation: dict[tuple[str, int], int] = defaultdict(int)
        #: per group: calls in flight to its leader (aio calls and sync futures), to abandon on a move
        self._inflight: dict[tuple[str, int], set[Any]] = defaultdict(set)
        #: calls the watch cancelled because their group's leader moved
        self._abandoned: set[int] = set()
        self._batchers: dict[tuple[str, int], GroupBatcher] = {}
        #: append_async's task per depot with a sticky partitioner (``random``), one per batch window
        self.sticky = StickyTasks()
        #: append_async hand-off to the event loop: filled by any thread, drained once per burst
        self._queued: deque[tuple[str, int, int, str, int, bytes, concurrent.futures.Future[int]]] = deque()
        #: guards the hand-off (a plain lock: the per-record path takes no Python-level Condition)
        self._queued_lock = threading.Lock()
        #: callers waiting for room wait on this condition of the same lock; `_room_waiters` of them do now
        self._room = threading.Condition(self._queued_lock)
        self._room_waiters = 0
        #: append_async's records (and bytes) not answered yet: queued here, waiting in a batcher, or in flight
        self._outstanding = 0
        self._outstanding_bytes = 0
        self._drain_scheduled = False
        #: blocking appends: one AppendStream per (leader address, module, group), see SyncAppendStream
        self._append_streams: dict[tuple[str, str, int], SyncAppendStream] = {}
        #: append_async's requests: one AppendStream per (leader address, module, group), event loop only
        self._aio_streams: dict[tuple[str, str, int], AioAppendStream] = {}
        self._watchdog: threading.Thread | None = None
        #: the threads that send a query's requests but its last (conductor/client/queries.py)
        self._senders = Senders()
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
        self._senders.close()
        with self._queued_lock:  # callers waiting for room in append_async's queue: the client is closed
            self._room.notify_all()

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
            streams = list(self._append_streams.values())
            self._append_streams.clear()
        for stream in streams:
            stream.cancel()
        self._sync_channels.close()
        self._ms.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def depot(self, module: str, name: str) -> Depot:
        meta = self._module(module)
        if name not in meta.definition.depots:
            meta = self._reload(module)  # an update may have added it
        if name not in meta.definition.depots:
            raise ClientError(f"module {module} has no depot {name!r}; its depots: {meta.definition.depot_names()}")
        return Depot(self, module, name)

    def pstate(self, module: str, name: str) -> PState:
        meta = self._module(module)
        if name not in meta.definition.pstates:
            meta = self._reload(module)
        if name not in meta.definition.pstates:
            raise ClientError(f"module {module} has no PState {name!r}; its PStates: {meta.definition.pstate_names()}")
        return PState(self, module, name)

    def query(self, module: str, name: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Run query topology ``name`` of ``module`` (``@m.query``) with ``args``; its combined result.

        Read-only, on the group leaders' applied state; QueryTimeout past ``timeout_s`` (default: the client's
        call timeout), with nothing left running (see conductor/client/queries.py).
        """
        return run_query(self, module, name, args, self.timeout_s if timeout_s is None else timeout_s)

    def modules(self) -> list[str]:
        return self._ms.modules.names()

    def module_info(self, module: str) -> ModuleInfo:
        meta = self._module(module)
        return ModuleInfo(module, meta.spec.tasks, meta.spec.threads, meta.definition.depot_names(),
                          meta.definition.pstate_names())

    def module_definition(self, module: str) -> ModuleDefinition:
        """What the deployed module's code declares (its deployed code version, fetched from a worker that holds
        it if this machine lacks it, as workers do)."""
        return self._module(module).definition

    def call_group(self, module: str, group: int, method: str, request: Any) -> concurrent.futures.Future[Any]:
        """One `Client` RPC to the leader of `group`, following leader moves; for framework code (Spark)."""
        fut: concurrent.futures.Future[Any] = self._run(self._call(module, group, method, request))
        return fut

    # ------------------------------------------------------------------------------ metadata

    def _module(self, module: str) -> _Module:
        """The module's spec and code; the first use loads the code and watches every group's leader."""
        m = self._modules.get(module)  # a dict read is atomic; writers hold the lock
        if m is not None:
            return m
        routes = self._routes(module)
        with self._modules_lock:
            m = self._modules.get(module)
            if m is not None:
                return m
            try:
                definition = load_deployed(self._ms, routes.spec, self.code_cache, credentials=self._credentials,
                                           token_port=self._token_port).build()
            except CodeUnavailable as e:
                if isinstance(e.__cause__, Unauthenticated | PermissionDenied):
                    raise e.__cause__ from None  # every worker refused us: say so, typed (a wrong or revoked token)
                raise
            m = self._modules[module] = _Module(routes.spec, definition)
        for g in routes.groups:
            self._ms.groups.watch(module, g, functools.partial(self._on_group, module, g))
        return m

    def _reload(self, module: str) -> _Module:
        """The module's code again if `conductor update` switched it to another version since it was loaded
        (partitioners never change in an update, so handles made before stay right)."""
        try:
            spec, _ = self._ms.modules.get(module)
        except MetastoreError as e:
            raise self._not_deployed(module, e) from e
        with self._modules_lock:
            m = self._modules[module]
            if spec.version != m.spec.version:
                m = self._modules[module] = _Module(spec, load_deployed(
                    self._ms, spec, self.code_cache, credentials=self._credentials,
                    token_port=self._token_port).build())
        return m

    def _routes(self, module: str) -> ModuleRoutes:
        if not isinstance(module, str) or not NAME_RE.match(module):  # never a znode path of its own making
            raise ClientError(f"{module!r} is not a module name (1-64 letters, digits, '_', '-' or '.', starting "
                              f"with a letter), so it is not deployed; deployed modules: {self._ms.modules.names()}")
        try:
            return self.router.routes(module)
        except MetastoreError as e:
            raise self._not_deployed(module, e) from e

    def _not_deployed(self, module: str, e: MetastoreError) -> ClientError:
        return ClientError(f"module {module!r} is not deployed ({e}); deployed modules: {self._ms.modules.names()}")

    def _on_group(self, module: str, group: int, st: GroupState | None, _version: int) -> None:
        """Metastore watch: a leader change abandons in-flight calls to the old leader at once."""
        if st is None:
            return
        old = self.router.observe(module, group, st)
        if old is None or (old.leader, old.epoch) != (st.leader, st.epoch):
            self._abandon(module, group)

    def _abandon(self, module: str, group: int) -> None:
        """Cancel every call in flight to `group`'s leader; their callers retry on the new leader.

        The old leader can no longer apply them (the new epoch fences it), and a
        SIGSTOPped or partitioned one would never answer. An abandoned append may
        still have landed: its retry carries the same producer sequence, so the
        new leader answers it with the original offsets (``Producer``).
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

    def _target(self, r: Retry, key: tuple[str, int]) -> tuple[int, str | None]:
        """The leader-move generation to watch, and the leader's address if cached and trusted (never blocks)."""
        generation = self._generation[key]
        return generation, None if r.refresh else self.router.cached_address(*key)

    def _leader(self, r: Retry, key: tuple[str, int]) -> tuple[int, str]:
        """The generation to watch and the leader's address, from ZooKeeper if not cached (blocks)."""
        generation, address = self._target(r, key)
        return generation, address or self._leader_address(*key, r.refresh)

    async def _leader_aio(self, r: Retry, key: tuple[str, int]) -> tuple[int, str]:
        """:meth:`_leader` on the event loop (a ZooKeeper read goes to a thread)."""
        generation, address = self._target(r, key)
        if address is None:
            address = await asyncio.to_thread(self._leader_address, *key, r.refresh)
        return generation, address

    def _leader_address(self, module: str, group: int, refresh: bool) -> str:
        self._module(module)
        try:
            return self.router.leader(module, group, refresh)[0]
        except MetastoreError as e:
            raise self._not_deployed(module, e) from e

    def _stub(self, address: str) -> pbg.ClientStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_aio_channel(address, GRPC_OPTIONS, self._credentials)
        return pbg.ClientStub(ch)

    def _sync_stub(self, address: str) -> pbg.ClientStub:
        with self._calls_lock:
            if self._closed:
                raise ClientError("the cluster client is closed")
        stub = self._sync_stubs.get(address)
        if stub is None:  # (a stub is a dozen method objects: made once per address, not per call)
            stub = self._sync_stubs.setdefault(address, pbg.ClientStub(self._sync_channels.get(address)))
        return stub

    def _run(self, coro: Any) -> Any:
        if self._closed:
            coro.close()
            raise ClientError("the cluster client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _retrying(self, module: str, group: int, attempt: Callable[[_Try], T], method: str) -> T:
        """The blocking call loop: ``attempt`` on the group leader until it answers, following leader moves.

        Each try gets the leader-move generation to watch and the leader's
        address; what is retried and for how long is :class:`Retry`'s decision.
        """
        if self.metrics is None:
            return self._retry_loop(module, group, attempt)
        with self.metrics.timed(module, method):
            return self._retry_loop(module, group, attempt)

    def _retry_loop(self, module: str, group: int, attempt: Callable[[_Try], T]) -> T:
        if self._closed:
            raise ClientError("the cluster client is closed")
        key = (module, group)
        r = Retry(self.timeout_s, f"{module}/{group}")
        while True:
            generation = self._generation[key]
            try:
                generation, address = self._leader(r, key)
                return attempt(_Try(key, generation, address, r))
            except (grpc.RpcError, Unavailable, NotLeader) as e:
                err: Exception = e
            time.sleep(r.backoff(err, moved=self._generation[key] != generation))

    async def _retrying_aio(self, module: str, group: int, attempt: Callable[[_Try], Awaitable[T]], method: str) -> T:
        """:meth:`_retrying` on the event loop (the waits are awaited, a ZooKeeper read goes to a thread)."""
        if self.metrics is None:
            return await self._retry_loop_aio(module, group, attempt)
        with self.metrics.timed(module, method):
            return await self._retry_loop_aio(module, group, attempt)

    async def _retry_loop_aio(self, module: str, group: int, attempt: Callable[[_Try], Awaitable[T]]) -> T:
        key = (module, group)
        r = Retry(self.timeout_s, f"{module}/{group}")
        while True:
            generation = self._generation[key]
            try:
                generation, address = await self._leader_aio(r, key)
                return await attempt(_Try(key, generation, address, r))
            except (grpc.RpcError, Unavailable, NotLeader) as e:
                err: Exception = e
            await asyncio.sleep(r.backoff(err, moved=self._generation[key] != generation))

    async def _call(self, module: str, group: int, method: str, request: Any) -> Any:
        """One RPC to the group leader on the event loop, following leader moves until `timeout_s`."""
        async def attempt(t: _Try) -> Any:
            call = getattr(self._stub(t.address), method)(request, timeout=t.retry.remaining())
            with self._watching(t.key, call, t.generation, (asyncio.CancelledError, grpc.RpcError)):
                return await call

        return await self._retrying_aio(module, group, attempt, method)

    def _call_sync(self, module: str, group: int, method: str, request: Any) -> Any:
        """The same as :meth:`_call` as a synchronous gRPC call in the calling thread (blocking APIs)."""
        def attempt(t: _Try) -> Any:
            fut = getattr(self._sync_stub(t.address), method).future(request, timeout=t.retry.remaining())
            with self._watching(t.key, fut, t.generation, (grpc.FutureCancelledError, grpc.RpcError)):
                return fut.result()

        return self._retrying(module, group, attempt, method)

    def _append_stream(self, address: str, module: str, group: int) -> SyncAppendStream:
        key = (address, module, group)
        stream = self._append_streams.get(key)
        if stream is not None and not stream.broken:
            return stream
        channel = self._sync_stub(address)  # creates the channel (and checks the client is open)
        del channel
        with self._calls_lock:
            stream = self._append_streams.get(key)
            if stream is None or stream.broken:
                stream = self._append_streams[key] = SyncAppendStream(self._sync_channels.get(address),
                                                                      self.max_blocking_appends_per_group)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._expire_streams, name="millrace-client-deadlines",
                                                  daemon=True)
                self._watchdog.start()
        return stream

    def _expire_streams(self) -> None:
        """Fail blocking appends that outlive their deadline (a stream read cannot time out by itself)."""
        while not self._closed:
            time.sleep(DEADLINE_CHECK_S)
            with self._calls_lock:
                streams = list(self._append_streams.values())
            now = time.monotonic()
            for stream in streams:
                stream.expire(now)

    def stamp(self, request: pb.AppendRequest) -> pb.AppendRequest:
        """Number an append request before its first try (idempotent clients); retries resend it as is."""
        return request if self.producer is None else self.producer.stamp(request)

    def _append_sync(self, module: str, group: int, request: pb.AppendRequest) -> pb.AppendReply:
        """`_call_sync(..., "Append", request)` on the group leader's AppendStream: same retries and abandonment."""
        def attempt(t: _Try) -> pb.AppendReply:
            stream = self._append_stream(t.address, module, group)
            ticket = StreamTicket(stream)  # one per request: abandonment is per request, cancelling the stream
            with self._watching(t.key, ticket, t.generation, (grpc.RpcError,)):
                reply = stream.request(request, t.retry.deadline)
            return checked(reply)

        return self._retrying(module, group, attempt, "Append")

    async def _append_aio(self, module: str, group: int, request: pb.AppendRequest) -> pb.AppendReply:
        """Event loop: `_call(..., "Append", request)` on the leader's AppendStream; same retries and abandonment."""
        async def attempt(t: _Try) -> pb.AppendReply:
            skey = (t.address, module, group)
            stream = self._aio_streams.get(skey)
            if stream is None or stream.broken is not None:
                stream = self._aio_streams[skey] = AioAppendStream(self._stub(t.address))
            ticket = AioStreamTicket(self._loop, stream)
            with self._watching(t.key, ticket, t.generation, (asyncio.CancelledError, grpc.RpcError)):
                try:
                    reply = await asyncio.wait_for(stream.request(request), t.retry.remaining())
                except TimeoutError:
                    stream.cancel()  # a reply may never come on it: the next request opens another
                    raise Unavailable("DEADLINE_EXCEEDED", "no reply before the client's timeout") from None
            return checked(reply)

        return await self._retrying_aio(module, group, attempt, "AppendBatch")

    # ------------------------------------------------------------------------ append_async hand-off

    def _enqueue(self, item: tuple[str, int, int, str, int, bytes, concurrent.futures.Future[int]]) -> None:
        """Any thread: queue one record for the event loop, waking it only if it was not already due.

        Waits for room while ``max_queued_records`` records (or
        ``max_queued_bytes``) are not answered yet; QueueFull after ``timeout_s``.
        """
        if self._closed:
            raise ClientError("the cluster client is closed")
        nbytes = len(item[5])
        with self._queued_lock:
            if self._outstanding >= self.max_queued_records or (
                    self._outstanding and self._outstanding_bytes + nbytes > self.max_queued_bytes):
                self._wait_for_room(nbytes)
            self._outstanding += 1
            self._outstanding_bytes += nbytes
            self._queued.append(item)
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _wait_for_room(self, nbytes: int) -> None:
        """(holding the hand-off lock) Wait until append_async may take `nbytes` more, or raise QueueFull."""
        start = time.monotonic()
        while True:
            if self._outstanding >= self.max_queued_records:
                full = ("append_async's queue of records", "max_queued_records", self.max_queued_records)
            elif self._outstanding and self._outstanding_bytes + nbytes > self.max_queued_bytes:
                full = ("append_async's queue of bytes", "max_queued_bytes", self.max_queued_bytes)
            else:
                return
            if self._closed:
                raise ClientError("the cluster client is closed")
            waited = time.monotonic() - start
            # (the event loop answers the appends: on it, waiting would wait for itself)
            if waited >= self.timeout_s or threading.current_thread() is self._thread:
                raise QueueFull(*full, waited)
            self._room_waiters += 1
            try:
                self._room.wait(self.timeout_s - waited)
            finally:
                self._room_waiters -= 1

    def _answered(self, records: int, nbytes: int) -> None:
        """Event loop: `records` of append_async's records were answered (or failed); room for as many."""
        with self._queued_lock:
            self._outstanding -= records
            self._outstanding_bytes -= nbytes
            assert self._outstanding >= 0 and self._outstanding_bytes >= 0, (self._outstanding, self._outstanding_bytes)
            if self._room_waiters:
                self._room.notify_all()

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
                b = batchers[(module, group)] = GroupBatcher(self, module, group)
            b.add(ack, depot, task, data, fut)
