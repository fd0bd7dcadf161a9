"""`conductor doctor`: prove every component Millrace stands on works on this machine.

Each check does real work (a ZooKeeper round trip, a RocksDB write and read, a
gRPC echo, a Delta table through Spark) and reports what it verified, so an
operator can tell a broken install from a broken cluster in one command.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

from conductor.runtime_env import (
    EnvironmentBroken,
    delta_jars,
    jars_dir,
    missing_jars,
    require_java17,
    zookeeper_classpath,
)
from conductor.settings import LOOPBACK


@dataclass
class CheckResult:
    component: str
    ok: bool
    detail: str
    seconds: float


def check_java(_: Path) -> str:
    return f"Java {require_java17()} on PATH (Spark 4.2 needs 17+)"


def check_zookeeper(work: Path) -> str:
    from kazoo.client import KazooClient

    from conductor.zkserver import ZooKeeperServer

    zookeeper_classpath(fetch=False)  # says how to get the server when missing; never downloads behind the check
    with ZooKeeperServer(work / "zk") as server:
        zk = KazooClient(hosts=server.hosts, timeout=10)
        zk.start(timeout=15)
        try:
            zk.create("/millrace-doctor/probe", b"round-trip", makepath=True)
            data, stat = zk.get("/millrace-doctor/probe")
            if data != b"round-trip":
                raise AssertionError(f"ZooKeeper returned {data!r}")
            zk.set("/millrace-doctor/probe", b"v2", version=stat.version)
        finally:
            zk.stop()
            zk.close()
        return f"ZooKeeper server pid {server.pid} on {server.hosts}: kazoo create/get/versioned set round trip"


def check_rocksdb(work: Path) -> str:
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    path = str(work / "rocks")
    db = Rdict(path, options=opts, column_families={"probe": opts})
    try:
        cf = db.get_column_family("probe")
        wb = WriteBatch(raw_mode=True)
        wb.set_default_column_family(db.get_column_family_handle("probe"))
        for i in range(1000):
            wb.put(i.to_bytes(8, "big"), b"v%d" % i)
        wo = WriteOptions()
        wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at run time; the stub is wrong
        db.write(wb, write_opt=wo)
        if cf[(999).to_bytes(8, "big")] != b"v999":
            raise AssertionError("RocksDB read back the wrong value")
        n = len(list(cf.keys()))
        db.flush()
    finally:
        db.close()
    return f"RocksDB: 1,000 keys written in one WriteBatch to column family 'probe' (WAL off), {n} read back"


def check_grpc(_: Path) -> str:
    import grpc

    from conductor.wire import admin_pb2, admin_pb2_grpc

    class Echo(admin_pb2_grpc.AdminServicer):
        def Ping(self, request: admin_pb2.PingRequest, context: grpc.ServicerContext) -> admin_pb2.PingReply:
            return admin_pb2.PingReply(payload=request.payload, node_id="doctor")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    admin_pb2_grpc.add_AdminServicer_to_server(Echo(), server)
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    server.start()
    try:
        with grpc.insecure_channel(f"{LOOPBACK}:{port}") as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            payload = os.urandom(1 << 20)
            reply = stub.Ping(admin_pb2.PingRequest(payload=payload), timeout=10)
            if reply.payload != payload:
                raise AssertionError("gRPC echo changed the payload")
    finally:
        server.stop(grace=None)
    return f"gRPC: 1 MiB echo over {LOOPBACK}:{port} came back byte-identical"


def check_delta_jars(_: Path) -> str:
    jars = delta_jars(fetch=False)  # says how to get them when missing; never downloads behind the check
    return f"Delta Lake: {len(jars)} jars in {jars_dir()}"


def check_spark_delta(work: Path) -> str:
    from topology.spark.session import spark_session

    if missing_jars():
        raise EnvironmentBroken("not tried: Delta's jars are missing (above)")

    spark = spark_session("millrace-doctor", warehouse=work / "warehouse")
    try:
        table = str(work / "delta-probe")
        spark.range(0, 1000).withColumnRenamed("id", "n").write.format("delta").save(table)
        total = spark.read.format("delta").load(table).agg({"n": "sum"}).collect()[0][0]
        if total != 499500:
            raise AssertionError(f"Delta read back sum {total}, expected 499500")
        version = spark.version
    finally:
        spark.stop()
    return f"Spark {version} local[2]: wrote a 1,000-row Delta table and read it back (sum matches)"


CHECKS: list[tuple[str, Callable[[Path], str]]] = [
    ("java", check_java),
    ("zookeeper", check_zookeeper),
    ("rocksdb", check_rocksdb),
    ("grpc", check_grpc),
    ("delta jars", check_delta_jars),
    ("spark+delta", check_spark_delta),
]


def run_checks(on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Run every check in a scratch folder; a failing check is reported, never raised, so all run."""
    results: list[CheckResult] = []
    work = Path(tempfile.mkdtemp(prefix="millrace-doctor-"))
    try:
        for name, fn in CHECKS:
            t0 = time.monotonic()
            try:
                res = CheckResult(name, True, fn(work), time.monotonic() - t0)
            except EnvironmentBroken as e:
                res = CheckResult(name, False, str(e), time.monotonic() - t0)
            except Exception as e:
                res = CheckResult(name, False, f"{type(e).__name__}: {e}", time.monotonic() - t0)
            results.append(res)
            if on_result:
                on_result(res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results
