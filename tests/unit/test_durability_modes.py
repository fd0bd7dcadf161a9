"""``replication.fsync``: the option, the storage marks that remember acknowledging from the page cache, and the
page-cache rule (KIP-966's unclean shutdown) that makes such a storage lost after the machine restarted."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest
from crc32c import crc32c

from replog.config import FSYNC_ALWAYS, FSYNC_INTERVAL, ReplicationConfig
from replog.eligibility import UNKNOWN_BOOT, StorageMarks, check_storage
from replog.marks_file import SIZE, MarksFile


def test_the_option_takes_the_words_and_defaults_to_always() -> None:
    assert ReplicationConfig().fsync == FSYNC_ALWAYS and not ReplicationConfig().acks_from_page_cache
    config = ReplicationConfig.from_options({"replication.fsync": "interval", "replication.flush.ms": "50"})
    assert config.fsync == FSYNC_INTERVAL and config.flush_ms == 50 and config.acks_from_page_cache
    assert ReplicationConfig.from_options(config.to_options()) == config
    with pytest.raises(ValueError, match=r"replication\.fsync must be one of"):
        ReplicationConfig(fsync=7)
    with pytest.raises(ValueError, match=r"replication\.flush\.ms must be a positive integer"):
        ReplicationConfig(flush_ms=0)


def test_volatile_marks_round_trip_and_older_files_read_as_always_mode(tmp_path: Path) -> None:
    f = MarksFile(tmp_path / "marks")
    f.save(StorageMarks(9, acked=4, volatile=True, boot=0xFEEDBEEF12345678))
    f.close()
    assert MarksFile(tmp_path / "marks").load() == StorageMarks(9, acked=4, volatile=True, boot=0xFEEDBEEF12345678)
    assert (tmp_path / "marks").stat().st_size == SIZE
    body = struct.pack("<8sQqqqI", b"MRMARKS2", 5, 30, -1, 12, 0)  # the format before the modes
    (tmp_path / "v2").write_bytes(body + struct.pack("<I", crc32c(body)))
    old = MarksFile(tmp_path / "v2")
    assert old.load() == StorageMarks(5, acked=30, applied=12)
    old.update(volatile=True, boot=3)
    old.close()
    assert MarksFile(tmp_path / "v2").load() == StorageMarks(5, acked=30, applied=12, volatile=True, boot=3)


@pytest.mark.parametrize(("volatile", "clean", "boot_now", "lost"), [
    (True, False, 2, True),    # power loss (another boot) after acknowledging from the page cache
    (True, False, 1, False),   # a killed process: the kernel still writes its page cache back
    (True, True, 2, False),    # a clean close flushed everything first
    (False, False, 2, False),  # always mode: every acknowledged entry was fsynced
])
def test_an_unclean_restart_of_the_machine_after_page_cache_acks_is_lost_storage(
        volatile: bool, clean: bool, boot_now: int, lost: bool) -> None:
    marks = StorageMarks(7, acked=3, clean=clean, volatile=volatile, boot=1)
    # the log holds everything the (stale) acked mark names: only the page-cache rule can tell
    why = check_storage(marks, log_end=10, applied=2, boot=boot_now)
    assert (why is not None) == lost
    if lost:
        assert why is not None and "replication.fsync=interval" in why


def test_without_a_boot_id_every_unclean_restart_after_page_cache_acks_is_lost_storage() -> None:
    """Where the kernel gives no boot id, a killed process cannot be told from a power loss: rebuild, never guess."""
    marks = StorageMarks(7, acked=3, volatile=True, boot=UNKNOWN_BOOT)
    assert check_storage(marks, log_end=10, applied=2, boot=UNKNOWN_BOOT) is not None
    assert check_storage(replace(marks, clean=True), log_end=10, applied=2, boot=UNKNOWN_BOOT) is None
    assert check_storage(replace(marks, volatile=False), log_end=10, applied=2, boot=UNKNOWN_BOOT) is None
