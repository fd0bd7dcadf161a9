"""``millrace.depot``: a depot as a Spark data source, for batch reads and Structured Streaming.

    from topology.spark import register
    register(spark)
    df = (spark.readStream.format("millrace.depot")
          .option("cluster", "127.0.0.1:2181").option("module", "Clicks").option("depot", "*clicks")
          .option("valueSchema", "user string, n long")      # optional: record fields as columns
          .load())

Rows are ``task int, offset long, epoch long`` plus either ``value string`` (the
record as JSON; bytes become base64 strings) or, with ``valueSchema``, one
column per field of a dict record (missing fields are null, extra fields are
dropped, a field of the wrong type fails the read naming task and offset).
``epoch`` is the leader epoch of the replica that served the record.

Options: ``cluster`` (ZooKeeper connect string), ``module``, ``depot`` (required);
``startingOffsets`` = ``earliest`` (default) | ``latest`` | JSON ``{"<task>": offset}``
(-2 = earliest, -1 = latest, like Kafka); ``maxRecordsPerTrigger`` (streaming,
shared across tasks in proportion to their backlog); ``valueSchema`` (DDL);
tuning: ``minPartitions`` (default: one Spark partition per task group),
``recordsPerPartition`` (default 1,000,000), ``recordsPerRequest`` (default
32,768) and ``maxBytesPerRequest`` (default 16 MiB).

Why it is shaped this way:

* **Offsets are applied offsets.** A microbatch's end offset per task is the
  partition's applied end (``PartitionInfo.end``), and records below it are
  replicated to every ISR member, so no leader change can take them back: a
  replay after a crash reads exactly the same records (what exactly-once sinks,
  Delta's and Millrace's microbatch commit, rely on). Streaming offsets are JSON
  ``{"<task>": {"offset": n, "epoch": e}}`` with the leader epoch that reported
  ``n``.
* **Lost offsets fail loudly (KIP-320).** If a partition's applied end is below
  a committed offset (the log was truncated: data loss, or the module was
  destroyed and deployed again) or its start is above it (records were trimmed
  before the query read them), the query stops with
  :class:`DepotOffsetOutOfRange`, naming partition, offsets and epochs. Skipping
  silently would break exactly-once without anyone noticing.
* **Executors never touch ZooKeeper on the happy path.** Planning (driver side)
  reads leaders from ZooKeeper once per microbatch and puts each leader's
  address and epoch in the partition, so a Spark task connects straight to the
  node. Only a ``NotLeader``/unreachable node (or a reply from an epoch older
  than planned: a zombie leader) makes a task look the leader up again.
* **Spark pays per partition.** Each Python partition costs Spark tens of
  milliseconds, so a read gets one Spark partition per task group (whose
  tasks share a leader: one node, one channel), cut further only for size
  (``recordsPerPartition``) or parallelism (``minPartitions``).
* **Python pays per object.** A Spark task pipelines several large
  ``DepotRead`` requests (offsets are dense, so request boundaries are known in
  advance and the next replies travel while this one is decoded; the first one
  is small so decoding starts early) and hands Spark whole Arrow record
  batches. With ``valueSchema`` over dict records of scalar fields,
  :class:`FlatDecoder` turns a reply's msgpack straight into Arrow columns
  with numpy, one vectorized step per key/value position instead of a Python
  dict per record (2-3x less CPU than msgpack + pyarrow); anything it does
  not handle exactly goes the general way (one msgpack call per reply, then
  pyarrow converts the dicts, or JSON for ``value``).
* **Spark pays per job.** A batch read is planned in a Python worker Spark
  reuses, so planning keeps one ZooKeeper session per process (it still reads
  the module and its leaders from ZooKeeper, and every partition's offsets from
  its leader, on every planning) and asks the leaders for all partitions at once.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import msgpack
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructType

from conductor.client.handles import PartitionStatus
from conductor.client.retry import Retry, retryable
from conductor.client.router import LeaderRouter
from conductor.metastore import Metastore, MetastoreError, ModuleNotFound
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.errors import Unavailable, error_from_rpc
from conductor.wire.options import GRPC_OPTIONS
from pstate.errors import DepotNotFound
from replog.errors import NotLeader

log = logging.getLogger("millrace.spark")

SOURCE_NAME = "millrace.depot"
META_COLUMNS = ("task", "offset", "epoch")
BASE_SCHEMA = "task int, offset long, epoch long"
JSON_SCHEMA = BASE_SCHEMA + ", value string"

DEFAULT_RECORDS_PER_PARTITION = 1_000_000
DEFAULT_RECORDS_PER_REQUEST = 32_768
DEFAULT_MAX_BYTES_PER_REQUEST = 16 << 20
#: DepotRead requests a Spark task keeps in flight: enough to hide a round trip behind decoding
READ_WINDOW = 3
#: a Spark task's first DepotRead is this small, so decoding (and Spark) start while the big ones are read
FIRST_REQUEST_RECORDS = 4096
#: rows per Arrow batch handed to Spark (slices of a reply's batch)
ARROW_BATCH_ROWS = 8192
RPC_TIMEOUT_S = 30.0
#: how long a read or a planning call keeps following leader moves before it gives up
RETRY_S = 45.0

EARLIEST = -2
LATEST = -1


# ---------------------------------------------------------------------------------------------- errors


class MillraceSourceError(Exception):
    """Base of the errors the Spark sources raise; the message says what to do."""


class SourceOptionError(MillraceSourceError, ValueError):
    """A missing or malformed option of ``millrace.depot`` / ``millrace.pstate``."""


class DepotOffsetOutOfRange(MillraceSourceError):
    """Offsets a query committed (or planned) are no longer in the depot: truncated or trimmed (KIP-320).

    ``problems`` holds one dict per partition: task, kind (``truncated`` |
    ``trimmed``), committed offset and epoch, and the partition's current
    start, end and leader epoch.
    """

    def __init__(self, module: str, depot: str, problems: list[dict[str, Any]]) -> None:
        self.module = module
        self.depot = depot
        self.problems = problems
        lines = []
        for p in problems:
            if p["kind"] == "truncated":
                lines.append(
                    f"partition {p['task']}: offset {p['offset']} (read at leader epoch {p['epoch']}) is beyond "
                    f"the applied end {p['end']} (leader epoch {p['current_epoch']}): the log was truncated "
                    f"(data loss, or the module was destroyed and deployed again)")
            else:
                lines.append(
                    f"partition {p['task']}: offset {p['offset']} (read at leader epoch {p['epoch']}) is below "
                    f"the partition start {p['start']} (leader epoch {p['current_epoch']}): records "
                    f"[{p['offset']}, {p['start']}) were trimmed before this query read them")
        super().__init__(
            f"depot {module}/{depot}: committed offsets are no longer valid; refusing to skip or re-read "
            f"records silently.\n  " + "\n  ".join(lines) + "\nTo start over knowingly, run the query with a new "
            "checkpointLocation (and startingOffsets=earliest or latest), or delete this query's checkpoint.")


class ValueSchemaMismatch(MillraceSourceError):
    """A record does not fit the ``valueSchema`` option (not a dict, or a field of the wrong type)."""


# ---------------------------------------------------------------------------------------------- options


def _opt(options: Mapping[str, str], name: str) -> str | None:
    """Options arrive case-insensitive from Spark but as plain dicts from tests and helpers."""
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return None


def _required(options: Mapping[str, str], name: str, source: str, example: str) -> str:
    v = _opt(options, name)
    if v is None or not v.strip():
        raise SourceOptionError(f"{source} needs option {name!r}, e.g. .option({name!r}, {example!r})")
    return v.strip()


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = _opt(options, name)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0:
        raise SourceOptionError(f"option {name} must be a whole number > 0, got {raw!r}")
    return n


@dataclass(frozen=True)
class DepotOptions:
    """The validated options of one ``millrace.depot`` read."""

    cluster: str
    module: str
    depot: str
    starting_offsets: str | dict[int, int] = "earliest"
    max_records_per_trigger: int | None = None
    value_schema: str | None = None
    records_per_partition: int = DEFAULT_RECORDS_PER_PARTITION
    min_partitions: int | None = None
    records_per_request: int = DEFAULT_RECORDS_PER_REQUEST
    max_bytes_per_request: int = DEFAULT_MAX_BYTES_PER_REQUEST

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DepotOptions:
        cluster = _required(options, "cluster", SOURCE_NAME, "127.0.0.1:2181")
        module = _required(options, "module", SOURCE_NAME, "Clicks")
        depot = _required(options, "depot", SOURCE_NAME, "*clicks")
        if not depot.startswith("*"):
            raise SourceOptionError(f"depot names start with '*' (e.g. '*{depot}'), got {depot!r}")
        raw_start = (_opt(options, "startingOffsets") or "earliest").strip()
        starting: str | dict[int, int]
        if raw_start.lower() in ("earliest", "latest"):
            starting = raw_start.lower()
        else:
            starting = _parse_starting_json(raw_start)
        value_schema = _opt(options, "valueSchema")
        if value_schema is not None and not value_schema.strip():
            raise SourceOptionError("option valueSchema is empty; give a DDL string like 'user string, n long' "
                                    "or leave it out to get the record as JSON in column `value`")
        mrpt = _positive(options, "maxRecordsPerTrigger", None)
        rpp = _positive(options, "recordsPerPartition", DEFAULT_RECORDS_PER_PARTITION)
        minp = _positive(options, "minPartitions", None)
        rpr = _positive(options, "recordsPerRequest", DEFAULT_RECORDS_PER_REQUEST)
        mbr = _positive(options, "maxBytesPerRequest", DEFAULT_MAX_BYTES_PER_REQUEST)
        assert rpp is not None and rpr is not None and mbr is not None
        if mbr > 48 << 20:
            raise SourceOptionError(f"maxBytesPerRequest must be at most {48 << 20} (gRPC messages are capped "
                                    f"at 64 MiB), got {mbr}")
        return cls(cluster, module, depot, starting, mrpt, value_schema.strip() if value_schema else None,
                   rpp, minp, rpr, mbr)

    def schema_ddl(self) -> str:
        return f"{BASE_SCHEMA}, {self.value_schema}" if self.value_schema else JSON_SCHEMA


def _parse_starting_json(raw: str) -> dict[int, int]:
    hint = ('startingOffsets must be "earliest", "latest" or JSON like {"0": 120, "1": -2} '
            "(task -> offset; -2 = earliest, -1 = latest)")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise SourceOptionError(f"{hint}; got {raw!r}") from None
    if not isinstance(doc, dict):
        raise SourceOptionError(f"{hint}; got {raw!r}")
    out: dict[int, int] = {}
    for k, v in doc.items():
        if isinstance(v, dict):  # accept our own streaming offset format too
            v = v.get("offset")
        try:
            task = int(k)
        except ValueError:
            raise SourceOptionError(f"{hint}; key {k!r} is not a task number") from None
        if not isinstance(v, int) or isinstance(v, bool) or v < -2:
            raise SourceOptionError(f"{hint}; offset {v!r} for task {k} is not an offset >= -2")
        out[task] = v
    return out


# ---------------------------------------------------------------------------------------------- metadata


_CHANNELS: dict[str, grpc.Channel] = {}
_CHANNELS_LOCK = threading.Lock()


def _stub(address: str) -> pbg.ClientStub:
    """A stub on a channel shared by every read in this Python process (Spark reuses its workers)."""
    with _CHANNELS_LOCK:
        ch = _CHANNELS.get(address)
        if ch is None:
            ch = _CHANNELS[address] = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    return pbg.ClientStub(ch)


_SESSIONS: dict[tuple[int, str], Metastore] = {}
_SESSIONS_LOCK = threading.Lock()


def _shared_session(zk_hosts: str) -> Metastore:
    """A ZooKeeper session kept for every planning in this process (Spark reuses its Python planner workers).

    Only the connection is shared: every planning still reads the module and
    its leaders from ZooKeeper and the offsets from the leaders, so nothing a
    plan depends on is cached. A session that fails is dropped and replaced.
    """
    key = (os.getpid(), zk_hosts)  # a forked child must not use its parent's session
    with _SESSIONS_LOCK:
        ms = _SESSIONS.get(key)
        if ms is None or not ms.connected:
            if ms is not None:
                ms.close()
            ms = Metastore(zk_hosts, session_timeout=10.0).start()
            _SESSIONS[key] = ms
        return ms


def _drop_shared_session(ms: Metastore) -> None:
    with _SESSIONS_LOCK:
        for key, cached in list(_SESSIONS.items()):
            if cached is ms:
                del _SESSIONS[key]
    ms.close()


class ModuleMeta:
    """Where a module's task groups are led: read from ZooKeeper, refreshed only when a call needs it.

    Used on the Spark driver for planning and, on executors, only after a read
    failed with ``NotLeader`` or an unreachable node. Holds a kazoo session, so
    it is never pickled: readers keep it out of their state. With ``shared``,
    the session is this process's shared one (see :func:`_shared_session`),
    which ``close`` leaves open.
    """

    def __init__(self, zk_hosts: str, module: str, *, shared: bool = False) -> None:
        self.zk_hosts = zk_hosts
        self.module = module
        self._shared = shared
        try:
            if shared:
                self._ms = _shared_session(zk_hosts)
                try:
                    spec = self._spec()
                except MetastoreError:  # a broken shared session: start over with a new one
                    _drop_shared_session(self._ms)
                    self._ms = _shared_session(zk_hosts)
                    spec = self._spec()
            else:
                self._ms = Metastore(zk_hosts, session_timeout=10.0)
                self._ms.start()
                spec = self._spec()
        except MetastoreError as e:
            raise MillraceSourceError(f"cannot reach ZooKeeper at {zk_hosts!r} (option `cluster`): {e}; check the "
                                      "connect string and that the cluster runs (`conductor status`)") from e
        self.spec = spec
        self.tasks: int = spec.tasks
        self.groups: int = spec.threads

    def _spec(self) -> Any:
        try:
            self.router = LeaderRouter(self._ms)
            spec = self.router.routes(self.module).spec
        except ModuleNotFound:
            known = self._ms.list_modules()
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

    def refresh(self) -> None:
        """Reload every group's leader and epoch (and forget their addresses, which may have moved)."""
        try:
            routes = self.router.routes(self.module, refresh=True)
        except MetastoreError as e:
            raise MillraceSourceError(f"cannot read the task groups of module {self.module}: {e}") from e
        for st in routes.groups.values():
            if st.leader is not None:
                self.router.forget(st.leader)

    def leader(self, group: int) -> tuple[str, int]:
        """(gRPC address, epoch) of the group's leader; Unavailable while it has none."""
        return self.router.leader(self.module, group)

    def call(self, group: int, method: str, request: Any, *, timeout_s: float = RPC_TIMEOUT_S) -> Any:
        """One unary RPC to the group's leader, following leader moves for up to ``RETRY_S``."""
        r = Retry(RETRY_S, f"{self.module}/{group}", first_delay=0.05, max_delay=1.0)
        while True:
            try:
                address, _epoch = self.leader(group)
                return getattr(_stub(address), method)(request, timeout=timeout_s)
            except (grpc.RpcError, Unavailable) as e:
                err: Exception = e
            time.sleep(r.backoff(err))
            self.refresh()

    def depot_statuses(self, depot: str) -> dict[int, PartitionStatus]:
        """PartitionInfo of every task of `depot` (asked of each group's leader, all at once).

        Any failure of the first, concurrent round goes through :meth:`call`,
        which follows leader moves and raises what the leader said.
        """
        first: dict[int, Any] = {}
        for task in range(self.tasks):
            try:
                address, _epoch = self.leader(self.group_of(task))
            except Unavailable:
                continue
            req = pb.PartitionInfoRequest(module=self.module, depot=depot, task=task)
            first[task] = _stub(address).PartitionInfo.future(req, timeout=RPC_TIMEOUT_S)
        out: dict[int, PartitionStatus] = {}
        for task in range(self.tasks):
            req = pb.PartitionInfoRequest(module=self.module, depot=depot, task=task)
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
            out[task] = PartitionStatus(task, int(r.start), int(r.end), int(r.epoch))
        return out

    def _known(self, what: str) -> list[str]:
        """Depot or PState names for an error message (needs the module code importable here)."""
        try:
            from topology.module import load_module

            d = load_module(self.spec.module_ref).build()
            return list(d.depot_names() if what == "depots" else d.pstate_names())
        except Exception:
            return [f"(unknown: module code {self.spec.module_ref} is not importable here)"]


# ---------------------------------------------------------------------------------------------- offsets


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


# ---------------------------------------------------------------------------------------------- reading


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
                 address: str, records_per_request: int, max_bytes: int) -> None:
        super().__init__(group)
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


def _split(ranges: list[TaskRange], parts: int) -> list[list[TaskRange]]:
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
        for piece in _split(rs, min(parts, n)):
            out.append(DepotPartition(opts.cluster, opts.module, opts.depot, group, piece, address,
                                      opts.records_per_request, opts.max_bytes_per_request))
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(o)).decode("ascii")
    if isinstance(o, set | frozenset):
        return sorted(o, key=repr)
    raise TypeError(f"a value of type {type(o).__name__} cannot be written as JSON")


def _json_safe(o: Any) -> Any:
    """Slow path for what the JSON encoder refuses (e.g. tuple map keys): keys become strings."""
    if isinstance(o, dict):
        return {k if isinstance(k, str) else json.dumps(_json_safe(k), default=_json_default): _json_safe(v)
                for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_json_safe(x) for x in o]
    return o


def _make_json_encoder() -> Any:
    """The C JSON encoder called directly: saves ~1 us per record over ``json.dumps`` (Python pays per call)."""
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - CPython always has it
        c_make_encoder = None
    if c_make_encoder is None:  # pragma: no cover
        enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_json_default)
        return enc.encode
    c = c_make_encoder(None, _json_default, encode_basestring, None, ":", ",", False, False, True)

    def encode(o: Any) -> str:
        return "".join(c(o, 0))

    return encode


_TO_JSON = _make_json_encoder()


def to_json(value: Any) -> str:
    """A record as compact JSON (bytes as base64, non-string map keys as their JSON)."""
    try:
        s: str = _TO_JSON(value)
        return s
    except (TypeError, ValueError):
        return json.dumps(_json_safe(value), ensure_ascii=False, separators=(",", ":"), default=_json_default)


_BIGINT_EXT = 1  # pstate's msgpack ext type for ints beyond 64 bits (signed big-endian bytes)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _BIGINT_EXT:
        return int.from_bytes(data, "big", signed=True)
    return msgpack.ExtType(code, data)


#: a reply's records: a list of bytes, or one Arrow binary array over a packed reply's buffer (no copy per record)
Raw: TypeAlias = Sequence[bytes] | pa.BinaryArray


def unpack_reply(reply: Any) -> Raw:
    """The records of a ``DepotReadReply``, packed (``packed`` + ``lengths``) or not (``records``)."""
    if not reply.lengths:
        return reply.records
    lengths = np.frombuffer(reply.lengths, "<u4")
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = reply.packed
    if offsets[-1] != len(data) or len(data) >= 1 << 31:
        raise MillraceSourceError(f"DepotRead reply holds {len(data)} packed bytes but its lengths add up to "
                                  f"{offsets[-1]}; the node and this client disagree on the protocol")
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths),
                                       [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def decode_records(raw: Raw) -> list[Any]:
    """Many msgpack records in one C call: prefix their concatenation with a msgpack array32 header.

    Decodes the store's own encoding too (big ints as ext type 1), so records
    served as stored bytes, without a re-encode on the node, read the same.
    """
    if not len(raw):
        return []
    if isinstance(raw, pa.BinaryArray):
        bounds = np.frombuffer(raw.buffers()[1], np.int32, len(raw) + 1, offset=4 * raw.offset)
        body = raw.buffers()[2].slice(int(bounds[0]), int(bounds[-1] - bounds[0]))
        blob = b"".join([b"\xdd", struct.pack(">I", len(raw)), body])
    else:
        blob = b"".join([b"\xdd", struct.pack(">I", len(raw)), *raw])
    records: list[Any] = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext_hook)
    return records


# ---------------------------------------------------------------------------------------------- fast decode


def _msgpack_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per msgpack type byte: kind, header size, fixed payload size, size of the big-endian length/value.

    ``kind``: 0 = not handled here (a non-empty container, 0xc1), 1 nil, 2 bool, 3 int, 4 float, 5 str,
    6 = other scalars (bin, ext, empty map/array) that can only be skipped. ``hdr``: bytes before the
    payload (type byte, length, ext type). ``nbytes``: for str/bin/ext the size of the length after the
    type byte; for ints and floats the size of the value (0: the value is the type byte itself).
    """
    kind = np.zeros(256, np.int8)
    hdr = np.ones(256, np.int64)
    fixed = np.zeros(256, np.int64)
    nbytes = np.zeros(256, np.int64)
    kind[0x00:0x80] = 3  # positive fixint
    kind[0xE0:0x100] = 3  # negative fixint
    kind[0xA0:0xC0] = 5  # fixstr
    fixed[0xA0:0xC0] = np.arange(32)
    kind[[0x80, 0x90]] = 6  # empty map / array
    kind[0xC0] = 1
    kind[[0xC2, 0xC3]] = 2
    for t, nb, k in ((0xCC, 1, 3), (0xCD, 2, 3), (0xCE, 4, 3), (0xCF, 8, 3), (0xD0, 1, 3), (0xD1, 2, 3),
                     (0xD2, 4, 3), (0xD3, 8, 3), (0xCA, 4, 4), (0xCB, 8, 4)):
        kind[t], fixed[t], nbytes[t] = k, nb, nb
    for t, nb, k in ((0xD9, 1, 5), (0xDA, 2, 5), (0xDB, 4, 5), (0xC4, 1, 6), (0xC5, 2, 6), (0xC6, 4, 6)):
        kind[t], hdr[t], nbytes[t] = k, 1 + nb, nb  # str / bin 8, 16, 32: length, payload
    for t, nb in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        kind[t], hdr[t], nbytes[t] = 6, 2 + nb, nb  # ext 8, 16, 32: length, ext type, payload
    for t, size in ((0xD4, 1), (0xD5, 2), (0xD6, 4), (0xD7, 8), (0xD8, 16)):
        kind[t], hdr[t], fixed[t] = 6, 2, size  # fixext: ext type, payload
    return kind, hdr, fixed, nbytes


_MP_KIND, _MP_HDR, _MP_FIXED, _MP_NBYTES = _msgpack_tables()
_MP_SIZE = _MP_HDR + _MP_FIXED  # an item's size, but for the length field of str / bin / ext
_NIL, _BOOL, _INT, _FLOAT, _STR, _OTHER = 1, 2, 3, 4, 5, 6
_VAR_LENGTH = np.zeros(256, bool)
_VAR_LENGTH[[0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9]] = True
_SIGNED = np.zeros(256, bool)
_SIGNED[[0xD0, 0xD1, 0xD2, 0xD3]] = True
_INT_BOUNDS = {pa.int8(): 1 << 7, pa.int16(): 1 << 15, pa.int32(): 1 << 31, pa.int64(): 1 << 63}
_EXACT_IN_DOUBLE = 1 << 53


class _Fallback(Exception):
    """The batch holds something the vectorized decoder does not handle: decode it record by record."""


class _Items:
    """msgpack items starting at ``pos``: type byte, kind, total size (header sizes and numbers on demand).

    ``words`` views the buffer as a big-endian uint64 at every byte offset, so the 8 bytes after a type
    byte (a length or a number) are one gather, not eight.
    """

    def __init__(self, buf: np.ndarray, words: np.ndarray, pos: np.ndarray) -> None:
        t = np.take(buf, pos).astype(np.intp)
        self.t = t
        self.buf = buf
        self.pos = pos
        self.words = words
        self.kind = np.take(_MP_KIND, t)
        if not self.kind.all():
            raise _Fallback
        self.size = np.take(_MP_SIZE, t)
        self.nb = np.take(_MP_NBYTES, t)
        var = np.take(_VAR_LENGTH, t)
        if var.any():
            at = np.nonzero(var)[0]
            self.size[at] += self._unsigned(at).astype(np.int64)

    def hdr(self) -> np.ndarray:
        return np.take(_MP_HDR, self.t)

    def _unsigned(self, at: np.ndarray) -> np.ndarray:
        """The nb-byte big-endian unsigned number after the type byte of the items at `at` (nb > 0)."""
        word = self.words[self.pos[at] + 1].astype(np.uint64)
        return word >> (np.uint64(64) - self.nb[at].astype(np.uint64) * np.uint64(8))  # type: ignore[no-any-return]

    def ints(self) -> tuple[np.ndarray, np.ndarray]:
        """(int64 value, fits) of integer items; fits is False for a uint64 beyond the int64 range."""
        t = self.t.astype(np.int64)
        val = np.where(t >= 0xE0, t - 256, t)  # fixints: the type byte is the value
        fits = np.ones(len(t), bool)
        big = np.nonzero(self.nb)[0]
        if len(big):
            u = self._unsigned(big)
            v = u.view(np.int64).copy()
            nb = self.nb[big]
            signed = np.take(_SIGNED, self.t[big])
            for k in (1, 2, 4):
                m = signed & (nb == k)
                if m.any():
                    v[m] = np.where(v[m] >= 1 << (8 * k - 1), v[m] - (1 << (8 * k)), v[m])
            val[big] = v
            fits[big] = ~((self.t[big] == 0xCF) & (u >= np.uint64(1 << 63)))
        return val, fits

    def floats(self) -> np.ndarray:
        """float64 values of float32/float64 items (garbage elsewhere: callers pick the floats)."""
        word = self.words[self.pos + 1].astype(np.uint64)
        f64 = word.view(np.float64)
        with np.errstate(invalid="ignore"):  # bit patterns of non-float items may be signalling NaNs
            f32 = (word >> np.uint64(32)).astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(self.t == 0xCA, f32, f64)  # type: ignore[no-any-return]


def _name_words(name: bytes) -> list[tuple[int, np.uint64, np.uint64]]:
    """A key name as (offset, mask, big-endian value) per 8-byte chunk, to compare with `words` gathers."""
    out = []
    for off in range(0, max(len(name), 1), 8):
        chunk = name[off:off + 8]
        mask = ((1 << (8 * len(chunk))) - 1) << (64 - 8 * len(chunk)) if chunk else 0
        out.append((off, np.uint64(mask), np.uint64(int.from_bytes(chunk.ljust(8, b"\0"), "big"))))
    return out


def _strings(buf: np.ndarray, first: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None = None,
             nulls: int = 0) -> pa.StringArray:
    """A string array of the byte ranges [first, first + length) of `buf`, checked to be UTF-8."""
    n = len(first)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise _Fallback
    chars = np.take(buf, np.repeat(first - offsets[:-1], lengths) + np.arange(total))
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    arr = pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(chars), bitmap, nulls)
    try:
        arr.validate(full=True)  # UTF-8, which msgpack's strict decoding insists on (for every str, keys too)
    except pa.ArrowInvalid:
        raise _Fallback from None
    return arr


def _check_skipped_strings(items: _Items) -> None:
    """Strings the columns do not take (other fields' values) must still be UTF-8, as msgpack would insist."""
    at = np.nonzero(items.kind == _STR)[0]
    if len(at):
        hdr = np.take(_MP_HDR, items.t[at])
        _strings(items.buf, items.pos[at] + hdr, items.size[at] - hdr)


class FlatDecoder:
    """msgpack dict records straight to Arrow columns, vectorized with numpy: no Python object per record.

    Handles ``valueSchema`` fields of type string, tinyint..bigint, double and
    boolean over records that are maps of scalars, stepping through the k-th
    key/value pair of every record at once (when every record has the same keys
    in the same order, as records appended by one program do, a key is checked
    once per batch). The first thing it does not handle exactly as
    ``pa.array(records, type=struct)`` would (a record that is not a map, a
    nested or big-int value, a value that would need a conversion, a key given
    twice, invalid UTF-8) makes it give the batch up; the caller then decodes
    it the general way (and fails there, with the usual error, if a record does
    not fit). Same columns either way, only slower.
    """

    def __init__(self, fields: Sequence[pa.Field]) -> None:
        self.fields = list(fields)
        self.index = {f.name: i for i, f in enumerate(self.fields)}
        self.names = [(len(f.name.encode()), _name_words(f.name.encode())) for f in self.fields]
        self.usable = bool(self.fields) and all(
            pa.types.is_string(f.type) or f.type in _INT_BOUNDS or pa.types.is_float64(f.type)
            or pa.types.is_boolean(f.type) for f in self.fields)

    def decode(self, raw: Raw) -> list[pa.Array] | None:
        """One Arrow array per field, or None when the batch needs the general decoder."""
        if not self.usable or not len(raw):
            return None
        try:
            return self._decode(raw)
        except (_Fallback, IndexError):  # IndexError: malformed records, which the general path reports
            return None

    def _decode(self, raw: Raw) -> list[pa.Array]:
        n = len(raw)
        # contiguous bytes and offsets: a packed reply already is; a list takes one C++ pass
        packed = raw if isinstance(raw, pa.BinaryArray) else pa.array(raw, type=pa.binary())
        if packed.offset != 0:
            raise _Fallback
        bounds = np.frombuffer(packed.buffers()[1], np.int32, n + 1).astype(np.int64)
        size = int(bounds[-1])
        if bounds[0] != 0 or size == 0:
            raise _Fallback
        buf = np.zeros(size + 16, np.uint8)  # padded: a word gather 8 bytes past the last type byte stays inside
        buf[:size] = np.frombuffer(packed.buffers()[2], np.uint8, size)
        words = np.ndarray((size + 8,), dtype=">u8", buffer=buf, strides=(1,))
        starts, ends = bounds[:-1], bounds[1:]
        if (ends <= starts).any():
            raise _Fallback
        h = np.take(buf, starts).astype(np.int64)  # every record must be a map: fixmap, map16 or map32
        count = np.where((h & 0xF0) == 0x80, h & 0x0F, -1)
        pos = starts + 1
        for code, nb in ((0xDE, 2), (0xDF, 4)):
            m = h == code
            if m.any():
                count[m] = (words[starts[m] + 1].astype(np.uint64) >> np.uint64(64 - 8 * nb)).astype(np.int64)
                pos[m] += nb
        if (count < 0).any():
            raise _Fallback
        if (count == count[0]).all():
            same = self._same_keys(buf, words, pos, ends, int(count[0]))
            if same is not None:
                return [self._column(f.type, buf, words, n, same.get(i), None)
                        for i, f in enumerate(self.fields)]
        return self._any_keys(buf, words, pos, ends, count)

    def _same_keys(self, buf: np.ndarray, words: np.ndarray, pos: np.ndarray, ends: np.ndarray,
                   count: int) -> dict[int, _Items] | None:
        """Each field's values when every record has the same keys in the same order; None if they differ."""
        found: dict[int, _Items] = {}
        for _e in range(count):
            t = np.take(buf, pos)
            t0 = int(t[0])
            if not 0xA0 <= t0 <= 0xBF or not (t == t0).all():
                return None  # not all the same short key (fixstr)
            klen = t0 & 0x1F
            kstart = pos + 1
            vpos = kstart + klen
            if (vpos >= ends).any():
                raise _Fallback
            k0 = int(kstart[0])
            for off in range(0, klen, 8):
                w = words[kstart + off].astype(np.uint64)
                if klen - off < 8:
                    w >>= np.uint64(64 - 8 * (klen - off))
                if not (w == w[0]).all():
                    return None
            items = _Items(buf, words, vpos)
            pos = vpos + items.size
            if (pos > ends).any():
                raise _Fallback
            try:
                i = self.index.get(buf[k0:k0 + klen].tobytes().decode())
            except UnicodeDecodeError:
                raise _Fallback from None
            if i is None:
                _check_skipped_strings(items)
            else:
                if i in found:
                    raise _Fallback  # a key twice in one record (the general decoder keeps the last)
                found[i] = items
        if not (pos == ends).all():
            raise _Fallback
        return found

    def _any_keys(self, buf: np.ndarray, words: np.ndarray, pos: np.ndarray, ends: np.ndarray,
                  count: np.ndarray) -> list[pa.Array]:
        """Records with keys in any order, any subset: find each field's value in each record."""
        n = len(pos)
        where = np.full((len(self.fields), n), -1, np.int64)  # each field's value position per record; -1: absent
        hits = [0] * len(self.fields)
        everyone = np.arange(n)
        for e in range(int(count.max())):
            active = everyone[count > e]
            p = pos[active]
            end = ends[active]
            key = _Items(buf, words, p)
            if not (key.kind == _STR).all():
                raise _Fallback
            vpos = p + key.size
            if (vpos >= end).any():
                raise _Fallback
            kstart = p + key.hdr()
            klen = vpos - kstart
            _strings(buf, kstart, klen)  # keys must be UTF-8 too
            first_words = words[kstart].astype(np.uint64)
            matched = np.zeros(len(p), bool)
            for i, (length, chunks) in enumerate(self.names):
                _off, mask, want = chunks[0]
                hit = np.nonzero((klen == length) & ((first_words & mask) == want))[0]
                for off, mask, want in chunks[1:]:  # long names: only where the key is that long
                    hit = hit[(words[kstart[hit] + off].astype(np.uint64) & mask) == want]
                if len(hit):
                    where[i, active[hit]] = vpos[hit]
                    hits[i] += len(hit)
                    matched[hit] = True
            values = _Items(buf, words, vpos)
            if not matched.all():
                skipped = np.nonzero(~matched)[0]
                _check_skipped_strings(_Items(buf, words, vpos[skipped]))
            nxt = vpos + values.size
            if (nxt > end).any():
                raise _Fallback
            pos[active] = nxt
        if not (pos == ends).all():
            raise _Fallback
        out = []
        for i, f in enumerate(self.fields):
            present = np.nonzero(where[i] >= 0)[0]
            if len(present) != hits[i]:
                raise _Fallback  # a key twice in one record (the general decoder keeps the last)
            items = _Items(buf, words, where[i][present]) if len(present) else None
            out.append(self._column(f.type, buf, words, n, items, None if len(present) == n else present))
        return out

    @staticmethod
    def _column(typ: pa.DataType, buf: np.ndarray, words: np.ndarray, n: int, items: _Items | None,
                present: np.ndarray | None) -> pa.Array:
        """The Arrow array of one field: `items` are its values in the records `present` (None: all)."""
        if items is None:
            return pa.nulls(n, typ)
        set_ = items.kind != _NIL
        dense = present is None and bool(set_.all())  # a non-null value in every record
        if dense:
            rows = None
            kinds = items.kind
            mask = None
            nulls = 0
        else:
            rows = (np.arange(n) if present is None else present)[set_]
            kinds = items.kind[set_]
            mask = np.ones(n, bool)
            mask[rows] = False
            nulls = n - len(rows)

        def spread(values: np.ndarray, dtype: Any) -> np.ndarray:
            """Per-item values as one per record (zero where null)."""
            if rows is None:
                return values.astype(dtype, copy=False)
            out = np.zeros(n, dtype)
            out[rows] = values[set_]
            return out

        if pa.types.is_string(typ):
            if not (kinds == _STR).all():
                raise _Fallback
            hdr = items.hdr()
            return _strings(buf, spread(items.pos + hdr, np.int64), spread(items.size - hdr, np.int64),
                            None if mask is None else ~mask, nulls)
        if pa.types.is_boolean(typ):
            if not (kinds == _BOOL).all():
                raise _Fallback
            return pa.array(spread(items.t == 0xC3, bool), mask=mask, type=typ)
        ints, fits = items.ints()
        sel_ints = ints if rows is None else ints[set_]
        sel_fits = fits if rows is None else fits[set_]
        if pa.types.is_float64(typ):
            whole = kinds != _FLOAT
            if not ((kinds == _FLOAT) | (kinds == _INT)).all() or not sel_fits[whole].all() \
                    or (np.abs(sel_ints[whole]) >= _EXACT_IN_DOUBLE).any():
                raise _Fallback  # pyarrow refuses ints a double cannot hold exactly
            doubles = np.where(items.kind == _FLOAT, items.floats(), ints.astype(np.float64))
            return pa.array(spread(doubles, np.float64), mask=mask, type=typ)
        bound = _INT_BOUNDS[typ]
        if not (kinds == _INT).all() or not sel_fits.all() or ((sel_ints < -bound) | (sel_ints >= bound)).any():
            raise _Fallback
        return pa.array(spread(ints, typ.to_pandas_dtype()), mask=mask, type=typ)

class RowBuilder:
    """Turns a reply's records into one Arrow record batch in exactly the schema Spark expects.

    Columns named task / offset / epoch get the metadata (wherever they are);
    ``value`` gets the JSON of the record when no ``valueSchema`` was given;
    every other column is a field of the (dict) record.
    """

    def __init__(self, schema: StructType, json_value: bool) -> None:
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.names = schema.fieldNames()
        self.json_value = json_value and "value" in self.names and isinstance(schema["value"].dataType, StringType)
        self.fields = [n for n in self.names if n not in META_COLUMNS and not (self.json_value and n == "value")]
        self.struct = pa.struct([self.arrow_schema.field(n) for n in self.fields]) if self.fields else None
        self.flat = FlatDecoder([self.arrow_schema.field(n) for n in self.fields])

    def batch(self, task: int, first: int, epoch: int, raw: Raw) -> pa.RecordBatch:
        n = len(raw)
        cols: dict[str, pa.Array] = {
            "task": pa.array(np.full(n, task, dtype=np.int32)),
            "offset": pa.array(np.arange(first, first + n, dtype=np.int64)),
            "epoch": pa.array(np.full(n, epoch, dtype=np.int64)),
        }
        flat = None if self.json_value else self.flat.decode(raw)
        if flat is not None:
            cols.update(zip(self.fields, flat, strict=True))
        else:
            cols.update(self._general(task, first, raw))
        arrays = [cols[name] if name in cols else pa.nulls(n, self.arrow_schema.field(name).type)
                  for name in self.names]
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _general(self, task: int, first: int, raw: Raw) -> dict[str, pa.Array]:
        """Every record decoded to Python objects, then converted by pyarrow (JSON, or what FlatDecoder skips)."""
        cols: dict[str, pa.Array] = {}
        records = decode_records(raw)
        if self.json_value:
            enc = to_json
            cols["value"] = pa.array([enc(r) for r in records], type=pa.string())
        if self.struct is not None:
            try:
                structs = pa.array(records, type=self.struct)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                raise self._mismatch(task, first, records) from None
            for f, arr in zip(self.fields, _children(structs), strict=True):
                cols[f] = arr
        return cols

    def _mismatch(self, task: int, first: int, records: list[Any]) -> ValueSchemaMismatch:
        """Find the first record that does not convert, to name it (slow path, only on error)."""
        assert self.struct is not None
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                return ValueSchemaMismatch(
                    f"record at task {task} offset {first + i} is a {type(r).__name__} ({_short(r)}), but option "
                    f"valueSchema needs dict records; drop valueSchema to read it as JSON in column `value`")
            try:
                pa.array([r], type=self.struct)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                bad = [f.name for f in self.struct if not _fits(r.get(f.name), f.type)]
                return ValueSchemaMismatch(
                    f"record at task {task} offset {first + i} does not fit valueSchema {self.struct}: field(s) "
                    f"{bad} of {_short(r)} ({e}); fix valueSchema, or read `value` as JSON without it")
        return ValueSchemaMismatch(f"records of task {task} from offset {first} do not fit valueSchema {self.struct}")


def _children(structs: pa.StructArray) -> list[pa.Array]:
    """Child arrays of a struct array, with top-level nulls (a None record) pushed down."""
    if structs.null_count:
        flat: list[pa.Array] = structs.flatten()
        return flat
    return [structs.field(i) for i in range(structs.type.num_fields)]


def _fits(value: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([value], type=typ)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return False


def _short(r: Any) -> str:
    s = repr(r)
    return s if len(s) <= 120 else s[:117] + "..."


class _Fetcher:
    """Reads the ranges of one Spark partition from their group's leader, several requests in flight.

    Offsets are dense, so request boundaries are known before any reply comes
    back: up to ``READ_WINDOW`` requests travel while the caller decodes. A
    reply cut short by ``max_bytes`` is continued at once. Each reply is
    checked: it must start where asked (else the start was trimmed), it must
    not come from an epoch older than planned (a zombie leader), and an empty
    reply before ``end`` means the leader lost applied records (truncation);
    the first two make it look the leader up again, the last fails the read.
    """

    def __init__(self, p: DepotPartition) -> None:
        self.p = p
        self.address = p.address
        self.min_epoch = max((r.epoch for r in p.ranges), default=0)
        self._meta: ModuleMeta | None = None

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()

    def _request(self, r: TaskRange) -> Any:
        p = self.p
        req = pb.DepotReadRequest(module=p.module, depot=p.depot, task=r.task, start=r.start, end=r.end,
                                  max_bytes=p.max_bytes, packed=True)
        return _stub(self.address).DepotRead.future(req, timeout=RPC_TIMEOUT_S)

    def _relocate(self, why: Exception | str, deadline: float) -> None:
        p = self.p
        if time.monotonic() > deadline:
            cause = why if isinstance(why, Exception) else None
            raise MillraceSourceError(f"depot {p.module}/{p.depot} task group {p.group}: could not reach a serving "
                                      f"leader within {RETRY_S:.0f}s ({why}); check `conductor status`") from cause
        log.info("depot %s/%s group %d: %s; looking up the leader again", p.module, p.depot, p.group, why)
        time.sleep(0.1)
        if self._meta is None:
            self._meta = ModuleMeta(p.zk_hosts, p.module)
        else:
            self._meta.refresh()
        self.address, _ = self._meta.leader(p.group)

    def _status(self, task: int) -> PartitionStatus:
        r = _stub(self.address).PartitionInfo(
            pb.PartitionInfoRequest(module=self.p.module, depot=self.p.depot, task=task), timeout=RPC_TIMEOUT_S)
        return PartitionStatus(task, int(r.start), int(r.end), int(r.epoch))

    def chunks(self) -> Iterator[tuple[int, int, int, Raw]]:
        """(task, first offset, epoch, msgpack records) per reply, in plan order."""
        p = self.p
        deadline = time.monotonic() + RETRY_S
        todo: deque[TaskRange] = deque()
        size = min(p.records_per_request, FIRST_REQUEST_RECORDS)
        for r in p.ranges:
            s = r.start
            while s < r.end:
                todo.append(TaskRange(r.task, s, min(r.end, s + size), r.epoch))
                s += size
                size = p.records_per_request
        pending: deque[tuple[TaskRange, Any]] = deque()

        def requeue(current: TaskRange) -> None:
            """Put the failed request and every one in flight back, in order, to send again."""
            back = [current, *(r for r, _f in pending)]
            for _r, f in pending:
                f.cancel()
            pending.clear()
            todo.extendleft(reversed(back))

        try:
            while todo or pending:
                while len(pending) < READ_WINDOW and todo:
                    r = todo.popleft()
                    pending.append((r, self._request(r)))
                r, fut = pending.popleft()
                try:
                    reply = fut.result()
                    if reply.epoch < self.min_epoch:
                        raise NotLeader(f"{p.module}/{p.group}", None, int(reply.epoch))
                except (grpc.RpcError, NotLeader) as exc:
                    err = error_from_rpc(exc) if isinstance(exc, grpc.RpcError) else exc
                    requeue(r)
                    if isinstance(err, DepotNotFound):
                        raise SourceOptionError(f"module {p.module} has no depot {p.depot!r} (any more)") from None
                    if not retryable(err):
                        raise err from None
                    self._relocate(err, deadline)
                    continue
                raw = unpack_reply(reply)
                got = len(raw)
                if got == 0 or reply.start != r.start:
                    requeue(r)
                    self._check_range(r, reply, deadline)
                    continue
                if reply.next != reply.start + got:
                    raise MillraceSourceError(
                        f"depot {p.module}/{p.depot} partition {r.task}: reply for [{r.start}, {r.end}) holds {got} "
                        f"records but spans [{reply.start}, {reply.next}); depot partitions never have gaps")
                self.min_epoch = max(self.min_epoch, int(reply.epoch))
                yield r.task, r.start, int(reply.epoch), raw
                deadline = time.monotonic() + RETRY_S  # progress: the retry budget is per stall, not per read
                if reply.next < r.end:  # cut by max_bytes: continue this range before the ones in flight
                    rest = TaskRange(r.task, int(reply.next), r.end, r.epoch)
                    pending.appendleft((rest, self._request(rest)))
        finally:
            for _r, f in pending:
                f.cancel()
            self.close()

    def _check_range(self, r: TaskRange, reply: Any, deadline: float) -> None:
        """An empty or misplaced reply: trimmed start or truncated end fails the read; anything else retries."""
        p = self.p
        try:
            st = self._status(r.task)
        except grpc.RpcError as e:
            self._relocate(error_from_rpc(e), deadline)
            return
        if st.start > r.start or st.end < r.end:
            validate_offsets(p.module, p.depot, {r.task: (r.start if st.start > r.start else r.end, r.epoch)},
                             {r.task: st})
        self._relocate(f"reply [{reply.start}, {reply.next}) at epoch {reply.epoch} for requested "
                       f"[{r.start}, {r.end}) while the partition holds [{st.start}, {st.end}) at epoch {st.epoch}",
                       deadline)


def read_partition(p: DepotPartition, rows: RowBuilder) -> Iterator[pa.RecordBatch]:
    """The partition's records as Arrow batches of at most ``ARROW_BATCH_ROWS`` rows (zero-copy slices).

    Spark's task thread reads a batch from the Python worker only after it has
    processed the one before, so smaller batches keep it busy while this
    process decodes the next reply, and leave it less to do once we are done.
    """
    for task, first, epoch, raw in _Fetcher(p).chunks():
        batch = rows.batch(task, first, epoch, raw)
        if batch.num_rows <= ARROW_BATCH_ROWS:
            yield batch
        else:
            for i in range(0, batch.num_rows, ARROW_BATCH_ROWS):
                yield batch.slice(i, ARROW_BATCH_ROWS)


# ---------------------------------------------------------------------------------------------- Spark API


def _starts(opts: DepotOptions, statuses: Mapping[int, PartitionStatus]) -> dict[int, int]:
    """Resolve ``startingOffsets`` against the partitions as they are now."""
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


class DepotDataSource(DataSource):
    """``spark.read``/``spark.readStream`` ``.format("millrace.depot")``: see the module docstring."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = DepotOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return self.opts.schema_ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        return DepotBatchReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DepotStreamReader(self.opts, schema)


class DepotBatchReader(DataSourceReader):
    """Everything applied when the query is planned (from ``startingOffsets``, default earliest)."""

    def __init__(self, opts: DepotOptions, schema: StructType) -> None:
        if opts.starting_offsets == "latest":
            raise SourceOptionError("startingOffsets=latest makes an empty batch read; use it with readStream, "
                                    "or give earliest / per-task JSON offsets")
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[DepotPartition]:
        with ModuleMeta(self.opts.cluster, self.opts.module, shared=True) as meta:
            statuses = meta.depot_statuses(self.opts.depot)
            starts = _starts(self.opts, statuses)
            ranges = {t: (starts[t], st.end) for t, st in statuses.items()}
            return plan_partitions(self.opts, meta, ranges, {t: st.epoch for t, st in statuses.items()})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, DepotPartition)
        return read_partition(partition, RowBuilder(self.schema, self.opts.value_schema is None))


class DepotStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Microbatches over applied offsets, with admission control and ``Trigger.AvailableNow``.

    Lives in Spark's long-running Python planner process (offsets and
    partitions) and is also pickled to executors (``read``); the ZooKeeper
    session is opened lazily and never pickled.
    """

    def __init__(self, opts: DepotOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._meta: ModuleMeta | None = None
        self._target: dict[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_meta"] = None
        return state

    def _m(self) -> ModuleMeta:
        if self._meta is None:
            self._meta = ModuleMeta(self.opts.cluster, self.opts.module)
        return self._meta

    def _statuses(self) -> dict[int, PartitionStatus]:
        m = self._m()
        m.refresh()
        return m.depot_statuses(self.opts.depot)

    def initialOffset(self) -> dict[str, Any]:
        statuses = self._statuses()
        starts = _starts(self.opts, statuses)
        return offsets_to_json({t: (starts[t], statuses[t].epoch) for t in statuses})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the applied ends as of now: an availableNow run stops there even while appends go on."""
        self._target = {t: st.end for t, st in self._statuses().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        statuses = self._statuses()
        committed = offsets_from_json(start)
        # A task added since the query started (scale-up) begins at its earliest offset.
        starts = {t: committed[t][0] if t in committed else statuses[t].start for t in statuses}
        validate_offsets(self.opts.module, self.opts.depot, {t: committed[t] for t in committed}, statuses)
        ends = {t: st.end for t, st in statuses.items()}
        if self._target is not None:
            ends = {t: max(starts[t], min(e, self._target.get(t, starts[t]))) for t, e in ends.items()}
        if isinstance(limit, ReadMaxRows):
            ends = apply_limit(starts, ends, limit.max_rows)
        out = {}
        for t in statuses:
            if t in committed and ends[t] == committed[t][0]:
                out[t] = committed[t]  # unchanged: keep its epoch so an idle source reports no new data
            else:
                out[t] = (ends[t], statuses[t].epoch)
        return offsets_to_json(out)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        statuses = self._statuses()
        return offsets_to_json({t: (st.end, st.epoch) for t, st in statuses.items()})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        s = offsets_from_json(start)
        e = offsets_from_json(end)
        statuses = self._statuses()
        # On a restart Spark replays the last planned batch straight from its offset log: check it again.
        validate_offsets(self.opts.module, self.opts.depot, {**s, **e}, statuses)
        validate_offsets(self.opts.module, self.opts.depot, s, statuses)
        ranges = {t: (s[t][0] if t in s else statuses[t].start, off) for t, (off, _ep) in e.items()}
        return plan_partitions(self.opts, self._m(), ranges, {t: ep for t, (_o, ep) in e.items()})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, DepotPartition)
        return read_partition(partition, RowBuilder(self.schema, self.opts.value_schema is None))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: Millrace keeps no consumer state; the checkpoint holds the offsets."""

    def stop(self) -> None:
        if self._meta is not None:
            self._meta.close()
            self._meta = None
