"""Cheap checks of bench.cluster_append's building blocks (the benchmark itself runs for about a minute)."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack

from bench.cluster_append import (
    RECORD_SIZE,
    Pool,
    RssSampler,
    make_record,
    tasks_by_group,
)
from bench.design_floor import design_floor
from bench.floor import percentile, transport_floor
from conductor.devcluster import DevCluster


def test_records_are_exactly_the_record_size_and_distinct() -> None:
    pool = Pool.build(300)
    assert {len(b) for b in pool.encoded} == {RECORD_SIZE}
    assert len(set(pool.encoded)) == 300
    assert msgpack.unpackb(pool.encoded[7]) == make_record(7)


def test_rss_sampler_reads_proc_status_of_a_live_pid() -> None:
    s = RssSampler({"me": os.getpid()}, interval_s=0.01).start()
    s.stop()
    assert s.samples >= 1
    assert 1 < s.max_mb()["me"] < 4096


def test_percentile_and_task_groups() -> None:
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert tasks_by_group(6, 3) == {0: [0, 3], 1: [1, 4], 2: [2, 5]}


def test_transport_floor_measures_a_real_node_and_the_disk(tmp_path: Path) -> None:
    """The floor's round trip is answered by a real node (NotLeader for a module nobody hosts), no work done."""
    with DevCluster(tmp_path / "cluster", nodes=1, conductors=0) as dc:
        address = (dc.node_dir("n1") / "node.address").read_text()
        floor = transport_floor(address, tmp_path, 200)
        assert dc.nodes["n1"].alive()
    assert 0 < floor["rtt_p50_ms"] < 100 and 0 < floor["fsync_p50_ms"] < 100
    assert floor["p50_ms"] == 2 * floor["rtt_p50_ms"] + floor["fsync_p50_ms"]
    assert not (tmp_path / "fsync-probe").exists()


def test_design_floor_adds_a_replication_link_round_trip_to_a_worker_that_does_no_work() -> None:
    transport = {"rtt_p50_ms": 0.2, "fsync_p50_ms": 0.3}
    floor = design_floor(transport, 200)  # (a real PeerTransport to a real PeerServer in an echo process)
    assert 0 < floor["peer_rtt_p50_ms"] < 100 and floor["peer_rtt_p50_ms"] <= floor["peer_rtt_p99_ms"]
    assert floor["p50_ms"] == 0.2 + floor["peer_rtt_p50_ms"] + 0.3


def test_the_topology_chains_follower_lives_on_another_group_than_its_author() -> None:
    from bench.cluster_topology import CHAIN_AUTHOR, chain_follower
    from topology.partitioners import task_for_key

    follower = chain_follower(16, 4)
    assert task_for_key(follower, 16) % 4 != task_for_key(CHAIN_AUTHOR, 16) % 4


def test_the_goals_are_issue_32s_each_keyed_by_the_figure_it_judges() -> None:
    from bench.cluster_append import GOAL_KEYS, issue_goals

    mr = {"batched_records_per_s": 500_000, "topology_p50_ms": 4.5, "p50_ms": 3.0, "max_node_rss_mb": 512.0}
    goals = issue_goals(mr, 1.0, 1.0, 1.0)
    assert set(goals) == {"ratio_p50_vs_jetstream_sync_always<=1.0", "ratio_pipelined_vs_jetstream_sync_always>=1.0",
                          "ratio_p50_interval_vs_jetstream_default<=1.0", "batched_records_per_s>=500000",
                          "topology_p50_ms<=1.5x_p50_ms", "max_node_rss_mb<=512"}
    assert all(goals.values())  # every figure exactly at its goal meets it
    missed = issue_goals({**mr, "batched_records_per_s": 499_999, "topology_p50_ms": 4.6}, 1.01, 0.99, None)
    assert missed[GOAL_KEYS["batched"]] is False and missed[GOAL_KEYS["topology"]] is False
    assert missed[GOAL_KEYS["p50"]] is False and missed[GOAL_KEYS["pipelined"]] is False
    assert missed[GOAL_KEYS["interval"]] is None  # not measured: neither met nor missed
