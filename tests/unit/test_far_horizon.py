"""Far-horizon transfer pieces without a cluster: the leader's checkpoint shelf and the round's chunk stream."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from conductor.wire import millrace_pb2 as pb
from conductor.worker.far_horizon import (
    CHUNK_BYTES,
    CheckpointShelf,
    Shelved,
    decode_chunk,
    encode_data_chunk,
    stream_checkpoint,
)
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


def test_shelf_shares_a_fresh_checkpoint_between_followers_of_a_group(tmp_path: Path) -> None:
    """Issue 27: the followers a scale adds start their rounds together; one checkpoint (one flush, one GIL-holding
    RocksDB checkpoint, one checksum pass on the leader) serves them all, each in its own directory."""
    shelf = CheckpointShelf(tmp_path / "shelf")
    made: list[Path] = []

    def make(files: dict[str, bytes], offset: int = 41) -> Callable[[Path], Shelved]:
        def counted(directory: Path) -> Shelved:
            made.append(directory)
            s = _make(files)(directory)
            return Shelved(directory, replace(s.manifest, applied_offset=offset), s.epoch_pairs, s.leader_log_end)
        return counted

    first = shelf.take(("M", 0, "n2"), make({"a.sst": b"x"}), lambda: 50, epoch=3)
    second = shelf.take(("M", 0, "n3"), make({"b.sst": b"y"}), lambda: 57, epoch=3)
    assert made == [first.directory] and shelf.shared == 1, "the second follower's round links the first's"
    assert second.directory != first.directory and second.manifest == first.manifest
    assert (second.directory / "a.sst").read_bytes() == b"x" and second.leader_log_end == 57, "its log end is now's"
    assert shelf.release(("M", 0, "n2")) and (second.directory / "a.sst").exists(), "each follower's own links"
    assert shelf.take(("M", 1, "n3"), make({"c.sst": b"z"}), lambda: 9, epoch=3).directory == made[-1], \
        "only the same group's"
    assert shelf.take(("M", 0, "n4"), make({"d.sst": b"w"}), lambda: 60, epoch=4).directory == made[-1], \
        "only the same leader epoch's"
    # a follower's next round never gets a checkpoint at or below its last one's offset
    again = shelf.take(("M", 0, "n3"), make({"e.sst": b"v"}, offset=41), lambda: 61, epoch=4)
    assert again.directory == made[-1]
    stale = CheckpointShelf(tmp_path / "stale", share_within_s=0.0)
    stale.take(("M", 0, "n2"), make({"a.sst": b"x"}), lambda: 50, epoch=3)
    time.sleep(0.01)
    stale.take(("M", 0, "n3"), make({"a.sst": b"x"}), lambda: 50, epoch=3)
    assert stale.shared == 0, "a checkpoint older than share_within_s is not shared"
    assert shelf.take(("M", 0, "n2"), make({"g.sst": b"t"}), epoch=4).directory == made[-1], "no log_end: made"
    # the first follower to finish a copy releases its checkpoint before the other's last round asks: still shared
    late = CheckpointShelf(tmp_path / "late")
    late.take(("M", 0, "n2"), make({"a.sst": b"x"}, offset=50), lambda: 55, epoch=3)
    late.take(("M", 0, "n3"), make({"b.sst": b"y"}), lambda: 56, epoch=3)  # (round 1: n2's, shared)
    late.take(("M", 0, "n2"), make({"c.sst": b"z"}, offset=60), lambda: 65, epoch=3)  # n2's last round
    assert late.release(("M", 0, "n2"))  # n2 installed first
    kept = late.take(("M", 0, "n3"), make({"d.sst": b"w"}), lambda: 66, epoch=3)
    assert late.shared == 2 and kept.manifest.applied_offset == 60 and (kept.directory / "c.sst").read_bytes() == b"z"
    late.share_within_s = 0.0  # the group's own copy goes once older than that
    time.sleep(0.01)
    assert late.sweep() == 0 and late.keys() == [("M", 0, "n3")] and (kept.directory / "c.sst").exists()
    # ... or with the last follower's release: no checkpoint outlives its group's transfers
    late.share_within_s = 60.0
    late.take(("M", 0, "n2"), make({"e.sst": b"v"}, offset=70), lambda: 80, epoch=4)  # (made: a new epoch)
    slot = ("M", 0, "")
    assert late.keys().count(slot) == 1 and late.release(("M", 0, "n3")) and late.keys().count(slot) == 1
    assert late.release(("M", 0, "n2")) and late.keys() == [] and list((tmp_path / "late").iterdir()) == []


def test_round_streams_only_missing_files_in_order(tmp_path: Path) -> None:
    big = os.urandom(CHUNK_BYTES * 2 + 123)
    shelf = CheckpointShelf(tmp_path / "shelf")
    shelved = shelf.take(("M", 0, "n2"), _make({"held.sst": b"old", "big.sst": big, "empty.log": b""}))
    held = next(f for f in shelved.manifest.files if f.name == "held.sst")
    have = [pb.CheckpointFile(name=held.name, size=held.size, crc32c=held.crc32c)]

    async def collect() -> list[pb.CheckpointChunk]:
        # Data chunks come pre-encoded: protobuf must read them as the message they claim to be.
        return [c if isinstance(c, pb.CheckpointChunk) else pb.CheckpointChunk.FromString(c)
                async for c in stream_checkpoint(shelved, have)]

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


def test_chunk_codec_agrees_with_protobuf() -> None:
    for name, offset, data in (("000016.sst", 0, b""), ("MANIFEST-000005", 300, b"abc"),
                               ("x" * 200, 2**40, os.urandom(CHUNK_BYTES))):
        raw = encode_data_chunk(name, offset, memoryview(data))
        m = pb.CheckpointChunk.FromString(raw)
        assert (m.file, m.file_offset, m.data) == (name, offset, data)
        got = decode_chunk(raw)
        assert isinstance(got, tuple) and (got[0], got[1], bytes(got[2])) == (name, offset, data)
    # Another encoder's field order and the round's description still decode, through protobuf.
    other = pb.CheckpointChunk(data=b"zz", file="a.sst", file_offset=7).SerializeToString()
    got = decode_chunk(other)
    assert isinstance(got, tuple) and (got[0], got[1], bytes(got[2])) == ("a.sst", 7, b"zz")
    info = pb.CheckpointChunk(info=pb.CheckpointInfo(leader_log_end=9)).SerializeToString()
    desc = decode_chunk(info)
    assert isinstance(desc, pb.CheckpointChunk) and desc.info.leader_log_end == 9


def test_the_chunk_hook_sees_every_data_chunk_and_what_it_returns_is_sent(tmp_path: Path) -> None:
    """The seam a test's worker launcher uses (``WorkerHooks.chunk_sent``): here it damages the first chunk."""
    from tests.integration.hooked_worker import DamageChunks

    data = os.urandom(CHUNK_BYTES + 10)
    shelved = CheckpointShelf(tmp_path / "shelf").take(("M", 0, "n2"), _make({"a.sst": data}))
    damage = DamageChunks(1)

    async def collect() -> list[pb.CheckpointChunk]:
        return [c if isinstance(c, pb.CheckpointChunk) else pb.CheckpointChunk.FromString(c)
                async for c in stream_checkpoint(shelved, [], damage)]

    chunks = [c for c in asyncio.run(collect())[1:] if c.file == "a.sst"]
    assert [len(c.data) for c in chunks] == [CHUNK_BYTES, 10] and damage.left == 0
    # the next chunk is read (and hooked) in another thread while one is sent: either may be the first the hook
    # sees (the 10-byte one often is); exactly one is damaged, by one flipped byte, and the other is sent as read
    sent = [(c.data, data[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]) for i, c in enumerate(chunks)]
    damaged = [(got, want) for got, want in sent if got != want]
    assert len(damaged) == 1, "exactly one chunk was damaged"
    got, want = damaged[0]
    assert got[0] == want[0] ^ 0xFF and got[1:] == want[1:]


def test_a_long_round_counts_the_entries_the_leader_appended_meanwhile() -> None:
    from replog.catchup import QUICK_ROUND_S, behind_at_install, round_is_last

    # a quick first round: judged by its checkpoint's own distance, as before
    assert behind_at_install(10, QUICK_ROUND_S / 2, None, near_lag=100) == 10
    # a long first round (a throttled copy): the append rate is unknown yet, so another round
    assert not round_is_last(behind_at_install(10, 5.0, None, near_lag=100), 100, 1)
    # later rounds know the leader's append rate: 100 entries/s for 2 s put the replica 200 + 10 behind
    assert behind_at_install(10, 2.0, 100.0, near_lag=100) == 210
    assert round_is_last(behind_at_install(10, 0.2, 100.0, near_lag=100), 100, 2)  # a short diff round: install


