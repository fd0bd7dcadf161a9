"""Far-horizon transfer pieces without a cluster: the leader's checkpoint shelf and the round's chunk stream."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from conductor.far_horizon import CHUNK_BYTES, CheckpointShelf, Shelved, read_chunk, stream_checkpoint
from proto import millrace_pb2 as pb
from pstate.checkpoint import take_checkpoint


def _make(files: dict[str, bytes]) -> Callable[[Path], Shelved]:
    def make(directory: Path) -> Shelved:
        directory.mkdir(parents=True)
        for name, data in files.items():
            (directory / name).write_bytes(data)
        manifest = take_checkpoint(str(directory), applied_offset=41, leader_epoch=3)
        return Shelved(directory, manifest, [(1, 0), (3, 17)], leader_log_end=50)
    return make


def test_shelf_keeps_one_checkpoint_per_follower_and_releases_it(tmp_path: Path) -> None:
    (tmp_path / "shelf").mkdir()
    (tmp_path / "shelf" / "leftover-from-a-crash").mkdir()
    shelf = CheckpointShelf(tmp_path / "shelf")
    assert list((tmp_path / "shelf").iterdir()) == [], "leftovers of an earlier run belong to no transfer"
    first = shelf.take(("M", 0, "n2"), _make({"a.sst": b"x"}))
    second = shelf.take(("M", 0, "n2"), _make({"a.sst": b"x", "b.sst": b"y"}))
    other = shelf.take(("M", 1, "n2"), _make({"c.sst": b"z"}))
    assert not first.directory.exists(), "a new round replaces the follower's previous checkpoint"
    assert second.directory.exists() and other.directory.exists()
    assert shelf.release(("M", 0, "n2")) and not second.directory.exists()
    assert not shelf.release(("M", 0, "n2"))
    other.last_used = time.monotonic() - 1_000
    assert shelf.sweep() == 1 and not other.directory.exists() and shelf.keys() == []


def test_round_streams_only_missing_files_in_order(tmp_path: Path) -> None:
    big = os.urandom(CHUNK_BYTES * 2 + 123)
    shelf = CheckpointShelf(tmp_path / "shelf")
    shelved = shelf.take(("M", 0, "n2"), _make({"held.sst": b"old", "big.sst": big, "empty.log": b""}))
    held = next(f for f in shelved.manifest.files if f.name == "held.sst")
    have = [pb.CheckpointFile(name=held.name, size=held.size, crc32c=held.crc32c)]

    async def read(path: Path, offset: int) -> bytes:
        return read_chunk(path, offset)

    async def collect() -> list[pb.CheckpointChunk]:
        return [c async for c in stream_checkpoint(shelved, have, read)]

    chunks = asyncio.run(collect())
    info = chunks[0].info
    assert info.leader_log_end == 50 and list(zip(info.epochs, info.epoch_starts, strict=True)) == [(1, 0), (3, 17)]
    assert info.send_bytes == len(big)
    got: dict[str, bytearray] = {}
    for c in chunks[1:]:
        buf = got.setdefault(c.file, bytearray())
        assert c.file_offset == len(buf)
        buf += c.data
    assert set(got) == {"big.sst", "empty.log"}, "a file the follower verified is not sent again"
    assert bytes(got["big.sst"]) == big and got["empty.log"] == b""
