"""EpochCache: the KIP-101/KIP-279 lookups and truncations, plus a model-based property test."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replog.epochs import UNDEFINED_EPOCH, EpochCache


def test_end_offset_for_is_start_of_next_epoch_or_log_end() -> None:
    c = EpochCache([(1, 0), (3, 10), (6, 25)])
    assert c.end_offset_for(1, 40) == (1, 10)
    assert c.end_offset_for(2, 40) == (1, 10)  # largest epoch <= 2 is 1
    assert c.end_offset_for(3, 40) == (3, 25)
    assert c.end_offset_for(5, 40) == (3, 25)
    assert c.end_offset_for(6, 40) == (6, 40)
    assert c.end_offset_for(9, 40) == (6, 40)


def test_end_offset_for_before_every_epoch_and_empty() -> None:
    assert EpochCache([(4, 7)]).end_offset_for(2, 20) == (UNDEFINED_EPOCH, 7)
    assert EpochCache().end_offset_for(2, 0) == (UNDEFINED_EPOCH, 0)


def test_assign_same_epoch_is_a_noop_and_older_epoch_is_a_bug() -> None:
    c = EpochCache()
    assert c.assign(1, 0)
    assert not c.assign(1, 5)
    assert c.to_pairs() == [(1, 0)]
    with pytest.raises(AssertionError):
        c.assign(0, 9)


def test_assign_at_same_start_replaces_empty_epochs() -> None:
    c = EpochCache([(1, 0), (2, 5)])
    c.assign(3, 5)  # epoch 2 wrote nothing
    assert c.to_pairs() == [(1, 0), (3, 5)]
    assert c.end_offset_for(2, 9) == (1, 5)


def test_truncate_from_end_drops_epochs_starting_at_or_after_the_cut() -> None:
    c = EpochCache([(1, 0), (3, 10), (6, 25)])
    assert c.truncate_from_end(25)
    assert c.to_pairs() == [(1, 0), (3, 10)]
    assert not c.truncate_from_end(11)
    assert c.truncate_from_end(0)
    assert c.to_pairs() == []


def test_truncate_from_start_clamps_the_epoch_containing_the_new_start() -> None:
    c = EpochCache([(1, 0), (3, 10), (6, 25)])
    assert c.truncate_from_start(12)
    assert c.to_pairs() == [(3, 12), (6, 25)]
    assert not c.truncate_from_start(12)
    assert c.truncate_from_start(25)
    assert c.to_pairs() == [(6, 25)]


def test_pairs_round_trip_and_epoch_at() -> None:
    c = EpochCache([(1, 0), (3, 10)])
    assert EpochCache.from_pairs(c.to_pairs()).to_pairs() == c.to_pairs()
    assert [c.epoch_at(o) for o in (0, 9, 10, 50)] == [1, 1, 3, 3]
    assert EpochCache([(2, 4)]).epoch_at(3) is None


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 5)), min_size=1, max_size=20),
       st.integers(0, 30))
def test_end_offset_for_matches_a_per_entry_model(steps: list[tuple[int, int]], query: int) -> None:
    """Build a log entry by entry (epoch bumps, appends) and compare every lookup with brute force.

    Known epochs are those that wrote entries plus the latest (a leader's epoch counts from the
    moment it is assigned, before it writes).
    """
    entries: list[int] = []
    cache = EpochCache()
    epoch = 0
    for bump, count in steps:
        epoch += bump
        cache.assign(epoch, len(entries))  # a leader records its epoch before writing
        entries.extend([epoch] * count)
    log_end = len(entries)
    known = set(entries) | {epoch}
    q = query % (epoch + 2)
    found, end = cache.end_offset_for(q, log_end)
    if not any(e <= q for e in known):
        assert found == UNDEFINED_EPOCH
        assert end == 0  # every known epoch is newer: nothing of the asker's history can match
    else:
        assert found == max(e for e in known if e <= q)
        if found == epoch:
            assert end == log_end
        else:
            assert end == max(i for i, e in enumerate(entries) if e <= found) + 1
