"""Export a depot to a Delta Lake table, exactly once, and query it with Spark SQL.

    rows = export_depot_to_delta(spark, "zk1:2181,zk2:2181", "Clicks", "*clicks",
                                 "/data/clicks", "/data/clicks._checkpoint", value_schema="user string, n long")
    spark.sql(read_delta_sql("/data/clicks", "SELECT user, count(*) AS clicks FROM {table} GROUP BY user")).show()
    # which is simply: spark.sql("SELECT ... FROM delta.`/data/clicks` ...")

Why exactly once: the export is a Structured Streaming query from
``millrace.depot`` into Delta's own streaming sink with
``Trigger.AvailableNow``. The source's offsets are applied depot offsets, so a
batch replayed after a crash reads the very same records; Delta's sink records
``(query id, batch id)`` in the table's transaction log and ignores a batch it
already committed. Run the function again with the same checkpoint to export
only what was appended since (an incremental, idempotent export); a new
checkpoint with an existing table would export everything again.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("millrace.spark")


def _delta_version(spark: SparkSession, table_path: str) -> int:
    """The table's latest version, or -1 when no Delta table is there yet."""
    from pyspark.errors import AnalysisException

    try:
        row = spark.sql(f"DESCRIBE HISTORY delta.`{_quote(table_path)}` LIMIT 1").collect()
    except AnalysisException:
        return -1
    return int(row[0]["version"]) if row else -1


def _quote(path: str) -> str:
    return path.replace("`", "``")


def export_depot_to_delta(spark: SparkSession, cluster: str, module: str, depot: str, table_path: str,
                          checkpoint_path: str, value_schema: str | None = None,
                          max_records_per_trigger: int | None = None, timeout_s: float | None = None) -> int:
    """Append every record applied in `depot` and not yet exported to the Delta table at `table_path`.

    Columns are the source's: ``task, offset, epoch`` and ``value`` (JSON) or
    the ``value_schema`` fields. Returns how many rows this call added (0 when
    nothing new was applied). ``max_records_per_trigger`` splits a large backlog
    into several Delta commits (each batch is still exactly once). Raises the
    query's error (e.g. ``DepotOffsetOutOfRange``) if it fails, and
    ``TimeoutError`` if ``timeout_s`` passes first (the query is stopped; the
    next call resumes from the checkpoint).
    """
    from topology.spark import register

    register(spark)
    before = _delta_version(spark, table_path)
    reader = (spark.readStream.format("millrace.depot").option("cluster", cluster).option("module", module)
              .option("depot", depot))
    if value_schema:
        reader = reader.option("valueSchema", value_schema)
    if max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
    query = (reader.load().writeStream.format("delta").outputMode("append")
             .option("checkpointLocation", checkpoint_path)
             .queryName(f"millrace-export-{module}-{depot.lstrip('*')}")
             .trigger(availableNow=True).start(table_path))
    finished = query.awaitTermination(math.ceil(timeout_s)) if timeout_s is not None else query.awaitTermination()
    if finished is False:
        query.stop()
        raise TimeoutError(f"exporting {module}/{depot} to {table_path} did not finish within {timeout_s}s; it "
                           "stopped cleanly and the next call resumes from the checkpoint")
    error = query.exception()
    if error is not None:
        raise error
    return _rows_since(spark, table_path, before)


def _rows_since(spark: SparkSession, table_path: str, before: int) -> int:
    """Rows the streaming commits after version `before` added, from the Delta log (exact, any batch count)."""
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{_quote(table_path)}`").where(f"version > {before}").collect()
    total = 0
    for r in rows:
        if r["operation"] == "STREAMING UPDATE":
            metrics = r["operationMetrics"] or {}
            total += int(metrics.get("numOutputRows", 0))
    log.info("exported %d row(s) to %s in %d commit(s)", total, table_path, len(rows))
    return total


def read_delta_sql(table_path: str, query: str = "SELECT * FROM {table}") -> str:
    """Spark SQL over an exported table: ``{table}`` in `query` becomes ``delta.`<table_path>```.

    Pass the result to ``spark.sql``; a path-based Delta table needs no catalog
    entry (``CREATE TABLE clicks USING DELTA LOCATION '<path>'`` names it).
    """
    return query.replace("{table}", f"delta.`{_quote(table_path)}`")
