"""Cheap checks of bench.topology's building blocks (the benchmark itself runs for minutes)."""

from __future__ import annotations

import os
import time

from bench.topology import corpus, cpu_seconds


def test_the_corpus_is_reproducible_and_tokenized_by_split() -> None:
    a, b = corpus(200, seed=3), corpus(200, seed=3)
    assert a == b and a != corpus(200, seed=4)
    assert all(6 <= len(s.split()) <= 14 and s == s.lower() and s.replace(" ", "").isalnum() for s in a)


def test_cpu_seconds_counts_a_process_cpu() -> None:
    before = cpu_seconds([os.getpid()])
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:
        pass
    assert cpu_seconds([os.getpid()]) - before >= 0.1
