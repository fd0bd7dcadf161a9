"""The Spark sources on a real cluster: millrace.depot (batch and streaming), millrace.pstate, Delta export.

One DevCluster (real ZooKeeper, conductor, three worker processes, RF=3) and
the session's real Spark (local[2], Delta) serve the whole file; no mocks.
Records carry unique ids so every read is checked as an exact multiset.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conductor.client import ClientError, Cluster, PartitionStatus
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from tests.integration.cluster_helpers import deploy, wait_for
from topology.partitioners import task_for_key
from topology.spark import (
    DepotOffsetOutOfRange,
    export_depot_to_delta,
    read_delta_sql,
    register,
)
from topology.spark.arrow import RowBuilder
from topology.spark.depot_source import DepotBatchReader, DepotStreamReader
from topology.spark.fetch import read_partition
from topology.spark.options import DepotOptions
from topology.spark.planning import (
    DepotPartition,
    ModuleMeta,
    TaskRange,
    apply_limit,
    offsets_from_json,
    split_ranges,
    validate_offsets,
)

N = 5_000
SENTENCES = ["the cat sat", "the dog sat on the cat", "a cat, a dog!", "Sat. The end"]


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("spark-sources") / "cluster", nodes=3, session_timeout=4.0)
    cluster.start()
    try:
        deploy(cluster, "Clicks", tasks=4, threads=2)
        deploy(cluster, "WordCount", tasks=4, threads=2, module_ref="examples.word_count:WordCount")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def client(dc: DevCluster) -> Iterator[Cluster]:
    c = Cluster.connect(dc.hosts)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def clicks(client: Cluster) -> list[dict[str, Any]]:
    """N click dicts appended to *clicks (acknowledged once applied), unique by id."""
    records = [{"user": f"u{i % 97}", "n": i, "id": f"c{i}"} for i in range(N)]
    client.depot("Clicks", "*clicks").append_many(records, ack="applied")
    return records


def depot_df(spark: Any, dc: DevCluster, depot: str, stream: bool = False, **options: str) -> Any:
    register(spark)
    r = spark.readStream if stream else spark.read
    r = r.format("millrace.depot").option("cluster", dc.hosts).option("module", "Clicks").option("depot", depot)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df: Any, checkpoint: Path) -> list[list[Any]]:
    """One availableNow run; returns the rows of each microbatch (collected on the driver)."""
    batches: list[list[Any]] = []
    q = (df.writeStream.foreachBatch(lambda b, _id: batches.append(b.collect()))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    q.awaitTermination(120)
    if q.exception() is not None:
        raise q.exception()  # type: ignore[misc]
    return [b for b in batches if b]


def ids(rows: list[Any]) -> Counter[str]:
    return Counter(json.loads(r["value"])["id"] for r in rows)


# ------------------------------------------------------------------------------------------- batch


def test_batch_read_returns_every_applied_record_exactly_once(spark: Any, dc: DevCluster, client: Cluster,
                                                             clicks: list[dict[str, Any]]) -> None:
    df = depot_df(spark, dc, "*clicks")
    assert df.schema.simpleString() == "struct<task:int,offset:bigint,epoch:bigint,value:string>"
    rows = df.collect()
    assert ids(rows) == Counter(r["id"] for r in clicks)
    assert [json.loads(r["value"]) for r in rows if json.loads(r["value"])["id"] == "c7"] == [clicks[7]]
    # one Spark partition per task group by default; minPartitions / recordsPerPartition cut more, same records
    assert df.rdd.getNumPartitions() == 2
    split = depot_df(spark, dc, "*clicks", minPartitions="5", recordsPerRequest="300")
    assert split.rdd.getNumPartitions() >= 5
    assert ids(split.collect()) == ids(rows)
    # offsets are the depot's own: dense per task, matching each partition's applied range
    depot = client.depot("Clicks", "*clicks")
    for task in range(4):
        st = depot.partition_status(task)
        offs = sorted(r["offset"] for r in rows if r["task"] == task)
        assert offs == list(range(st.start, st.end))
        assert {r["epoch"] for r in rows if r["task"] == task} == {st.epoch}
        # the record's task is the one its partitioner (hash_by user) chose
        assert all(task_for_key(json.loads(r["value"])["user"], 4) == task for r in rows if r["task"] == task)


def test_value_schema_turns_record_fields_into_columns(spark: Any, dc: DevCluster,
                                                      clicks: list[dict[str, Any]]) -> None:
    df = depot_df(spark, dc, "*clicks", valueSchema="user string, n long, absent string")
    assert df.columns == ["task", "offset", "epoch", "user", "n", "absent"]
    agg = df.groupBy().agg({"n": "sum", "user": "count", "absent": "count"}).collect()[0]
    assert agg["sum(n)"] == sum(r["n"] for r in clicks)
    assert agg["count(user)"] == N and agg["count(absent)"] == 0
    per_user = {r["user"]: r["count"] for r in df.groupBy("user").count().collect()}
    assert per_user == Counter(r["user"] for r in clicks)


def test_value_schema_mismatch_names_the_record(spark: Any, dc: DevCluster, clicks: list[dict[str, Any]]) -> None:
    df = depot_df(spark, dc, "*clicks", valueSchema="user long")
    with pytest.raises(Exception, match=r"does not fit valueSchema.*\['user'\]"):
        df.collect()


def test_bad_options_say_what_to_do(spark: Any, dc: DevCluster) -> None:
    register(spark)
    with pytest.raises(Exception, match="needs option 'depot'"):
        spark.read.format("millrace.depot").option("cluster", dc.hosts).option("module", "Clicks").load()
    with pytest.raises(Exception, match=r"no depot '\*nope'.*\*clicks"):
        depot_df(spark, dc, "*nope").collect()
    with pytest.raises(Exception, match="module 'Nope' is not deployed"):
        (spark.read.format("millrace.depot").option("cluster", dc.hosts).option("module", "Nope")
         .option("depot", "*x").load().collect())


def test_a_partition_planned_at_a_non_leader_finds_the_leader_through_zookeeper(
        spark: Any, dc: DevCluster, client: Cluster, clicks: list[dict[str, Any]]) -> None:
    """An executor that reaches a follower (the leader moved since planning) gets NotLeader, looks up, reads."""
    from pyspark.sql.types import StructType

    with Metastore(dc.hosts) as ms:
        st, _v = ms.groups.get("Clicks", 0)
        follower = next(r for r in st.replicas if r != st.leader)
        info = ms.nodes.get(follower)
        assert info is not None
    depot = client.depot("Clicks", "*clicks")
    ranges = [TaskRange(t, 0, depot.partition_status(t).end, st.epoch) for t in (0, 2)]  # group 0's tasks
    part = DepotPartition(dc.hosts, "Clicks", "*clicks", 0, ranges, info.address, 500, 1 << 20)
    schema = StructType.fromDDL("task int, offset long, epoch long, value string")
    got = [row for b in read_partition(part, RowBuilder(schema, True)) for row in b.to_pylist()]
    assert len(got) == sum(r.end - r.start for r in ranges)
    assert {(r["task"], r["offset"]) for r in got} == {(r.task, o) for r in ranges for o in range(r.start, r.end)}


def test_each_plan_reads_the_leaders_again_and_a_stale_address_fails_over(
        dc: DevCluster, client: Cluster, clicks: list[dict[str, Any]]) -> None:
    """The planner keeps its ZooKeeper session and the workers' addresses between jobs (Spark reuses its Python
    planner), not the leaders: a plan after a hand-off goes to the new leader, at its epoch, and an address
    that went stale (a worker restarted elsewhere) fails its PartitionInfo and is looked up again."""
    from pyspark.sql.types import StructType

    opts = DepotOptions.parse({"cluster": dc.hosts, "module": "Clicks", "depot": "*clicks"})
    reader = DepotBatchReader(opts, StructType.fromDDL("task int, offset long, epoch long, value string"))
    ends = {t: client.depot("Clicks", "*clicks").partition_status(t).end for t in range(4)}

    def planned() -> tuple[dict[int, str], dict[int, int]]:
        parts = reader.partitions()
        assert {(r.task, r.start, r.end) for p in parts for r in p.ranges} == {(t, 0, e) for t, e in ends.items()}
        return ({p.group: p.address for p in parts},
                {p.group: min(r.epoch for r in p.ranges) for p in parts})

    planned()
    with Metastore(dc.hosts) as ms:
        st, _v = ms.groups.get("Clicks", 0)
        to = next(r for r in st.isr if r != st.leader)
        ms.resigns.request("Clicks", 0, to, st.epoch, ms.nodes.sessions()[to])
        wait_for(lambda: ms.groups.get("Clicks", 0)[0].epoch > st.epoch, 20, f"group 0 handed to {to}")
        moved, _v = ms.groups.get("Clicks", 0)
        other, _v = ms.groups.get("Clicks", 1)
        address = {n: info.address for n in (moved.leader, other.leader) if (info := ms.nodes.get(n)) is not None}
    addresses, epochs = planned()
    assert addresses[0] == address[moved.leader] and epochs[0] == moved.epoch
    # A worker's address as this process last saw it, gone stale (nothing listens on port 9 here).
    shared = ModuleMeta(dc.hosts, "Clicks", shared=True)
    shared.router._addresses[other.leader] = "127.0.0.1:9"
    addresses, epochs = planned()
    assert addresses == {0: address[moved.leader], 1: address[other.leader]}
    assert epochs == {0: moved.epoch, 1: other.epoch}


# ------------------------------------------------------------------------------------------- streaming


def test_streaming_available_now_reads_exactly_the_new_records(spark: Any, dc: DevCluster, client: Cluster,
                                                               tmp_path: Path) -> None:
    raw = client.depot("Clicks", "*raw")
    first = [{"id": f"s{i}", "k": i} for i in range(1_000)]
    raw.append_many(first, ack="applied")
    df = depot_df(spark, dc, "*raw", stream=True)
    ckpt = tmp_path / "ckpt"
    got1 = [r for b in run_available_now(df, ckpt) for r in b]
    assert ids(got1) == Counter(r["id"] for r in first)

    second = [{"id": f"t{i}", "k": i} for i in range(700)]
    raw.append_many(second, ack="applied")
    got2 = [r for b in run_available_now(df, ckpt) for r in b]
    assert ids(got2) == Counter(r["id"] for r in second)

    # nothing new: a third run makes no batch at all
    assert run_available_now(df, ckpt) == []

    # admission control: the backlog is cut into batches of at most maxRecordsPerTrigger, nothing lost or doubled
    capped = depot_df(spark, dc, "*raw", stream=True, maxRecordsPerTrigger="400")
    batches = run_available_now(capped, tmp_path / "capped")
    assert len(batches) >= 5 and max(len(b) for b in batches) <= 400
    assert ids([r for b in batches for r in b]) == ids(depot_df(spark, dc, "*raw").collect())

    # startingOffsets=latest: only what is appended after the query started
    latest = depot_df(spark, dc, "*raw", stream=True, startingOffsets="latest")
    assert run_available_now(latest, tmp_path / "latest") == []
    third = [{"id": f"u{i}"} for i in range(50)]
    raw.append_many(third, ack="applied")
    assert ids([r for b in run_available_now(latest, tmp_path / "latest") for r in b]) == Counter(
        r["id"] for r in third)


def test_committed_offset_beyond_the_end_fails_loudly(spark: Any, dc: DevCluster, client: Cluster,
                                                      tmp_path: Path) -> None:
    """KIP-320: a checkpoint whose offsets the depot no longer holds stops the query, naming what is wrong."""
    client.depot("Clicks", "*raw").append_many([{"id": f"k{i}"} for i in range(20)], ack="applied")
    df = depot_df(spark, dc, "*raw", stream=True)
    ckpt = tmp_path / "ckpt"
    assert run_available_now(df, ckpt)
    # Pretend the depot lost records this query already read: push task 1's committed offset past the end.
    last = max((ckpt / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    lines = last.read_text().splitlines()
    offsets = json.loads(lines[-1])
    end1 = offsets["1"]["offset"]
    offsets["1"]["offset"] = end1 + 1_000
    last.write_text("\n".join([*lines[:-1], json.dumps(offsets)]))
    with pytest.raises(Exception) as info:
        run_available_now(df, ckpt)
    msg = str(info.value)
    assert "partition 1" in msg and f"offset {end1 + 1_000}" in msg and "truncated" in msg
    assert "leader epoch" in msg and "checkpointLocation" in msg


def test_offset_validation_rules() -> None:
    st = {0: PartitionStatus(0, 10, 100, 3), 1: PartitionStatus(1, 0, 50, 2)}
    validate_offsets("M", "*d", {0: (10, 3), 1: (50, 2)}, st)  # both ends of the range are fine
    with pytest.raises(DepotOffsetOutOfRange) as info:
        validate_offsets("M", "*d", {0: (5, 2), 1: (60, 1)}, st)
    kinds = {p["task"]: p["kind"] for p in info.value.problems}
    assert kinds == {0: "trimmed", 1: "truncated"}
    msg = str(info.value)
    assert "partition 0: offset 5 (read at leader epoch 2) is below the partition start 10 (leader epoch 3)" in msg
    assert "partition 1: offset 60 (read at leader epoch 1) is beyond the applied end 50 (leader epoch 2)" in msg
    assert apply_limit({0: 0, 1: 0}, {0: 300, 1: 100}, 100) == {0: 75, 1: 25}
    assert apply_limit({0: 0, 1: 0}, {0: 3, 1: 0}, 100) == {0: 3, 1: 0}
    assert sum(apply_limit({0: 0, 1: 0, 2: 0}, {0: 10, 1: 10, 2: 10}, 7).values()) == 7


def test_partition_planning_splits_a_groups_ranges_evenly_and_completely() -> None:
    ranges = [TaskRange(0, 5, 105, 1), TaskRange(2, 0, 50, 1)]
    pieces = split_ranges(ranges, 3)
    assert [sum(r.end - r.start for r in p) for p in pieces] == [50, 50, 50]
    covered = sorted((r.task, o) for p in pieces for r in p for o in range(r.start, r.end))
    assert covered == sorted([(0, o) for o in range(5, 105)] + [(2, o) for o in range(50)])
    assert split_ranges(ranges, 1) == [ranges]


def test_stream_reader_checks_committed_offsets_against_the_leaders(spark: Any, dc: DevCluster,
                                                                    client: Cluster) -> None:
    """The reader's own offset check, against the real partitions (trimmed and truncated)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import StructType

    opts = DepotOptions.parse({"cluster": dc.hosts, "module": "Clicks", "depot": "*clicks"})
    reader = DepotStreamReader(opts, StructType())
    try:
        start = reader.initialOffset()
        end = offsets_from_json(reader.latestOffset(start, ReadAllAvailable()))
        statuses = {t: client.depot("Clicks", "*clicks").partition_status(t) for t in range(4)}
        assert {t: o for t, (o, _e) in end.items()} == {t: s.end for t, s in statuses.items()}
        bad = dict(start)
        bad["2"] = {"offset": statuses[2].end + 5, "epoch": statuses[2].epoch}
        with pytest.raises(DepotOffsetOutOfRange, match=r"partition 2.*truncated"):
            reader.latestOffset(bad, ReadAllAvailable())
        with pytest.raises(DepotOffsetOutOfRange, match="partition 2"):
            reader.partitions(start, bad)
    finally:
        reader.stop()


# ------------------------------------------------------------------------------------------- PState


def test_pstate_source_on_an_empty_pstate(spark: Any, dc: DevCluster) -> None:
    register(spark)
    df = (spark.read.format("millrace.pstate").option("cluster", dc.hosts).option("module", "Clicks")
          .option("pstate", "$$visits").load())
    assert df.schema.simpleString() == "struct<task:int,key:string,value:string>"
    assert df.count() == 0
    with pytest.raises(Exception, match=r"no PState '\$\$nope'.*\$\$visits"):
        (spark.read.format("millrace.pstate").option("cluster", dc.hosts).option("module", "Clicks")
         .option("pstate", "$$nope").load().collect())


def test_pstate_source_scans_a_pstate_a_topology_filled(spark: Any, dc: DevCluster, client: Cluster) -> None:
    client.depot("WordCount", "*sentences").append_many(SENTENCES * 25, ack="applied")
    from examples.word_count import words

    expected = Counter(w for s in SENTENCES * 25 for w in words(s))
    counts = client.pstate("WordCount", "$$counts")
    wait_for(lambda: all(counts.select_one(w) == n for w, n in expected.items()), 30, "word counts to apply")

    def scan(**options: str) -> list[Any]:
        r = (spark.read.format("millrace.pstate").option("cluster", dc.hosts).option("module", "WordCount")
             .option("pstate", "$$counts"))
        for k, v in options.items():
            r = r.option(k, v)
        return r.load().collect()

    rows = scan(pageSize="2")  # tiny pages: the cursor logic runs many times
    assert {r["key"]: json.loads(r["value"]) for r in rows} == dict(expected)
    assert len(rows) == len(expected)
    assert all(r["task"] == task_for_key(r["key"], 4) for r in rows)
    ranged = scan(startKey="cat", endKey="sat")
    assert sorted(r["key"] for r in ranged) == sorted(w for w in expected if "cat" <= w < "sat")


# ------------------------------------------------------------------------------------------- Delta


def test_delta_export_is_exactly_once_and_readable_with_sql(spark: Any, dc: DevCluster, client: Cluster,
                                                            clicks: list[dict[str, Any]], tmp_path: Path) -> None:
    table, ckpt = str(tmp_path / "clicks"), str(tmp_path / "clicks._checkpoint")
    depot = client.depot("Clicks", "*clicks")
    applied = sum(depot.partition_status(t).end for t in range(4))
    assert export_depot_to_delta(spark, dc.hosts, "Clicks", "*clicks", table, ckpt,
                                 value_schema="user string, n long, id string") == applied
    assert export_depot_to_delta(spark, dc.hosts, "Clicks", "*clicks", table, ckpt,
                                 value_schema="user string, n long, id string") == 0
    more = [{"user": "late", "n": 1, "id": f"late{i}"} for i in range(100)]
    depot.append_many(more, ack="applied")
    assert export_depot_to_delta(spark, dc.hosts, "Clicks", "*clicks", table, ckpt,
                                 value_schema="user string, n long, id string") == 100

    q = read_delta_sql(table, "SELECT count(*) AS rows, count(DISTINCT id) AS ids, sum(n) AS total FROM {table}")
    assert q.startswith("SELECT") and "delta.`" in q
    row = spark.sql(q).collect()[0]
    assert row["rows"] == row["ids"] == applied + 100
    assert spark.sql(f"SELECT count(*) AS c FROM delta.`{table}` WHERE user = 'late'").collect()[0]["c"] == 100
    dupes = spark.sql(read_delta_sql(table, "SELECT task, offset FROM {table} GROUP BY task, offset "
                                            "HAVING count(*) > 1")).count()
    assert dupes == 0


# ------------------------------------------------------------------------------ record times (issue 28)


def test_record_times_reach_the_client_and_bound_spark_reads(spark: Any, dc: DevCluster, client: Cluster,
                                                             tmp_path: Path) -> None:
    """Leader times and event times come back with read_batch; offset_for_time and the Spark time options agree.

    Runs after the streaming tests (it adds records to *raw, which they read from earliest), before the trim test.
    """
    raw = client.depot("Clicks", "*raw")
    before = int(time.time() * 1000)
    stamped = raw.append({"id": "leader-time"})
    after = int(time.time() * 1000)
    base = after + 10_000_000  # event times later than every leader time in the depot
    for step in (1, 2, 3):
        raw.append_many([{"id": f"e{step}-{i}", "step": step} for i in range(40)], timestamp_ms=base + step * 1_000)
    with pytest.raises(ClientError):
        raw.append({"id": "bad"}, timestamp_ms=-5)
    by_task: dict[int, list[tuple[int, dict[str, Any], int | None]]] = {}
    for task in range(4):
        st = raw.partition_status(task)
        batch = raw.read_batch(task, st.start)
        assert batch.next == st.end and len(batch.timestamps) == len(batch.records)
        by_task[task] = [(batch.start + i, r, t) for i, (r, t) in enumerate(zip(batch.records, batch.timestamps,
                                                                                strict=True))]
    rows = [row for rs in by_task.values() for row in rs]
    assert all(t is not None for _o, _r, t in rows)
    assert [before <= t <= after for _o, r, t in rows if r["id"] == "leader-time"] == [True]
    assert sorted((r["step"], t) for _o, r, t in rows if "step" in r) == sorted(
        (s, base + s * 1_000) for s in (1, 2, 3) for _ in range(40))
    # the client's offset for a time: the first record of step >= 2 per task (or the end)
    for task, rs in by_task.items():
        want = next((o for o, r, _t in rs if r.get("step", 0) >= 2), raw.partition_status(task).end)
        got = raw.offset_for_time(task, base + 2_000)
        assert (got if got is not None else raw.partition_status(task).end) == want
        assert raw.offset_for_time(task, base + 10_000) is None
    assert stamped >= 0

    def steps(**options: str) -> Counter[int]:
        df = depot_df(spark, dc, "*raw", valueSchema="id string, step long", **options)
        return Counter(r["step"] for r in df.collect())

    assert steps(startingTimestamp=str(base + 2_000)) == {2: 40, 3: 40}
    assert steps(startingTimestamp=str(base + 1_500), endingTimestamp=str(base + 3_000)) == {2: 40}
    assert steps(startingTimestamp=str(base + 99_000)) == {}
    ends = {str(t): next((o for o, r, _t in rs if r.get("step") == 3), raw.partition_status(t).end)
            for t, rs in by_task.items()}
    assert steps(startingTimestamp=str(base), endingOffsets=json.dumps(ends)) == {1: 40, 2: 40}
    # options a read cannot honour say so
    with pytest.raises(Exception, match="past the partition's applied end"):
        depot_df(spark, dc, "*raw", endingOffsets=json.dumps({"0": 10**9})).collect()
    with pytest.raises(Exception, match="not both"):
        depot_df(spark, dc, "*raw", startingOffsets="earliest", startingTimestamp="5").collect()
    with pytest.raises(Exception, match="batch reads"):
        depot_df(spark, dc, "*raw", stream=True, endingTimestamp="5").writeStream.format("memory").queryName(
            "bounded").start().awaitTermination(30)
    # a stream from a time reads the records from that time on
    stream = depot_df(spark, dc, "*raw", stream=True, startingTimestamp=str(base + 3_000),
                      valueSchema="id string, step long")
    got = [r for b in run_available_now(stream, tmp_path / "from-time") for r in b]
    assert Counter(r["step"] for r in got) == {3: 40}
# ------------------------------------------------------------------------------------------- retention


def test_a_key_compacted_depot_reads_with_its_gaps(spark: Any, dc: DevCluster, tmp_path: Path) -> None:
    """A depot with key compaction (examples.audit's *events, by user, `depot.compaction.*events=1`: the latest
    record per user)
    has gaps in its offsets; batch and streaming reads return exactly the records it holds, each at its own
    offset (offsets never change), with and without valueSchema."""
    deploy(dc, "Audit", tasks=4, threads=2, module_ref="examples.audit:Audit",
           options={"depot.retention.check.interval.ms": "300", "depot.compaction.*events": "1"})
    with Cluster.connect(dc.hosts) as c:
        clicks = c.depot("Audit", "*events")
        for rnd in range(4):
            clicks.append_many([{"user": f"k{i}", "n": rnd * 100 + i, "id": f"{rnd}-{i}"} for i in range(30)],
                               ack="applied")

        def held() -> dict[tuple[int, int], dict[str, Any]] | None:
            out = {}
            for t in range(4):
                b = clicks.read_batch(t, 0, max_bytes=1 << 24)
                if b.offsets is None or len({r["user"] for r in b.records}) != len(b.records):
                    return None  # not compacted yet
                out.update({(t, o): r for o, r in zip(b.offsets, b.records, strict=True)})
            return out
        wait_for(lambda: held() is not None, 30, "each partition to keep only the latest record of each user")
        want = held()
    assert want is not None and len(want) == 30 and {r["n"] // 100 for r in want.values()} == {3}
    register(spark)

    def reader(r: Any, **options: str) -> Any:
        r = r.format("millrace.depot").option("cluster", dc.hosts).option("module", "Audit")
        r = r.option("depot", "*events").option("recordsPerRequest", "7")  # requests that start and end in gaps
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    typed = reader(spark.read, valueSchema="user string, n long, id string").collect()
    assert {(r["task"], r["offset"]): {"user": r["user"], "n": r["n"], "id": r["id"]} for r in typed} == want
    as_json = reader(spark.read).collect()
    assert {(r["task"], r["offset"]): json.loads(r["value"]) for r in as_json} == want
    streamed = [r for b in run_available_now(reader(spark.readStream, valueSchema="user string, n long"),
                                             tmp_path / "compacted") for r in b]
    assert sorted((r["task"], r["offset"]) for r in streamed) == sorted(want)




@pytest.mark.slow
def test_a_stream_whose_committed_offsets_were_trimmed_fails_with_the_truncation_error(
        spark: Any, dc: DevCluster, client: Cluster, tmp_path: Path) -> None:
    """Retention trimmed records a query had not read yet (`Depot.trim`, as `depot.retention.*` does): the next
    microbatch stops with DepotOffsetOutOfRange naming the trimmed range, and a batch read asking for a trimmed
    offset fails the same way. (Last in the file: it trims *raw.)"""
    raw = client.depot("Clicks", "*raw")
    raw.append_many([{"id": f"t{i}"} for i in range(40)], ack="applied")
    df = depot_df(spark, dc, "*raw", stream=True)
    ckpt = tmp_path / "ckpt"
    assert run_available_now(df, ckpt)
    raw.append_many([{"id": f"t2-{i}"} for i in range(40)], ack="applied")  # not read yet
    ends = {t: raw.partition_status(t).end for t in range(4)}
    for t, end in ends.items():
        assert raw.trim(t, end) == end
    with pytest.raises(Exception, match=r"trimmed") as info:
        run_available_now(df, ckpt)
    assert "below the partition start" in str(info.value)
    task = max(ends, key=lambda t: ends[t])
    with pytest.raises(Exception, match=r"DepotOffsetOutOfRange|trimmed"):
        depot_df(spark, dc, "*raw", startingOffsets=json.dumps({str(task): 0})).collect()
