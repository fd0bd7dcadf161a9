"""Log.flush fsyncs the directory only when a segment was created or deleted since the last directory fsync."""

from __future__ import annotations

from pathlib import Path

import pytest

import replog.log as replog_log
import replog.segment as replog_segment
from replog.log import Log


@pytest.fixture
def dir_syncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = replog_segment.fsync_dir

    def counting(path: Path) -> None:
        calls.append(path)
        real(path)

    monkeypatch.setattr(replog_log, "fsync_dir", counting)  # segments created, rolled or deleted
    monkeypatch.setattr(replog_segment, "fsync_dir", counting)  # the first segment, on recovery
    return calls


@pytest.mark.parametrize("policy", ["none", "batch", "interval"])
def test_flush_syncs_directory_only_after_segment_changes(tmp_path: Path, dir_syncs: list[Path],
                                                          policy: str) -> None:
    log = Log.open(tmp_path / "log", fsync=policy, segment_bytes=4096)  # type: ignore[arg-type]
    log.flush()  # a fresh Log syncs once: recovery may have created its first segment unsynced
    base = len(dir_syncs)
    assert base >= 1
    for _i in range(5):
        log.append(1, 1, [b"x" * 100])
        log.flush()
    assert len(dir_syncs) == base, "appends within a segment need no directory fsync"
    segments = len(log.segments())
    while len(log.segments()) == segments:  # roll to a new segment
        log.append(1, 1, [b"y" * 500])
    log.flush()
    assert len(dir_syncs) == base + 1, "a new segment's name is made durable once"
    log.append(1, 1, [b"z" * 100])
    log.flush()
    assert len(dir_syncs) == base + 1
    freed = log.delete_segments_below(log.end_offset)
    assert freed > 0
    log.flush()
    assert len(dir_syncs) == base + 2, "a deletion is made durable once"
    log.flush()
    assert len(dir_syncs) == base + 2
    log.close()


def test_flushed_entries_survive_reopen_across_rolls(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "log", fsync="none", segment_bytes=4096)
    for i in range(200):
        log.append(1, 1, [f"entry {i}".encode() * 5])
        if i % 7 == 0:
            log.flush()
    log.flush()
    end = log.end_offset
    assert len(log.segments()) > 1
    log.close()
    with Log.open(tmp_path / "log", fsync="none", segment_bytes=4096) as again:
        assert again.end_offset == end
        assert again.read_entries(0, end)[199][3] == b"entry 199" * 5
