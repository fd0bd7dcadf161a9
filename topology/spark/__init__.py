"""Spark integration: depots and PStates as Spark data sources, and Delta export.

    from topology.spark import register
    register(spark)                                   # once per session; calling it again is harmless

    # a depot, streaming (or spark.read for everything applied now)
    clicks = (spark.readStream.format("millrace.depot")
              .option("cluster", "127.0.0.1:2181").option("module", "Clicks").option("depot", "*clicks")
              .option("valueSchema", "user string, n long")     # or leave out: `value` = record as JSON
              .option("maxRecordsPerTrigger", "100000")         # optional admission control
              .load())                                          # task int, offset long, epoch long, user, n

    # a Map PState, as a table
    visits = (spark.read.format("millrace.pstate")
              .option("cluster", "127.0.0.1:2181").option("module", "Clicks").option("pstate", "$$visits")
              .load())                                          # task int, key string, value string (JSON)

    # a depot exported to Delta Lake exactly once, then queried with SQL
    from topology.spark import export_depot_to_delta, read_delta_sql
    n = export_depot_to_delta(spark, "127.0.0.1:2181", "Clicks", "*clicks", "/data/clicks", "/data/clicks._ckpt",
                              value_schema="user string, n long")
    spark.sql(read_delta_sql("/data/clicks", "SELECT user, count(*) AS n FROM {table} GROUP BY user"))

Streaming offsets are *applied* depot offsets, so a replayed microbatch reads
the same records and exactly-once sinks stay exactly once; offsets that
vanished (truncation, trimming) fail the query instead of being skipped. See
:mod:`topology.spark.depot_source` for the details and the options.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from topology.spark.delta_export import export_depot_to_delta, read_delta_sql
from topology.spark.depot_source import DepotDataSource
from topology.spark.errors import (
    DepotOffsetOutOfRange,
    MillraceSourceError,
    SourceOptionError,
    ValueSchemaMismatch,
)
from topology.spark.pstate_source import PStateDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_registered: set[int] = set()
_lock = threading.Lock()


def register(spark: SparkSession) -> None:
    """Register ``millrace.depot`` and ``millrace.pstate`` with this session (idempotent).

    Spark keeps Python data sources per session state, so the session is
    remembered by its JVM object identity; a second call for the same session
    does nothing (re-registering would only replace the same classes).
    """
    key = _session_key(spark)
    with _lock:
        if key in _registered:
            return
        spark.dataSource.register(DepotDataSource)
        spark.dataSource.register(PStateDataSource)
        _registered.add(key)


def _session_key(spark: SparkSession) -> int:
    try:
        return int(spark._jsparkSession.hashCode())
    except Exception:  # Spark Connect sessions have no JVM handle
        return id(spark)


__all__ = [
    "DepotDataSource",
    "DepotOffsetOutOfRange",
    "MillraceSourceError",
    "PStateDataSource",
    "SourceOptionError",
    "ValueSchemaMismatch",
    "export_depot_to_delta",
    "read_delta_sql",
    "register",
]
