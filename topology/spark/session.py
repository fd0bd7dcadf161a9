"""One way to build a Spark session with Delta Lake from the cached jars, local or on a standalone cluster.

The session starts offline: Delta's jars come from ``build/jars`` in a checkout
(filled once by `make jars`), else from the user's cache, downloaded there with
a progress bar and checked the first time (``conductor.runtime_env``), never
from Ivy at run time, so tests and the demo behave the same with and without a
network. On a cluster (``master="spark://host:7077"``) the
same jars travel with the job (``spark.jars``: the driver serves them to its
executors), so Spark workers need nothing but pyspark and Millrace; the
driver binds `host`, which executors must reach (its machine's address).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.runtime_env import (
    delta_jars,
    fetch_with_progress,
    jars_dir,
    missing_jars,
    require_java17,
    venv_python,
)
from conductor.settings import LOOPBACK

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("millrace.spark")
#: JVM launches tried before giving up
GATEWAY_ATTEMPTS = 3
#: where the JVM's own output goes (Spark's and log4j's start-up lines, its warnings); see spark_log_file()
SPARK_LOG_ENV = "MILLRACE_SPARK_LOG"


def spark_log_file() -> Path:
    """``$MILLRACE_SPARK_LOG``, else one file in the temporary folder that every session appends to."""
    return Path(os.environ.get(SPARK_LOG_ENV) or Path(tempfile.gettempdir()) / "millrace-spark-driver.log")


def spark_session(app_name: str = "millrace", warehouse: Path | None = None, cores: int = 2,
                  master: str | None = None, host: str = LOOPBACK) -> SparkSession:
    """A Spark session with Delta configured, UI off, quiet logs, and our venv for Python workers.

    `master` None runs ``local[cores]``; a ``spark://`` URL runs on that standalone cluster with at most
    `cores` executor cores (512 MiB executors: the cluster shares its machines with Millrace's workers).
    The driver binds and advertises `host`.
    """
    require_java17()
    jars = ",".join(str(j) for j in fetch_delta_jars())
    os.environ.setdefault("SPARK_LOCAL_IP", host)  # bind only to the address given
    os.environ.setdefault("PYSPARK_PYTHON", venv_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", venv_python())
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or f"local[{cores}]")
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", host)
        .config("spark.driver.host", host)
        .config("spark.sql.shuffle.partitions", str(max(2, cores)))
        .config("spark.default.parallelism", str(max(2, cores)))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        # Delta's default of 50 snapshot partitions is tuned for clusters; on 2 local cores it is pure overhead.
        .config("spark.databricks.delta.snapshotPartitions", str(max(2, cores)))
    )
    if master is not None:
        builder = (builder.config("spark.cores.max", str(cores)).config("spark.executor.cores", "1")
                   .config("spark.executor.memory", "512m")
                   .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"]))
    if warehouse is not None:
        builder = builder.config("spark.sql.warehouse.dir", str(warehouse))
    log_file = spark_log_file()
    with _jvm_output_to(log_file):
        spark = _launch(builder)
    spark.sparkContext.setLogLevel("ERROR")
    log.info("Spark's JVM writes its output to %s", log_file)
    return spark


@contextlib.contextmanager
def _jvm_output_to(log_file: Path) -> Iterator[None]:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at `log_file` while the JVM starts.

    PySpark starts the JVM with the driver's descriptors, and the JVM and the Python workers it forks keep
    them for their lives: Spark's start-up banner, log4j's lines and the JVM's own warnings would interleave
    with the app's output. Only the launch sees the swap; Python's own writes go back to the terminal after.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = (os.dup(1), os.dup(2))
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (target, *saved):
            os.close(fd)


def fetch_delta_jars() -> list[Path]:
    """Delta's jars, downloading the missing ones first with a progress bar on stderr."""
    missing = missing_jars()
    if missing:
        fetch_with_progress("Delta Lake's jars", missing, jars_dir())
    return delta_jars(fetch=False)


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
                log.error("Spark's JVM did not start; its output is in %s", spark_log_file())
                raise
            log.warning("Spark's JVM exited before it started (attempt %d of %d); launching it again",
                        attempt, attempts)
    raise AssertionError("unreachable")
