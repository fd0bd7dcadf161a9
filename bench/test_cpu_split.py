"""bench.cpu_split counts this process's descendants by class, and only them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.cpu_split import CLASSES, CpuSplit, classify

#: burns 0.3 s of CPU once told to (a line on stdin), says so, then idles until killed
BURN = ("import sys, time; sys.stdin.readline(); t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print('done', flush=True); time.sleep(60)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_listed_as_a_node_counts_as_nodes_and_others_as_other() -> None:
    node, other = (subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True) for _ in range(2))

    def burn() -> None:
        for p in (node, other):
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in (node, other):
            assert p.stdout is not None and p.stdout.readline() == "done\n"

    try:
        split = CpuSplit(lambda: [node.pid])
        _result, cpu = split.measure(burn)
        assert set(cpu) == set(CLASSES)
        assert cpu["nodes"] >= 0.2 and cpu["other"] >= 0.2, cpu
        # neither burner is counted as Spark; a Spark JVM another test left running below pytest may tick idly
        assert cpu["spark_jvm"] + cpu["spark_python"] < 0.1, cpu
    finally:
        for p in (node, other):
            p.kill()
            p.wait()


def test_spark_processes_are_told_apart_by_their_program() -> None:
    jvm = "/usr/lib/jvm/java-17/bin/java -cp /v/site-packages/pyspark/jars/* org.apache.spark.deploy.SparkSubmit"
    assert classify(jvm) == "spark_jvm"
    assert classify("/w/.venv/bin/python -m pyspark.daemon pyspark.worker") == "spark_python"
    assert classify("/usr/bin/java -cp zk.jar org.apache.zookeeper.server.quorum.QuorumPeerMain z.cfg") == "other"
    assert classify("/w/.venv/bin/python -m conductor.worker --node n1") == "other"
