"""The ceiling of PySpark's Python Data Source API: a source that does no work at all.

``bench.microbatch`` compares ``millrace.depot`` with Delta Lake. Any Python
data source pays Spark's own path (a Python worker per task, Arrow batches
over a local socket, the JVM turning them into rows) before it reads or
decodes a byte; Delta does not. This source measures that path alone, on the
same box, in the same run: it serves the benchmark's records, in the depot
read's exact schema and Spark partitioning (one partition per task group), as
Arrow batches already built in the Python worker's memory. No network, no
storage, no decoding: whatever ``millrace.depot`` costs beyond it is
Millrace's, the rest is the API's.

The batches are built the first time a worker serves the source (the
benchmark warms it up untimed) and kept for the worker's life; every worker
builds all partitions, so Spark may hand any partition to any worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from topology.spark.timeline import mark

NAME = "millrace.bench.ceiling"
#: rows per Arrow batch handed to Spark, as ``millrace.depot`` does
BATCH_ROWS = 8192

_built: dict[tuple[int, int], list[pa.RecordBatch]] = {}


def _records(n: int) -> list[dict[str, Any]]:
    from bench.microbatch import make_record  # the benchmark's own records, warm-up record (-1) included

    return [make_record(i) for i in [-1, *range(n - 1)]]


def _build(n: int, parts: int) -> None:
    records = _records(n)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    for p in range(parts):
        chunk = records[bounds[p]:bounds[p + 1]]
        k = len(chunk)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(np.full(k, p, np.int32)), pa.array(np.arange(k, dtype=np.int64)),
             pa.array(np.ones(k, np.int64)), pa.array([r["user"] for r in chunk], pa.string()),
             pa.array([r["n"] for r in chunk], pa.int64()), pa.array([r["page"] for r in chunk], pa.string())],
            names=["task", "offset", "epoch", "user", "n", "page"])
        _built[(n, p)] = [batch.slice(i, BATCH_ROWS) for i in range(0, k, BATCH_ROWS)]


class CeilingSource(DataSource):
    """``spark.read.format("millrace.bench.ceiling").option("records", n).option("partitions", k)``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "task int, offset long, epoch long, user string, n long, page string"

    def reader(self, schema: StructType) -> DataSourceReader:
        return CeilingReader(int(self.options["records"]), int(self.options.get("partitions", "2")))


class CeilingReader(DataSourceReader):
    def __init__(self, records: int, partitions: int) -> None:
        self.records = records
        self.parts = partitions

    def partitions(self) -> list[InputPartition]:
        mark("plan_start")
        mark("plan_end", self.parts)
        return [InputPartition(p) for p in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        mark("read_start", partition.value)
        key = (self.records, partition.value)
        if key not in _built:
            _build(self.records, self.parts)
        for batch in _built[key]:
            yield batch
            mark("taken", partition.value)  # the same marks as millrace.depot's read (topology.spark.timeline)
        mark("read_end", partition.value)
