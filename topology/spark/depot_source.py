"""``millrace.depot``: a depot as a Spark data source, for batch reads and Structured Streaming.

    from topology.spark import register
    register(spark)
    df = (spark.readStream.format("millrace.depot")
          .option("cluster", "zk1:2181,zk2:2181").option("module", "Clicks").option("depot", "*clicks")
          .option("valueSchema", "user string, n long")      # optional: record fields as columns
          .load())

Rows are ``task int, offset long, epoch long`` plus either ``value string`` (the
record as JSON; bytes become base64 strings) or, with ``valueSchema``, one
column per field of a dict record (missing fields are null, extra fields are
dropped, a field of the wrong type fails the read naming task and offset).
``epoch`` is the leader epoch of the replica that served the record.

Options: ``cluster`` (ZooKeeper connect string), ``module``, ``depot`` (required);
``startingOffsets`` = ``earliest`` (default) | ``latest`` | JSON ``{"<task>": offset}``
(-2 = earliest, -1 = latest, like Kafka), or ``startingTimestamp`` (ms since the epoch:
each task starts at its first record at or after that time, the depot's offset for
the time as :meth:`conductor.client.Depot.offset_for_time` finds it; at its end when
no record is that recent); batch reads only: ``endingOffsets`` = ``latest`` (default)
| JSON ``{"<task>": offset}`` (exclusive, -1 = latest) or ``endingTimestamp`` (ms,
exclusive: the offset for that time); ``maxRecordsPerTrigger`` (streaming,
shared across tasks in proportion to their backlog); ``valueSchema`` (DDL);
tuning: ``minPartitions`` (default: one Spark partition per task group),
``recordsPerPartition`` (default 1,000,000), ``recordsPerRequest`` (default
8,192: one reply, one Arrow batch) and ``maxBytesPerRequest`` (default 16 MiB).

The source is split by role: :mod:`~topology.spark.options` (parsing),
:mod:`~topology.spark.planning` (leaders, offsets, partitions),
:mod:`~topology.spark.fetch` (reads on executors) and
:mod:`~topology.spark.arrow` (decoding); this module holds the DataSource
classes Spark calls.

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
* **Python pays per object, and per call.** A Spark task reads its whole
  partition on one ``DepotStream`` (the leader pushes packed replies of
  ``recordsPerRequest`` records under gRPC's flow control, the next travelling
  while this one is decoded; the first one is small so decoding starts early;
  pipelined ``DepotRead`` calls on a worker without the stream) and hands Spark
  whole Arrow record batches. With ``valueSchema`` over dict records of scalar fields,
  :class:`FlatDecoder` turns a reply's msgpack straight into Arrow columns
  with numpy, one vectorized step per key/value position instead of a Python
  dict per record (2-3x less CPU than msgpack + pyarrow), or, where its C
  kernel is built (``_flat.c``), in one pass over the bytes (a third of that
  again); anything it does not handle exactly goes the general way (one msgpack call per reply, then
  pyarrow converts the dicts, or JSON for ``value``).
* **Spark pays per job.** A batch read is planned in a Python worker Spark
  reuses, so planning keeps one ZooKeeper session, the workers' addresses and
  its gRPC stubs per process. It still reads the module and its leaders from
  ZooKeeper on every planning (in one round trip: the reads pipelined, see
  ``Modules.get_with_groups``) and every partition's offsets from its leader,
  all at once (blocking calls on a kept thread pool: a ``.future()`` would
  start the channel's spin thread again for every planning). An address that
  went stale fails its call, which looks the worker up again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from conductor.client.handles import PartitionStatus
from topology.spark.arrow import RowBuilder
from topology.spark.errors import SourceOptionError
from topology.spark.fetch import read_partition
from topology.spark.options import SOURCE_NAME, DepotOptions
from topology.spark.planning import (
    DepotPartition,
    ModuleMeta,
    apply_limit,
    offsets_from_json,
    offsets_to_json,
    plan_partitions,
    resolve_ends,
    resolve_starts,
    validate_offsets,
)
from topology.spark.timeline import mark


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
        mark("plan_start")
        with ModuleMeta(self.opts.cluster, self.opts.module, shared=True, tls=self.opts.tls) as meta:
            mark("plan_leaders")  # the module and its leaders read; next, each partition's offsets
            statuses = meta.depot_statuses(self.opts.depot)
            starts = resolve_starts(self.opts, statuses, meta)
            ends = resolve_ends(self.opts, statuses, starts, meta)
            ranges = {t: (starts[t], ends[t]) for t in statuses}
            parts = plan_partitions(self.opts, meta, ranges, {t: st.epoch for t, st in statuses.items()})
        mark("plan_end", len(parts))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, DepotPartition):
            # Nothing to read (every range empty, e.g. a start time past every record): Spark still runs
            # one task, with its default partition.
            assert getattr(partition, "value", None) is None, partition
            return iter(())
        return read_partition(partition, RowBuilder(self.schema, self.opts.value_schema is None))


class DepotStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Microbatches over applied offsets, with admission control and ``Trigger.AvailableNow``.

    Lives in Spark's long-running Python planner process (offsets and
    partitions) and is also pickled to executors (``read``); the ZooKeeper
    session is opened lazily and never pickled.
    """

    def __init__(self, opts: DepotOptions, schema: StructType) -> None:
        if opts.bounded:
            raise SourceOptionError("endingOffsets and endingTimestamp are for batch reads (spark.read); a stream "
                                    "stops with trigger(availableNow=True) or query.stop()")
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
            self._meta = ModuleMeta(self.opts.cluster, self.opts.module, tls=self.opts.tls)
        return self._meta

    def _statuses(self) -> dict[int, PartitionStatus]:
        m = self._m()
        m.reload()
        return m.depot_statuses(self.opts.depot)

    def initialOffset(self) -> dict[str, Any]:
        statuses = self._statuses()
        starts = resolve_starts(self.opts, statuses, self._m())
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
