"""Cheap checks of bench.cluster_append's building blocks (the benchmark itself runs for about a minute)."""

from __future__ import annotations

import os

import msgpack

from bench.cluster_append import RECORD_SIZE, Pool, RssSampler, _percentile, make_record, tasks_by_group


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
    assert _percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert tasks_by_group(6, 3) == {0: [0, 3], 1: [1, 4], 2: [2, 5]}
