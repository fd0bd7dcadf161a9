"""Microbatch topologies: Spark Structured Streaming over depots, committed exactly once.

    query = run_microbatch(spark, "zk1:2181,zk2:2181", "WordCount", "lengths", checkpoint="/tmp/ckpt")

The user function (declared with ``@m.microbatch(depot)``) maps a batch
DataFrame of depot records to a DataFrame of changes with columns
``target`` (``"$$pstate"`` or ``"*depot"``), ``key``, ``op`` (``set``, ``add``,
``remove``, ``append``: :data:`topology.entries.requests.MICROBATCH_OPS`, which
the group leaders interpret) and ``value``. Why this is exactly once:

* the source's offsets are *applied* depot offsets, so when Spark replays a
  batch after a crash it reads exactly the same records;
* each task group receives the batch's changes for its tasks as ONE replog
  entry tagged ``(topology, batch_id)``, and a group that already applied that
  batch skips it. A driver killed halfway through committing replays the batch:
  the groups that had it skip, the others apply, and every change lands once;
* ``add`` is resolved on the group leader against the applied state, so a
  replayed batch cannot double count.

Appends to depots from a microbatch (``op = "append"``) ride in the same tagged
entries, so they are exactly once too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from conductor.client import Cluster
from conductor.security.tls import TlsFiles
from conductor.settings import LOOPBACK
from conductor.wire import millrace_pb2 as pb
from topology.entries.requests import MICROBATCH_OPS, OP_APPEND
from topology.errors import TopologyError
from topology.module import ModuleDefinition, TopologyDecl
from topology.partitioners import task_for_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("millrace.microbatch")

CHANGE_COLUMNS = ("target", "key", "op", "value")
#: called after each group's commit request is sent, with the group and the reply's future: a test's seam (the
#: fault tests kill the driver between two groups' commits through it); None in production
GroupSent = Callable[[int, concurrent.futures.Future[Any]], None]


class MicrobatchContext:
    """What a microbatch function receives besides its DataFrame."""

    def __init__(self, module: str, topology: str, batch_id: int, spark: SparkSession) -> None:
        self.module = module
        self.topology = topology
        self.batch_id = batch_id
        self.spark = spark


def _pack(v: Any) -> bytes:
    if hasattr(v, "asDict"):
        v = v.asDict(recursive=True)
    raw: bytes = msgpack.packb(v, use_bin_type=True)
    return raw


def route_changes(definition: ModuleDefinition, topology: str, tasks: int, groups: int,
                  rows: list[Any]) -> dict[int, list[pb.BatchChange]]:
    """Group change rows by the task group that owns each key (or each appended record's partition)."""
    out: dict[int, list[pb.BatchChange]] = defaultdict(list)
    for row in rows:
        target, key, op, value = (row[c] for c in CHANGE_COLUMNS)
        if op not in MICROBATCH_OPS:
            raise TopologyError(topology, f"change op {op!r} is not one of {MICROBATCH_OPS}")
        if target in definition.pstates:
            if op == OP_APPEND:
                raise TopologyError(topology, f"op 'append' needs a depot target, got PState {target}")
            task = task_for_key(key, tasks)
        elif target in definition.depots:
            if op != OP_APPEND:
                raise TopologyError(topology, f"depot {target} only takes op 'append', got {op!r}")
            record = value.asDict(recursive=True) if hasattr(value, "asDict") else value
            task = definition.depots[target].partitioner(record, tasks)
            if definition.depots[target].partitioner.name == "random":
                task = task_for_key(_pack(record), tasks)  # a replay must route the same record the same way
        else:
            raise TopologyError(topology, f"unknown target {target!r}; PStates {definition.pstate_names()}, "
                                f"depots {definition.depot_names()}")
        out[task % groups].append(pb.BatchChange(target=target, key=_pack(key), op=op,
                                                 value=b"" if value is None else _pack(value), task=task))
    return out


def commit_batch(cluster: Cluster, module: str, topology: str, batch_id: int,
                 changes: dict[int, list[pb.BatchChange]], sent: GroupSent | None = None) -> dict[int, bool]:
    """Send each group its share (in parallel); returns group -> skipped (it had applied it already).

    Every group gets a request, even an empty one, so every group records the
    batch as committed and `Progress` tells how far a topology got everywhere.
    """
    info = cluster.module_info(module)
    futures = {}
    for g in range(info.groups):
        req = pb.CommitBatchRequest(module=module, group=g, topology=topology, batch_id=batch_id,
                                    changes=changes.get(g, []))
        futures[g] = cluster.call_group(module, g, "CommitBatch", req)
        if sent is not None:
            sent(g, futures[g])
    return {g: f.result().skipped for g, f in futures.items()}


def _topology(definition: ModuleDefinition, name: str) -> TopologyDecl:
    t = definition.topologies.get(name)
    if t is None or t.kind != "microbatch":
        known = [n for n, d in definition.topologies.items() if d.kind == "microbatch"]
        raise TopologyError(name, f"module {definition.name} has no microbatch topology {name!r}; it has {known}")
    return t


class MicrobatchQuery:
    """A running microbatch topology: its Spark query and the cluster client its commits use.

    The client holds a ZooKeeper session, so it must be closed when the query
    ends; waiting for or stopping the query through this handle does that.
    """

    def __init__(self, query: StreamingQuery, cluster: Cluster) -> None:
        self.query = query
        self.cluster = cluster

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the query (e.g. an availableNow run) to finish; closes the client once it has."""
        try:
            if timeout_s is None:
                self.query.awaitTermination()
                finished = True
            else:
                finished = bool(self.query.awaitTermination(int(timeout_s)))
        except BaseException:
            self.cluster.close()
            raise
        if finished:
            self.cluster.close()
        return finished

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            self.cluster.close()


def run_microbatch(spark: SparkSession, zk: str, module: str, topology: str, checkpoint: str,
                   trigger: dict[str, Any] | None = None, max_records_per_trigger: int | None = None,
                   sent: GroupSent | None = None, tls: TlsFiles | None = None) -> MicrobatchQuery:
    """Start the Structured Streaming query of a microbatch topology; returns a handle on it.

    ``sent`` is :func:`commit_batch`'s seam for tests (None: nothing is called).
    """
    from topology.spark import register

    register(spark)
    cluster = Cluster.connect(zk, tls=tls)  # the driver's commits; the executors' reads get the same files:
    tls_options = {} if tls is None else {"tlsCa": str(tls.ca), "tlsCert": str(tls.cert), "tlsKey": str(tls.key)}
    definition = cluster.module_definition(module)
    topo = _topology(definition, topology)
    info = cluster.module_info(module)
    frames = []
    for depot in topo.depots:
        reader = (spark.readStream.format("millrace.depot").option("cluster", zk).option("module", module)
                  .option("depot", depot).options(**tls_options))
        if max_records_per_trigger:
            reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
        frames.append(reader.load())
    source: DataFrame = frames[0]
    for f in frames[1:]:
        source = source.unionByName(f)

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        ctx = MicrobatchContext(module, topology, batch_id, spark)
        changes_df = topo.fn(batch, ctx)
        missing = [c for c in CHANGE_COLUMNS if c not in changes_df.columns]
        if missing:
            raise TopologyError(topology, f"the function must return columns {CHANGE_COLUMNS}; missing {missing}")
        rows = changes_df.select(*CHANGE_COLUMNS).collect()
        routed = route_changes(definition, topology, info.tasks, info.groups, rows)
        skipped = commit_batch(cluster, module, topology, batch_id, routed, sent)
        log.info("microbatch %s/%s batch %d: %d change(s) committed to %d group(s) (%d already had it)",
                 module, topology, batch_id, len(rows), len(skipped), sum(skipped.values()))

    writer = source.writeStream.foreachBatch(each_batch).option("checkpointLocation", checkpoint)
    if trigger:
        writer = writer.trigger(**trigger)
    try:
        query = writer.queryName(f"millrace-{module}-{topology}").start()
    except BaseException:
        cluster.close()
        raise
    return MicrobatchQuery(query, cluster)


def main(argv: list[str] | None = None, sent: GroupSent | None = None) -> int:
    """``python -m topology.spark.microbatch --zk ... --module M --topology T --checkpoint DIR [--available-now]``.

    ``sent``: see :func:`commit_batch` (a test's launcher passes one; the command line never does).
    """
    p = argparse.ArgumentParser(prog="python -m topology.spark.microbatch",
                                description="Run a Millrace microbatch topology on Spark (local[2], or a standalone "
                                            "cluster with --master).")
    p.add_argument("--zk", required=True)
    p.add_argument("--module", required=True)
    p.add_argument("--topology", required=True)
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint folder (keep it to resume exactly once)")
    p.add_argument("--available-now", action="store_true", help="process what is applied now, then stop")
    p.add_argument("--interval", default="1 second", help="processing-time trigger when not --available-now")
    p.add_argument("--max-records-per-trigger", type=int, default=None)
    p.add_argument("--master", default=None, help="a standalone master, spark://HOST:7077 (default: local[2])")
    p.add_argument("--host", default=LOOPBACK,
                   help="address the driver binds and executors reach it at (this machine's, with --master)")
    p.add_argument("--cores", type=int, default=2, help="local cores, or executor cores at most on a cluster")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument("--tls-ca", type=Path, default=None, help="a secured cluster: the CA bundle (PEM); with "
                                                            "--tls-cert and --tls-key, the same paths on executors")
    p.add_argument("--tls-cert", type=Path, default=None, help="the app's certificate (PEM)")
    p.add_argument("--tls-key", type=Path, default=None, help="its key (PEM)")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from topology.spark.session import spark_session

    spark = spark_session(f"millrace-{args.module}-{args.topology}", cores=args.cores, master=args.master,
                          host=args.host)
    trigger = {"availableNow": True} if args.available_now else {"processingTime": args.interval}
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if any(given) and not all(given):
        p.error("give all of --tls-ca, --tls-cert and --tls-key (a secured cluster), or none")
    tls = TlsFiles(args.tls_ca, args.tls_cert, args.tls_key) if all(given) else None
    query = run_microbatch(spark, args.zk, args.module, args.topology, args.checkpoint, trigger=trigger,
                           max_records_per_trigger=args.max_records_per_trigger, sent=sent, tls=tls)
    try:
        query.await_termination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
