"""UnbufferedFile: a copied file gets every byte in order, reaches the disk as it comes, never all at the end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.worker import unbuffered_file
from conductor.worker.far_horizon import IncomingFile
from conductor.worker.unbuffered_file import ALIGN, BUFFER_BYTES, SYNC_EVERY_BYTES, UnbufferedFile
from pstate.checkpoint import ManifestFile


def _require_direct(path: Path) -> None:
    """These tests need a filesystem with O_DIRECT (ext4, xfs, tmpfs since Linux 6.6): fail loudly without one."""
    f = UnbufferedFile(path / "probe")
    try:
        assert f.direct, f"{path} takes no O_DIRECT writes: run the tests with a temp dir on ext4 or xfs (--basetemp)"
    finally:
        f.close()
        (path / "probe").unlink()


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * BUFFER_BYTES // 2), max_size=6), direct=st.booleans())
def test_the_file_holds_every_byte_written_in_order(tmp_path_factory: Any, sizes: list[int], direct: bool) -> None:
    path = tmp_path_factory.mktemp("f") / "000001.sst"
    data = os.urandom(sum(sizes))
    f = UnbufferedFile(path, direct=direct)
    at = 0
    for n in sizes:
        f.write(memoryview(data)[at:at + n] if n % 2 else data[at:at + n])
        at += n
    f.sync()
    f.close()
    assert path.read_bytes() == data


def test_direct_writes_reach_the_file_a_buffer_at_a_time_and_the_tail_at_drain(tmp_path: Path) -> None:
    _require_direct(tmp_path)
    path = tmp_path / "000001.sst"
    f = UnbufferedFile(path)
    assert f.direct
    sizes = []
    chunk = os.urandom(256 * 1024 + 1)  # never aligned: the buffer carries a remainder between writes
    for _ in range(9):
        f.write(chunk)
        sizes.append(path.stat().st_size)
    # whole buffers went out as they filled (nothing waits for a sync at the end), each of them aligned
    assert sizes == [BUFFER_BYTES * (len(chunk) * (i + 1) // BUFFER_BYTES) for i in range(9)]
    f.drain()
    assert path.stat().st_size == 9 * len(chunk) and not f.direct  # the unaligned tail went through the cache
    f.sync()
    f.close()
    assert path.read_bytes() == chunk * 9


def test_without_o_direct_the_file_is_synced_every_mebibyte_not_in_one_burst(tmp_path: Path,
                                                                              monkeypatch: Any) -> None:
    # one fsync of a whole 24 MB file queued ahead of the replog fdatasyncs of every replica on the same disk
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(os.fstat(fd).st_size), real(fd)))
    data = os.urandom(256 * 1024)
    f = UnbufferedFile(tmp_path / "000001.sst", direct=False)
    for _ in range(12):
        f.write(data)
    f.sync()
    f.close()
    assert synced == [SYNC_EVERY_BYTES * k for k in (1, 2, 3)]
    assert (tmp_path / "000001.sst").stat().st_size == 12 * len(data)


def test_a_filesystem_that_refuses_direct_writes_gets_the_buffered_path(tmp_path: Path, monkeypatch: Any) -> None:
    _require_direct(tmp_path)
    real_write = os.write
    refused = []

    def write(fd: int, data: Any) -> int:
        if not refused:
            refused.append(fd)
            raise OSError(22, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(unbuffered_file.os, "write", write)
    data = os.urandom(3 * BUFFER_BYTES + ALIGN // 2)
    f = UnbufferedFile(tmp_path / "000001.sst")
    f.write(data)
    assert not f.direct and refused
    f.sync()
    f.close()
    assert (tmp_path / "000001.sst").read_bytes() == data


def test_an_incoming_file_checksums_what_it_writes(tmp_path: Path) -> None:
    import crc32c

    data = os.urandom(BUFFER_BYTES + 12345)
    f = IncomingFile(ManifestFile("000001.sst", len(data), crc32c.crc32c(data)), tmp_path / "000001.sst")
    f.write(data[:1000])
    f.write(data[1000:])
    f.flush()
    assert f.size == f.meta.size and f.crc == f.meta.crc32c
    assert (tmp_path / "000001.sst").stat().st_size == len(data)  # all of it in the file before its stamp
    f.sync_and_close()
    assert (tmp_path / "000001.sst").read_bytes() == data
