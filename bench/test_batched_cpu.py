"""Cheap checks of bench.batched_cpu's accounting (the benchmark itself runs a cluster for about a minute)."""

from __future__ import annotations

import os
import threading

from bench.batched_cpu import BUDGET_US, per_record, proc_times, snapshot, thread_times


def test_the_budget_is_two_cores_over_500k_records() -> None:
    assert BUDGET_US == 4.0


def test_times_of_this_process_and_its_threads() -> None:
    sum(i * i for i in range(200_000))  # some CPU time to count
    user, system = proc_times(os.getpid())
    assert user > 0 and system >= 0
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        kinds = thread_times(os.getpid())
    finally:
        done.set()
        t.join()
    assert kinds["event_loop"] > 0 and "other" in kinds and set(kinds) <= {"event_loop", "rocksdb", "other"}
    assert set(snapshot({"client": os.getpid()})) == {"client", "client.system"}


def test_per_record_is_the_growth_in_microseconds() -> None:
    assert per_record({"a": 1.0}, {"a": 1.5, "b": 0.25}, 250_000) == {"a": 2.0, "b": 1.0}
