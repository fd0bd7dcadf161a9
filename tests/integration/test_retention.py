"""Depot retention on a real cluster: bounds by size and age hold, replicas give disk space back, trims.

One DevCluster (real ZooKeeper, three workers, RF 3) for the file. ``*raw`` is bounded by bytes, ``*clicks``
by age; the leaders check every ``CHECK_MS``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.testing import group_status
from replog.errors import OffsetOutOfRange
from tests.integration.cluster_helpers import Writer, deploy, groups_of, wait_for
from tests.integration.test_metrics import scrape

CHECK_MS = 300
BOUND = 2_000_000
AGE_MS = 2_000
RECORD = "x" * 1_000


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("retention") / "cluster", nodes=3, session_timeout=4.0)
    cluster.start()
    try:
        deploy(cluster, "Clicks", tasks=2, threads=2, options={
            "depot.retention.check.interval.ms": str(CHECK_MS), "depot.retention.bytes.*raw": str(BOUND),
            "depot.retention.ms.*clicks": str(AGE_MS)})
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


def depot_sizes(dc: DevCluster, depot: str) -> dict[int, tuple[int, int, int, int]]:
    """task -> (start, end, records, bytes) of ``depot``, from each group's leader."""
    out = {}
    for g, st in groups_of(dc, "Clicks").items():
        assert st.leader is not None, g
        for d in group_status(dc, st.leader, "Clicks", g).depot_partitions:
            if d.depot == depot:
                out[d.task] = (d.start, d.end, d.records, d.bytes)
    return out


def test_a_bytes_bounded_depot_stays_within_its_bound_and_replicas_give_disk_back(dc: DevCluster,
                                                                                  client: Cluster) -> None:
    raw = client.depot("Clicks", "*raw")
    writer = Writer(lambda recs: raw.append_many(recs, ack="applied"),
                    lambda n: [{"id": f"r{n}-{i}", "pad": RECORD} for i in range(50)]).start()
    peak = 0
    try:
        deadline = time.monotonic() + 60  # until each partition saw about 3x its bound (a loaded machine writes slower)
        while time.monotonic() < deadline and writer.count() * len(RECORD) < 6 * BOUND:
            time.sleep(0.2)
            sizes = depot_sizes(dc, "*raw")
            peak = max([peak, *(b for _s, _e, _n, b in sizes.values())])
    finally:
        writer.stop()
    written = writer.count() * (len(RECORD) + 20)
    assert not writer.errors, writer.errors[:3]
    assert written > 4 * BOUND, f"the writer wrote only {written:,} bytes: too little to test a bound"
    assert peak <= 1.5 * BOUND, f"a partition held {peak:,} bytes; bound {BOUND:,}"
    sizes = depot_sizes(dc, "*raw")
    assert all(s > 0 and n == e - s for s, e, n, _b in sizes.values()), sizes

    # every replica's RocksDB live files stay bounded too: trimmed ranges are compacted away once they hold as
    # many bytes as the partition keeps (pstate.retention.compaction_due) and their trims were flushed, or
    # FLUSH_WAIT_S later (pstate.trimmed_ranges), so each of a replica's two *raw partitions keeps at most about
    # 1.5 x BOUND live plus as much trimmed, whatever the writer wrote
    limit = 2 * 2.5 * BOUND + 1_000_000

    def live_files_bounded() -> bool:
        for node in dc.nodes:
            m = scrape(dc, node)
            sst = [v for (name, _labels), v in m.items() if name == "millrace_pstate_bytes"]
            if not sst or max(sst) > limit:
                return False
        return True
    wait_for(live_files_bounded, 20, f"every replica's live SST bytes under {limit:,.0f} (wrote {written:,})")
    # reads below the start fail with the typed error; from 0, they start at the first record kept
    task = next(iter(sizes))
    start = sizes[task][0]
    with pytest.raises(OffsetOutOfRange):
        raw.read_batch(task, start - 1, start + 1)
    first = raw.read_batch(task, 0, None, 1_000).start  # (a last check may have trimmed since)
    assert first >= start and first == raw.partition_info(task)[0]
    # a client's trim: clamped to the applied end, on every replica
    end = sizes[task][1]
    assert raw.trim(task, end + 1_000) == end
    assert raw.partition_info(task) == (end, end)


def test_an_age_bounded_depot_deletes_old_records_within_one_check_interval(dc: DevCluster,
                                                                           client: Cluster) -> None:
    clicks = client.depot("Clicks", "*clicks")
    clicks.append_many([{"user": f"u{i}", "id": f"old{i}"} for i in range(40)], ack="applied")
    old_at = time.monotonic()
    ends = {t: e for t, (_s, e, _n, _b) in depot_sizes(dc, "*clicks").items()}
    time.sleep(AGE_MS / 2000)
    clicks.append_many([{"user": f"u{i}", "id": f"new{i}"} for i in range(40)], ack="applied")
    # the old records go once they are AGE_MS old, at the latest one check (plus a mark's interval) later
    wait_for(lambda: all(depot_sizes(dc, "*clicks")[t][0] >= e for t, e in ends.items() if e), 15,
             "the old records to be trimmed")
    took = time.monotonic() - old_at
    assert took <= (AGE_MS + 2 * CHECK_MS) / 1000 + 1.0, f"trimmed after {took:.2f}s"
    kept = [r["id"] for t in ends for r in clicks.read(t, 0)]
    assert kept and all(i.startswith("new") for i in kept), kept[:5]


def set_options(dc: DevCluster, options: dict[str, str]) -> None:
    """`conductor set-option` on the running module (live: the leaders' next check uses them)."""
    ms = Metastore(dc.hosts)
    ms.start()
    try:
        for key, value in options.items():
            ms.modules.set_option("Clicks", key, value)
    finally:
        ms.close()


def test_key_compaction_keeps_the_latest_record_of_each_key(dc: DevCluster, client: Cluster) -> None:
    """`depot.compaction.*clicks=1` set live (*clicks is hash_by(user)): once the leaders' checks ran, each
    partition holds exactly the latest record of each user, at its original offset (the model)."""
    set_options(dc, {"depot.retention.ms.*clicks": "0", "depot.compaction.*clicks": "1"})
    clicks = client.depot("Clicks", "*clicks")
    latest: dict[str, int] = {}
    for rnd in range(5):
        recs = [{"user": f"c{i}", "n": rnd} for i in range(20)]
        clicks.append_many(recs, ack="applied")
        latest.update({r["user"]: rnd for r in recs})

    def compacted() -> bool:
        got: dict[str, int] = {}
        for t in range(2):
            batch = clicks.read_batch(t, 0)
            users = [r["user"] for r in batch.records]
            if batch.offsets is None or len(users) != len(set(users)):
                return False  # not compacted yet
            got.update({r["user"]: r["n"] for r in batch.records if r["user"].startswith("c")})
        return got == latest
    wait_for(compacted, 20, "each partition to hold only the latest record of each user")
    for t in range(2):
        batch = clicks.read_batch(t, 0)
        assert batch.offsets is not None and batch.offsets == sorted(batch.offsets)
        _start, end = clicks.partition_info(t)
        assert batch.offsets[-1] == end - 1  # offsets never change: the latest record is where it was appended
