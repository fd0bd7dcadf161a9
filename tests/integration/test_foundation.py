"""The foundation every later issue stands on, exercised for real: ZooKeeper, RocksDB, gRPC, Spark+Delta."""

from __future__ import annotations

from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError
from pyspark.sql import SparkSession

from conductor import doctor
from conductor.zkserver import ZooKeeperServer


def test_kazoo_round_trip_and_versioned_cas(zk_hosts: str) -> None:
    zk = KazooClient(hosts=zk_hosts, timeout=10)
    zk.start(timeout=15)
    try:
        zk.create("/foundation/cas", b"v0", makepath=True)
        data, stat = zk.get("/foundation/cas")
        assert data == b"v0"
        zk.set("/foundation/cas", b"v1", version=stat.version)
        try:
            zk.set("/foundation/cas", b"stale", version=stat.version)
            raise AssertionError("a stale version must be refused")
        except BadVersionError:
            pass
        assert zk.get("/foundation/cas")[0] == b"v1"
    finally:
        zk.stop()
        zk.close()


def test_zookeeper_server_stops_by_pid(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path)
    try:
        server.start()
        assert server.ruok()
        pid = server.pid
        assert pid is not None
    finally:
        server.stop()
    assert server.proc is not None and server.proc.poll() is not None
    assert not server.ruok()


def test_rocksdb_column_family_write_read(tmp_path: Path) -> None:
    assert "1,000 keys" in doctor.check_rocksdb(tmp_path)


def test_grpc_echo_over_loopback(tmp_path: Path) -> None:
    assert "byte-identical" in doctor.check_grpc(tmp_path)


def test_delta_write_read_with_cached_jars(spark: SparkSession, tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    rows = [(i, f"w{i % 7}") for i in range(500)]
    spark.createDataFrame(rows, "n long, word string").write.format("delta").save(table)
    spark.createDataFrame([(500, "w0")], "n long, word string").write.format("delta").mode("append").save(table)
    df = spark.read.format("delta").load(table)
    assert df.count() == 501
    assert df.filter("word = 'w0'").count() == len([r for r in rows if r[1] == "w0"]) + 1
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert [h["version"] for h in history] == [1, 0]
