"""The applied floor: a replica re-applies what its storage applied before a crash, whatever the ISR (seed 504)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from replog.config import ReplicationConfig
from replog.eligibility import StorageMarks, check_storage
from replog.marks_file import SIZE, MarksFile
from replog.messages import Apply, EpochResponse, GroupState, MetastoreChanged, Replicate, Role, RoleChanged
from replog.replica import Replica
from tests.unit.test_replica_leader import of


def test_floor_round_trips_and_marks_written_before_it_read_with_no_floor(tmp_path: Path) -> None:
    f = MarksFile(tmp_path / "marks")
    f.save(StorageMarks(5, acked=9))
    f.update(applied=7, sync=False)  # after an apply: page cache only
    f.update(acked=12)  # the next flush makes it durable with the rest
    f.close()
    assert MarksFile(tmp_path / "marks").load() == StorageMarks(5, acked=12, applied=7)
    assert (tmp_path / "marks").stat().st_size == SIZE
    # the format before the floor: 40 bytes, MRMARKS1
    body = struct.pack("<8sQqqI", b"MRMARKS1", 5, 30, -1, 1)
    (tmp_path / "old").write_bytes(body + struct.pack("<I", crc32c(body)))
    old = MarksFile(tmp_path / "old")
    assert old.load() == StorageMarks(5, acked=30, clean=True, applied=-1)
    old.update(applied=30, clean=False)
    old.close()
    assert MarksFile(tmp_path / "old").load() == StorageMarks(5, acked=30, applied=30)


def test_a_floor_beyond_the_recovered_log_is_lost_storage() -> None:
    assert check_storage(StorageMarks(7, acked=9, applied=9), log_end=10, applied=2) is None
    why = check_storage(StorageMarks(7, acked=5, applied=11), log_end=10, applied=2)
    assert why is not None and "applied entries up to offset 11" in why


def test_restarted_leader_below_min_isr_re_applies_up_to_its_floor_at_once() -> None:
    """The store came back at 3 (its last flush), the marks say 8 was applied; the followers are down."""
    cfg = ReplicationConfig(replication_factor=3, min_isr=2)
    r = Replica("a", "g", cfg, session=2, log_end=12, epoch_pairs=[(1, 0)], applied=3, applied_floor=8)
    out = r.handle(MetastoreChanged(GroupState("a", 2, ("a", "b", "c"), (), 5, 2)), 0)
    assert r.is_leader and RoleChanged(Role.LEADER, 2, "a") in out
    assert of(out, Apply) == [Apply(8)] and r.applied == 8
    assert r.apply_offset == 8  # 9..11 wait for the commit rule, as before


def test_without_a_floor_the_commit_rule_decides_as_before() -> None:
    cfg = ReplicationConfig(replication_factor=3, min_isr=2)
    r = Replica("a", "g", cfg, session=2, log_end=12, epoch_pairs=[(1, 0)], applied=3)
    out = r.handle(MetastoreChanged(GroupState("a", 2, ("a", "b", "c"), (), 5, 2)), 0)
    assert r.is_leader and of(out, Apply) == []


def test_follower_re_applies_up_to_its_floor_once_reconciled_and_never_truncates_below_it() -> None:
    r = Replica("b", "g", ReplicationConfig(request_timeout_ms=100), session=1, log_end=10,
                epoch_pairs=[(1, 0)], applied=2, applied_floor=6)
    r.handle(MetastoreChanged(GroupState("a", 3, ("a", "b"), (), 9, 1)), 0)
    assert not r.reconciled
    out = r.handle(EpochResponse("a", "b", 3, 1, 1, 10), 1)
    assert r.reconciled and of(out, Apply) == []  # applies with the next frame, as any follower
    out = r.handle(Replicate("a", "b", 3, 10, (), 4), 2)  # the new leader knows only 4 as applied
    assert of(out, Apply) == [Apply(6)]

    r = Replica("b", "g", ReplicationConfig(request_timeout_ms=100), session=1, log_end=10,
                epoch_pairs=[(1, 0)], applied=2, applied_floor=6)
    r.handle(MetastoreChanged(GroupState("a", 3, ("a", "b"), (), 9, 1)), 0)
    with pytest.raises(AssertionError, match="would truncate applied entries"):
        r.handle(EpochResponse("a", "b", 3, 1, 1, 5), 1)  # a leader that lacks 5..6 (a protocol bug)
