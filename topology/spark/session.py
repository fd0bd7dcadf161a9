"""One way to build a local Spark session with Delta Lake from the cached jars.

The session starts offline: jars come from ``build/jars`` (filled once by
`make jars`), never from Ivy at run time, so tests and the demo behave the same
with and without a network.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.runtime_env import delta_jars, require_java17, venv_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("millrace.spark")
#: JVM launches tried before giving up
GATEWAY_ATTEMPTS = 3


def spark_session(app_name: str = "millrace", warehouse: Path | None = None, cores: int = 2) -> SparkSession:
    """A local[cores] Spark session with Delta configured, UI off, quiet logs, and our venv for workers."""
    require_java17()
    jars = ",".join(str(j) for j in delta_jars())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # bind only to loopback
    os.environ.setdefault("PYSPARK_PYTHON", venv_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", venv_python())
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(f"local[{cores}]")
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(max(2, cores)))
        .config("spark.default.parallelism", str(max(2, cores)))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        # Delta's default of 50 snapshot partitions is tuned for clusters; on 2 local cores it is pure overhead.
        .config("spark.databricks.delta.snapshotPartitions", str(max(2, cores)))
    )
    if warehouse is not None:
        builder = builder.config("spark.sql.warehouse.dir", str(warehouse))
    spark = _launch(builder)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _launch(builder: Any, attempts: int = GATEWAY_ATTEMPTS) -> SparkSession:
    """``getOrCreate``, launching the JVM again if it died before it started.

    PySpark starts its JVM with fork + exec from a process that usually has
    gRPC's threads running; gRPC's fork handlers occasionally kill the child
    before it execs (seen as JAVA_GATEWAY_EXITED with no Java output, about
    one demo run in five). Nothing was started then, so trying again is safe.
    """
    from pyspark.errors import PySparkRuntimeError

    for attempt in range(1, attempts + 1):
        try:
            session: SparkSession = builder.getOrCreate()
            return session
        except PySparkRuntimeError as e:
            if e.getCondition() != "JAVA_GATEWAY_EXITED" or attempt == attempts:
                raise
            log.warning("Spark's JVM exited before it started (attempt %d of %d); launching it again",
                        attempt, attempts)
    raise AssertionError("unreachable")
