"""Planning a depot read (driver side): where each group is led, which offsets are still valid, which partitions.

Planning reads the module and its leaders through the one leader router over
a ZooKeeper session kept per process (Spark reuses its Python planner
workers), checks committed offsets KIP-320 style, and cuts the read into
Spark partitions: one per task group, split for size and parallelism.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pyspark.sql.datasource import InputPartition

from conductor.client.code import default_cache, load_deployed
from conductor.client.handles import PartitionStatus
from conductor.client.retry import Retry
from conductor.client.router import LeaderRouter, ModuleRoutes
from conductor.metastore import Metastore, MetastoreError, ModuleNotFound
from conductor.security.tls import TlsError, TlsFiles, TlsSource
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import Unavailable
from conductor.wire.options import GRPC_OPTIONS
from pstate.errors import DepotNotFound
from topology.module import ModuleDefinition
from topology.spark.errors import DepotOffsetOutOfRange, MillraceSourceError, SourceOptionError
from topology.spark.options import EARLIEST, LATEST, DepotOptions, TlsPaths

log = logging.getLogger("millrace.spark")


RPC_TIMEOUT_S = 30.0


#: how long a read or a planning call keeps following leader moves before it gives up
RETRY_S = 45.0


#: one stub on one channel per (address, TLS files): a stub costs 60 us to make (it registers each method
#: with the channel), several a planning and one a Spark partition
_STUBS: dict[tuple[str, TlsPaths | None], pbg.ClientStub] = {}


#: the readers' channels: a ``DepotStream`` (their one server stream) is read on the thread that iterates it
#: (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream), not through the channel's spin thread, which
#: gRPC starts again (2-4 ms of wall, measured) for every call made while no other call is in flight: once per
#: Spark partition
READER_CHANNEL_OPTIONS = [*GRPC_OPTIONS, ("SingleThreadedUnaryStream", 1)]


_CHANNELS_LOCK = threading.Lock()


#: the TLS files of this process's reads, loaded once per set of paths (they follow rotations)
_TLS_SOURCES: dict[TlsPaths, TlsSource] = {}


def _tls_source(tls: TlsPaths) -> TlsSource:
    """(holding no lock, or _CHANNELS_LOCK) the process's TlsSource for these paths."""
    source = _TLS_SOURCES.get(tls)
    if source is None:
        try:
            source = _TLS_SOURCES[tls] = TlsSource(TlsFiles(*(Path(p) for p in tls)))
        except TlsError as e:
            raise SourceOptionError(f"options tlsCa/tlsCert/tlsKey: {e}") from None
    return source


def client_stub(address: str, tls: TlsPaths | None = None) -> pbg.ClientStub:
    """A stub on a channel shared by every read in this Python process (Spark reuses its workers); mutual TLS
    with the files `tls` names (the read's tlsCa/tlsCert/tlsKey options)."""
    stub = _STUBS.get((address, tls))  # a dict read is atomic; writers hold the lock
    if stub is not None:
        return stub
    with _CHANNELS_LOCK:
        stub = _STUBS.get((address, tls))
        if stub is None:
            if tls is None:
                ch = grpc.insecure_channel(address, options=READER_CHANNEL_OPTIONS)
            else:
                ch = grpc.secure_channel(address, _tls_source(tls).grpc_channel_credentials(),
                                         options=READER_CHANNEL_OPTIONS)
            stub = _STUBS[(address, tls)] = pbg.ClientStub(ch)
    return stub


_SESSIONS: dict[tuple[int, str], tuple[Metastore, LeaderRouter]] = {}


_SESSIONS_LOCK = threading.Lock()


def _shared_session(zk_hosts: str) -> tuple[Metastore, LeaderRouter]:
    """A ZooKeeper session and its leader router, kept for every planning in this process (Spark reuses its
    Python planner workers).

    The connection and the workers' addresses are shared; every planning still
    reads the module and its leaders from ZooKeeper (one round trip:
    ``Modules.get_with_groups``) and the offsets from the
    leaders, so nothing a plan depends on is taken from an earlier planning. An
    address that went stale (a worker restarted elsewhere) fails its call, which
    looks it up again (:meth:`ModuleMeta.call`). A session that fails is dropped
    and replaced.
    """
    key = (os.getpid(), zk_hosts)  # a forked child must not use its parent's session
    with _SESSIONS_LOCK:
        shared = _SESSIONS.get(key)
        if shared is None or not shared[0].connected:
            if shared is not None:
                shared[0].close()
            ms = Metastore(zk_hosts, session_timeout=10.0).start()
            shared = _SESSIONS[key] = (ms, LeaderRouter(ms))
        return shared


def _drop_shared_session(ms: Metastore) -> None:
    with _SESSIONS_LOCK:
        for key, cached in list(_SESSIONS.items()):
            if cached[0] is ms:
                del _SESSIONS[key]
    ms.close()


#: threads that make a planning's PartitionInfo calls at once: blocking calls, each polled by its own thread
#: (a ``.future()`` needs the channel's spin thread, which gRPC starts again, 2-4 ms, for every planning
#: since none of its calls is in flight in between); kept for the process, as the channels are
_INFO_THREADS = 8
#: by pid: a forked child makes its own (its parent's threads are not in it)
_INFO_POOLS: dict[int, ThreadPoolExecutor] = {}


def _info_pool() -> ThreadPoolExecutor:
    """(holding _CHANNELS_LOCK) this process's pool for PartitionInfo calls."""
    pool = _INFO_POOLS.get(os.getpid())
    if pool is None:
        pool = _INFO_POOLS[os.getpid()] = ThreadPoolExecutor(_INFO_THREADS, thread_name_prefix="millrace-plan")
    return pool


class ModuleMeta:
    """Where a module's task groups are led: read from ZooKeeper, refreshed only when a call needs it.

    Used on the Spark driver for planning and, on executors, only after a read
    failed with ``NotLeader`` or an unreachable node. Holds a kazoo session, so
    it is never pickled: readers keep it out of their state. With ``shared``,
    the session and its router are this process's shared ones (see
    :func:`_shared_session`; ``close`` leaves them open), and the module and
    its leaders are read again now: a planning never starts from an earlier
    one's leaders.
    """

    def __init__(self, zk_hosts: str, module: str, *, shared: bool = False, tls: TlsPaths | None = None) -> None:
        self.zk_hosts = zk_hosts
        #: the read's TLS files (every call to a leader presents them)
        self.tls = tls
        self.module = module
        self._shared = shared
        try:
            if shared:
                self._ms, self.router = _shared_session(zk_hosts)
                try:
                    spec = self._spec(fresh=True)
                except MetastoreError:  # a broken shared session: start over with a new one
                    _drop_shared_session(self._ms)
                    self._ms, self.router = _shared_session(zk_hosts)
                    spec = self._spec(fresh=True)
            else:
                self._ms = Metastore(zk_hosts, session_timeout=10.0)
                self._ms.start()
                self.router = LeaderRouter(self._ms)
                spec = self._spec(fresh=False)
        except MetastoreError as e:
            raise MillraceSourceError(f"cannot reach ZooKeeper at {zk_hosts!r} (option `cluster`): {e}; check the "
                                      "connect string and that the cluster runs (`conductor status`)") from e
        self.spec = spec
        self.tasks: int = spec.tasks
        self.groups: int = spec.threads

    def _spec(self, fresh: bool) -> Any:
        try:
            spec = self.router.routes(self.module, refresh=fresh).spec
        except ModuleNotFound:
            known = self._ms.modules.names()
            self.close()
            raise SourceOptionError(f"module {self.module!r} is not deployed on the cluster at {self.zk_hosts}; "
                                    f"deployed modules: {known}") from None
        return spec

    def close(self) -> None:
        if not self._shared:
            self._ms.close()

    def __enter__(self) -> ModuleMeta:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def group_of(self, task: int) -> int:
        return int(self.spec.group_of(task))

    def reload(self) -> None:
        """Read every group's leader and epoch again (before a plan); the workers' addresses stay known (one that
        went stale fails its call, and :meth:`call` looks it up again)."""
        self._reload()

    def refresh(self) -> None:
        """Reload every group's leader and epoch, and forget their addresses (a call failed: they may have moved)."""
        for st in self._reload().groups.values():
            if st.leader is not None:
                self.router.forget(st.leader)

    def _reload(self) -> ModuleRoutes:
        try:
            return self.router.routes(self.module, refresh=True)
        except MetastoreError as e:
            raise MillraceSourceError(f"cannot read the task groups of module {self.module}: {e}") from e

    def leader(self, group: int) -> tuple[str, int]:
        """(gRPC address, epoch) of the group's leader; Unavailable while it has none."""
        return self.router.leader(self.module, group)

    def call(self, group: int, method: str, request: Any, *, timeout_s: float = RPC_TIMEOUT_S) -> Any:
        """One unary RPC to the group's leader, following leader moves for up to ``RETRY_S``."""
        r = Retry(RETRY_S, f"{self.module}/{group}", first_delay=0.05, max_delay=1.0)
        while True:
            try:
                address, _epoch = self.leader(group)
                return getattr(client_stub(address, self.tls), method)(request, timeout=timeout_s)
            except (grpc.RpcError, Unavailable) as e:
                err: Exception = e
            time.sleep(r.backoff(err))
            self.refresh()

    def depot_statuses(self, depot: str) -> dict[int, PartitionStatus]:
        """PartitionInfo of every task of `depot` (asked of each group's leader, all at once)."""
        return {t: PartitionStatus(t, int(r.start), int(r.end), int(r.epoch))
                for t, r in self._partition_infos(depot, None).items()}

    def offsets_for_time(self, depot: str, time_ms: int) -> dict[int, int]:
        """Each task's first offset whose max-so-far record time is >= ``time_ms`` (its end when none is)."""
        return {t: int(r.offset_for_time) if r.HasField("offset_for_time") else int(r.end)
                for t, r in self._partition_infos(depot, time_ms).items()}

    def _partition_infos(self, depot: str, time_ms: int | None) -> dict[int, Any]:
        """The PartitionInfo replies of every task of `depot` (with the offset for ``time_ms`` if given).

        Any failure of the first, concurrent round goes through :meth:`call`,
        which follows leader moves and raises what the leader said.
        """
        first: dict[int, Future[Any]] = {}
        with _CHANNELS_LOCK:
            pool = _info_pool()
        for task in range(self.tasks):
            try:
                address, _epoch = self.leader(self.group_of(task))
            except Unavailable:
                continue
            req = pb.PartitionInfoRequest(module=self.module, depot=depot, task=task, time_ms=time_ms)
            first[task] = pool.submit(client_stub(address, self.tls).PartitionInfo, req, timeout=RPC_TIMEOUT_S)
        out: dict[int, Any] = {}
        for task in range(self.tasks):
            req = pb.PartitionInfoRequest(module=self.module, depot=depot, task=task, time_ms=time_ms)
            try:
                r = first[task].result() if task in first else None
            except grpc.RpcError:
                r = None
            try:
                if r is None:
                    r = self.call(self.group_of(task), "PartitionInfo", req)
            except DepotNotFound:
                raise SourceOptionError(f"module {self.module} has no depot {depot!r}; its depots: "
                                        f"{self._known('depots')}") from None
            out[task] = r
        return out

    def definition(self) -> ModuleDefinition:
        """What the module's deployed code declares (fetched from a worker if this machine lacks it)."""
        return load_deployed(self._ms, self.spec, default_cache(), credentials=self._credentials()).build()

    def _credentials(self) -> grpc.ChannelCredentials | None:
        return None if self.tls is None else _tls_source(self.tls).grpc_channel_credentials()

    def _known(self, what: str) -> list[str]:
        """Depot or PState names for an error message."""
        try:
            d = self.definition()
            return list(d.depot_names() if what == "depots" else d.pstate_names())
        except Exception as e:
            return [f"(unknown: the code of {self.spec.module_ref} cannot be loaded here: {e})"]


def validate_offsets(module: str, depot: str, committed: Mapping[int, tuple[int, int]],
                     statuses: Mapping[int, PartitionStatus]) -> None:
    """KIP-320 check: every committed (offset, epoch) must still lie in [start, end] of its partition.

    ``offset == end`` is fine (nothing new yet); ``offset > end`` means applied
    records were truncated; ``offset < start`` means records were trimmed
    before being read. Raises :class:`DepotOffsetOutOfRange` listing every bad
    partition (never a subset: the operator should see the whole damage).
    """
    problems: list[dict[str, Any]] = []
    for task, (offset, epoch) in sorted(committed.items()):
        st = statuses.get(task)
        if st is None:
            problems.append({"task": task, "kind": "truncated", "offset": offset, "epoch": epoch, "start": 0,
                             "end": 0, "current_epoch": -1})
            continue
        kind = "truncated" if offset > st.end else "trimmed" if offset < st.start else None
        if kind:
            problems.append({"task": task, "kind": kind, "offset": offset, "epoch": epoch, "start": st.start,
                             "end": st.end, "current_epoch": st.epoch})
    if problems:
        raise DepotOffsetOutOfRange(module, depot, problems)


def offsets_to_json(offsets: Mapping[int, tuple[int, int]]) -> dict[str, dict[str, int]]:
    return {str(t): {"offset": o, "epoch": e} for t, (o, e) in sorted(offsets.items())}


def offsets_from_json(doc: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    try:
        return {int(t): (int(v["offset"]), int(v["epoch"])) for t, v in doc.items()}
    except (KeyError, TypeError, ValueError):
        raise MillraceSourceError(f"streaming offsets {doc!r} are not millrace.depot offsets "
                                  '({"<task>": {"offset": n, "epoch": e}}); was this checkpoint written by '
                                  "another source?") from None


def apply_limit(starts: Mapping[int, int], ends: Mapping[int, int], max_rows: int) -> dict[int, int]:
    """Cap the total backlog at `max_rows`, shared in proportion to each task's backlog (at least 1 each).

    Proportional shares keep a lagging partition from starving the others and
    keep per-trigger work predictable; the integer rest goes to the largest
    backlogs so the cap is met exactly.
    """
    backlog = {t: max(0, ends[t] - starts.get(t, ends[t])) for t in ends}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(ends)
    take = {t: (b * max_rows) // total for t, b in backlog.items()}
    rest = max_rows - sum(take.values())
    for t in sorted(backlog, key=lambda t: backlog[t] - take[t], reverse=True):
        if rest <= 0:
            break
        if backlog[t] > take[t]:
            take[t] += 1
            rest -= 1
    return {t: starts.get(t, ends[t]) + take[t] if backlog[t] else ends[t] for t in ends}


@dataclass(frozen=True)
class TaskRange:
    """Records [start, end) of depot partition `task`, planned while its leader was at `epoch`."""

    task: int
    start: int
    end: int
    epoch: int


class DepotPartition(InputPartition):
    """One Spark partition: ranges of one task group's depot partitions, and the leader to fetch them from.

    All ranges share the group's leader, so one Spark task talks to one node
    over one channel. It carries that leader's address (planned on the
    driver), so the executor goes straight to the node; ZooKeeper is asked
    only if that leader moved.
    """

    def __init__(self, zk_hosts: str, module: str, depot: str, group: int, ranges: list[TaskRange],
                 address: str, records_per_request: int, max_bytes: int, tls: TlsPaths | None = None) -> None:
        super().__init__(group)
        #: TLS file paths (read on the executor's machine), None: plaintext
        self.tls = tls
        self.zk_hosts = zk_hosts
        self.module = module
        self.depot = depot
        self.group = group
        self.ranges = ranges
        self.address = address
        self.records_per_request = records_per_request
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        spans = ", ".join(f"{r.task}:[{r.start},{r.end})" for r in self.ranges)
        return f"DepotPartition({self.module}/{self.depot} group {self.group} at {self.address}: {spans})"


def split_ranges(ranges: list[TaskRange], parts: int) -> list[list[TaskRange]]:
    """Cut the concatenation of `ranges` into `parts` pieces of near-equal record counts."""
    total = sum(r.end - r.start for r in ranges)
    out: list[list[TaskRange]] = []
    queue = deque(ranges)
    for i in range(parts):
        want = total * (i + 1) // parts - total * i // parts
        piece: list[TaskRange] = []
        while want > 0 and queue:
            r = queue.popleft()
            n = r.end - r.start
            if n <= want:
                piece.append(r)
                want -= n
            else:
                piece.append(TaskRange(r.task, r.start, r.start + want, r.epoch))
                queue.appendleft(TaskRange(r.task, r.start + want, r.end, r.epoch))
                want = 0
        if piece:
            out.append(piece)
    return out


def plan_partitions(opts: DepotOptions, meta: ModuleMeta, ranges: Mapping[int, tuple[int, int]],
                    epochs: Mapping[int, int]) -> list[DepotPartition]:
    """Spark partitions for [start, end) per task: one per task group, split for size and parallelism.

    Spark pays tens of milliseconds per Python partition, so a small read
    should use as few as keep every core busy: one per task group (its tasks
    share a leader) by default, each group cut into pieces of at most
    ``recordsPerPartition`` records, and into more when ``minPartitions``
    asks for more parallelism (shared in proportion to each group's records).
    """
    by_group: dict[int, list[TaskRange]] = {}
    for task, (start, end) in sorted(ranges.items()):
        if end > start:
            by_group.setdefault(meta.group_of(task), []).append(TaskRange(task, start, end, epochs.get(task, 0)))
    total = sum(r.end - r.start for rs in by_group.values() for r in rs)
    out: list[DepotPartition] = []
    for group, rs in sorted(by_group.items()):
        n = sum(r.end - r.start for r in rs)
        parts = max(1, -(-n // opts.records_per_partition))
        if opts.min_partitions:
            parts = max(parts, -(-opts.min_partitions * n // total))
        address, _zk_epoch = meta.leader(group)
        for piece in split_ranges(rs, min(parts, n)):
            out.append(DepotPartition(opts.cluster, opts.module, opts.depot, group, piece, address,
                                      opts.records_per_request, opts.max_bytes_per_request, opts.tls))
    return out


def resolve_starts(opts: DepotOptions, statuses: Mapping[int, PartitionStatus], meta: ModuleMeta) -> dict[int, int]:
    """Resolve ``startingOffsets`` (or ``startingTimestamp``) against the partitions as they are now."""
    if opts.starting_timestamp is not None:
        return _at_time(meta.offsets_for_time(opts.depot, opts.starting_timestamp), statuses)
    out: dict[int, int] = {}
    explicit = opts.starting_offsets if isinstance(opts.starting_offsets, dict) else {}
    unknown = sorted(set(explicit) - set(statuses))
    if unknown:
        raise SourceOptionError(f"startingOffsets names task(s) {unknown}, but module {opts.module} has tasks "
                                f"0..{len(statuses) - 1}")
    for t, st in statuses.items():
        want = explicit.get(t, EARLIEST if opts.starting_offsets != "latest" else LATEST)
        out[t] = st.start if want == EARLIEST else st.end if want == LATEST else want
    if explicit:
        validate_offsets(opts.module, opts.depot, {t: (out[t], statuses[t].epoch) for t in out}, statuses)
    return out


def resolve_ends(opts: DepotOptions, statuses: Mapping[int, PartitionStatus], starts: Mapping[int, int],
                 meta: ModuleMeta) -> dict[int, int]:
    """Resolve a batch read's ``endingOffsets`` (or ``endingTimestamp``, exclusive) against the partitions now.

    An end past a partition's applied end, or before the read's start, is an
    option error naming the task: a batch read never waits for records.
    """
    if opts.ending_timestamp is not None:
        return {t: max(starts[t], e)
                for t, e in _at_time(meta.offsets_for_time(opts.depot, opts.ending_timestamp), statuses).items()}
    explicit = opts.ending_offsets if isinstance(opts.ending_offsets, dict) else {}
    unknown = sorted(set(explicit) - set(statuses))
    if unknown:
        raise SourceOptionError(f"endingOffsets names task(s) {unknown}, but module {opts.module} has tasks "
                                f"0..{len(statuses) - 1}")
    out: dict[int, int] = {}
    for t, st in statuses.items():
        want = explicit.get(t, LATEST)
        out[t] = st.end if want == LATEST else st.start if want == EARLIEST else want
        if out[t] > st.end:
            raise SourceOptionError(f"endingOffsets for task {t} is {out[t]}, past the partition's applied end "
                                    f"{st.end}: a batch read ends at records that exist (use -1 for latest)")
        if out[t] < starts[t]:
            raise SourceOptionError(f"endingOffsets for task {t} is {out[t]}, before the read's start {starts[t]}")
    return out


def _at_time(offsets: Mapping[int, int], statuses: Mapping[int, PartitionStatus]) -> dict[int, int]:
    """Offsets for a time, kept inside the partitions as planned (the time lookup came a moment later)."""
    return {t: min(max(offsets.get(t, st.end), st.start), st.end) for t, st in statuses.items()}
