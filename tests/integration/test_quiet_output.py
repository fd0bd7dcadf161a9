"""`make demo` prints only its own lines: nothing from gRPC's core, the JVM, log4j or Spark's start-up.

The demo runs for real (a small corpus keeps it near a minute): a cluster of
processes, the Spark microbatch topology and the Delta export. The JVM's output
must land in the Spark log file instead (``$MILLRACE_SPARK_LOG``), not vanish.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: lines written by gRPC's core (glog style: I1127 03:30:13.600772 830 fork_posix.cc:71] ...), the JVM, log4j,
#: Spark and py4j, never by the demo itself
FOREIGN_LINE = re.compile(
    r"^[IWEF]\d{4} \d\d:\d\d:\d\d|fork_posix|skipping fork\(\) handlers|absl::InitializeLog|"
    r"^WARNING: Using incubator modules|^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN|ERROR)|log4j|"
    r"Setting default log level|setLogLevel\(newLevel\)|^py4j|NativeCodeLoader")

FOREIGN_SAMPLES = [
    "I1127 03:30:13.600772     830 fork_posix.cc:71] Other threads are currently calling into gRPC, skipping",
    "WARNING: Using incubator modules: jdk.incubator.vector",
    "26/11/27 03:30:18 WARN NativeCodeLoader: Unable to load native-hadoop library for your platform",
    "Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties",
    'Setting default log level to "WARN".',
]


def test_the_pattern_knows_the_lines_it_is_looking_for() -> None:
    assert all(FOREIGN_LINE.search(line) for line in FOREIGN_SAMPLES)
    assert not FOREIGN_LINE.search("4. running the Spark microbatch topology `lengths` (exactly-once commits)")


def test_the_demo_prints_only_its_own_lines(tmp_path: Path) -> None:
    spark_log = tmp_path / "spark.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MILLRACE_SPARK_LOG": str(spark_log), "COLUMNS": "200"}
    env.pop("GRPC_ENABLE_FORK_SUPPORT", None)
    env.pop("GRPC_VERBOSITY", None)
    done = subprocess.run([sys.executable, "-m", "examples.demo", "--sentences", "500"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "demo finished" in output
    foreign = [line for line in output.splitlines() if FOREIGN_LINE.search(line)]
    assert foreign == [], "\n".join(foreign)
    assert "log4j" in spark_log.read_text(), "the JVM's start-up lines go to the Spark log file"
