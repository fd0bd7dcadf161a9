"""The segmented replog on real files: round trips, truncation, rolling, retention and crash recovery."""

from __future__ import annotations

import logging
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replog.batch import decode_frames, encode_batch, scan_frames, trim_frames
from replog.errors import CorruptLog, InvalidFrame, OffsetOutOfRange, UnexpectedOffset
from replog.log import Log
from replog.tail_cache import TailCache

Model = list[tuple[int, int, bytes]]  # (epoch, type, payload) per offset, from offset 0


def _payloads(first: int, n: int, size: int = 7) -> list[bytes]:
    return [f"{first + i:0{size}d}".encode() for i in range(n)]


def _fill(log: Log, batches: int, per_batch: int, epoch: int = 1) -> None:
    for _ in range(batches):
        log.append(epoch, 5, _payloads(log.end_offset, per_batch))


def _state(log: Log) -> tuple[int, int, int | None]:
    return log.start_offset, log.end_offset, log.last_epoch


def _entries(log: Log) -> list[tuple[int, int, int, bytes]]:
    return log.read_entries(log.start_offset, log.end_offset)


def test_append_read_and_reopen(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log:
        assert _state(log) == (0, 0, None)
        assert log.append(1, 7, [b"a", b"bb"]) == 0
        assert log.append(2, [1, 2, 3], [b"c", b"", b"d"]) == 2
        assert log.end_offset == log.flushed_offset == 5
        expected = [(0, 1, 7, b"a"), (1, 1, 7, b"bb"), (2, 2, 1, b"c"), (3, 2, 2, b""), (4, 2, 3, b"d")]
        assert _entries(log) == expected
        assert log.read_entries(1, 4) == expected[1:4]
        assert log.read_entries(3, 3) == []
    with Log.open(tmp_path) as log:
        assert _entries(log) == expected
        assert log.last_epoch == 2
        assert log.append(2, 0, [b"e"]) == 5


def test_read_returns_whole_frames(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log:
        frames = [encode_batch(i * 10, 1, 1, _payloads(i * 10, 10, 100)) for i in range(5)]
        for f in frames:
            log.append_frames(f)
        size = len(frames[0])
        assert log.read(0, 1) == frames[0]  # at least one frame, even over the budget
        assert log.read(0, size * 2 + size // 2) == frames[0] + frames[1]  # never a partial frame
        assert log.read(13, 10**6) == b"".join(frames[1:])  # starts with the frame holding 13
        assert log.read(0, 10**6, end=20) == frames[0] + frames[1]
        assert log.read(0, 10**6, end=21) == b"".join(frames[:3])
        assert log.read(50, 10) == b""
        for bad in (-1, 51):
            with pytest.raises(OffsetOutOfRange):
                log.read(bad, 10)
        with pytest.raises(OffsetOutOfRange):
            log.read_entries(0, 51)


def test_epochs_never_decrease(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log:
        log.append(3, 1, [b"a"])
        with pytest.raises(ValueError, match="epoch 2"):
            log.append(2, 1, [b"b"])
        with pytest.raises(InvalidFrame, match="lower than the log's last epoch"):
            log.append_frames(encode_batch(1, 2, 1, [b"b"]))
        assert log.end_offset == 1


def test_segments_roll_and_are_deleted_whole(tmp_path: Path) -> None:
    with Log.open(tmp_path, segment_bytes=1000, index_interval_bytes=100) as log:
        _fill(log, 40, 10)  # 10 entries of 7 bytes = 144-byte frames: 6 per segment
        segs = log.segments()
        assert len(segs) == 7 and all(s.size_bytes <= 1000 for s in segs)
        assert [s.base_offset for s in segs] == [i * 60 for i in range(7)]
        assert log.size_bytes() == sum(s.size_bytes for s in segs) == 40 * 144
        assert Path(segs[3].path).name == "00000000000000000180.log"
        assert log.delete_segments_below(119) == segs[0].size_bytes  # 60..119 still needed
        assert log.start_offset == 60
        assert log.delete_segments_below(10**9) == sum(s.size_bytes for s in segs[1:-1])
        assert log.start_offset == 360 and len(log.segments()) == 1  # the active segment stays
        with pytest.raises(OffsetOutOfRange):
            log.read(359, 10)
        assert log.read_entries(360, 362)[1] == (361, 1, 5, b"0000361")
    with Log.open(tmp_path, segment_bytes=1000) as log:
        assert (log.start_offset, log.end_offset) == (360, 400)


def test_reads_span_segments_and_use_the_index(tmp_path: Path) -> None:
    with Log.open(tmp_path, segment_bytes=1000, index_interval_bytes=200) as log:
        for i in range(60):
            log.append(1 + i // 20, i % 3, _payloads(log.end_offset, 1 + i % 4))
        model = _entries(log)
        assert [e[0] for e in model] == list(range(log.end_offset))
        for start in range(0, log.end_offset, 7):
            frames = decode_frames(log.read(start, 700))
            assert frames[0].base_offset <= start < frames[0].next_offset
            got = [e for b in frames for e in b.offset_entries()]
            assert got == model[frames[0].base_offset : frames[0].base_offset + len(got)]
    with Log.open(tmp_path, segment_bytes=1000, verify=True) as log:  # sealed segments indexed lazily
        assert _entries(log) == model


def test_truncate_at_batch_boundary_and_mid_batch(tmp_path: Path) -> None:
    with Log.open(tmp_path, segment_bytes=500) as log:
        _fill(log, 12, 5)
        model = _entries(log)
        log.truncate(100)  # beyond the end: nothing to do
        assert log.end_offset == 60
        log.truncate(45)  # boundary
        assert _entries(log) == model[:45]
        log.truncate(43)  # inside the batch [40, 45)
        assert _entries(log) == model[:43] and log.end_offset == 43
        assert log.append(2, 9, [b"new"]) == 43
        assert log.read_entries(42, 44) == [model[42], (43, 2, 9, b"new")]
    with Log.open(tmp_path, segment_bytes=500) as log:
        assert _entries(log) == [*model[:43], (43, 2, 9, b"new")]
        assert not list(tmp_path.glob("*.swap"))


def test_truncate_to_a_segment_boundary_and_below_the_start(tmp_path: Path) -> None:
    with Log.open(tmp_path, segment_bytes=300) as log:
        _fill(log, 10, 5)
        bases = [s.base_offset for s in log.segments()]
        assert len(bases) > 3
        log.truncate(bases[2])
        assert [s.base_offset for s in log.segments()] == bases[:2]
        assert log.end_offset == bases[2] and log.last_epoch == 1
        log.append(4, 1, [b"x"])
        log.delete_segments_below(bases[1])
        log.truncate(0)  # below the start offset: the log empties and restarts there
        assert _state(log) == (0, 0, None)
        log.reset(1000)  # far-horizon catchup installed state up to 999
        assert (log.start_offset, log.end_offset) == (1000, 1000)
        assert log.append(5, 1, [b"y"]) == 1000
    with Log.open(tmp_path) as log:
        assert _entries(log) == [(1000, 5, 1, b"y")]


def test_append_frames_keeps_the_leaders_bytes(tmp_path: Path) -> None:
    with (
        Log.open(tmp_path / "leader", segment_bytes=600) as leader,
        Log.open(tmp_path / "follower", segment_bytes=400) as follower,
    ):
        _fill(leader, 10, 6)
        raw = leader.read(0, 10**6)
        assert follower.append_frames(raw) == 60
        assert follower.read(0, 10**6) == raw
        assert len(follower.segments()) > 1  # rolled at frame boundaries while appending
        assert follower.append_frames(b"") == 60


def test_append_frames_rejects_gaps_overlaps_and_damage(tmp_path: Path) -> None:
    with Log.open(tmp_path) as log:
        log.append(1, 1, [b"a", b"b"])
        with pytest.raises(UnexpectedOffset, match="a gap") as gap:
            log.append_frames(encode_batch(3, 1, 1, [b"c"]))
        assert (gap.value.expected, gap.value.got) == (2, 3)
        with pytest.raises(UnexpectedOffset, match="an overlap"):
            log.append_frames(encode_batch(1, 1, 1, [b"c"]))
        good = encode_batch(2, 1, 1, [b"c"])
        bad = bytearray(good + encode_batch(3, 1, 1, [b"d"]))
        bad[-1] ^= 0xFF
        with pytest.raises(InvalidFrame, match="CRC32C") as info:
            log.append_frames(bytes(bad))
        assert info.value.position == len(good)
        with pytest.raises(InvalidFrame, match="runs past"):
            log.append_frames(good[:-1])
        assert log.end_offset == 2 and log.size_bytes() == len(encode_batch(0, 1, 1, [b"a", b"b"]))


def test_follower_resumes_after_a_mid_batch_truncation(tmp_path: Path) -> None:
    with Log.open(tmp_path / "leader") as leader, Log.open(tmp_path / "follower") as follower:
        _fill(leader, 3, 10)
        follower.append_frames(leader.read(0, 10**6))
        follower.truncate(15)  # KIP-101 divergence point inside the batch [10, 20)
        raw = leader.read(follower.end_offset, 10**6)
        with pytest.raises(UnexpectedOffset):
            follower.append_frames(raw)  # the leader's frame starts at 10
        follower.append_frames(trim_frames(raw, follower.end_offset))
        assert _entries(follower) == _entries(leader)


def _frame_starts(path: Path) -> list[int]:
    return [f.start for f in scan_frames(path.read_bytes()).frames]


def _log_with_tail(path: Path) -> tuple[Path, int, int, bytes]:
    """A closed log whose last segment holds three frames; returns (segment, last frame start, its base, bytes)."""
    with Log.open(path) as log:
        for n in (3, 4, 5):
            log.append(2, 1, _payloads(log.end_offset, n))
        seg = Path(log.segments()[-1].path)
    data = seg.read_bytes()
    return seg, _frame_starts(seg)[-1], 7, data


def test_torn_tail_is_cut_at_every_byte_position(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seg, last_start, last_base, data = _log_with_tail(tmp_path)
    caplog.set_level(logging.WARNING, logger="millrace.replog")
    rng = random.Random(20261125)
    for pos in range(last_start, len(data)):
        for damage in ("cut", "flip", "garbage"):
            if damage == "cut":
                seg.write_bytes(data[:pos])
            elif damage == "flip":
                seg.write_bytes(data[:pos] + bytes([data[pos] ^ 0x41]) + data[pos + 1 :])
            else:
                # the first garbage byte must differ: an equal byte at the frame's last position rebuilds it
                seg.write_bytes(data[:pos] + bytes([data[pos] ^ 0xFF]) + rng.randbytes(len(data) - pos + 49))
            caplog.clear()
            with Log.open(tmp_path) as log:
                assert log.end_offset == last_base, (pos, damage)
                assert seg.stat().st_size == last_start, (pos, damage)
                assert [e[0] for e in _entries(log)] == list(range(last_base))
            if pos > last_start or damage != "cut":
                assert any(
                    str(seg) in r.getMessage() and f"byte {last_start}" in r.getMessage()
                    for r in caplog.records
                ), (pos, damage)
    with Log.open(tmp_path) as log:  # the repaired log takes appends again
        assert log.append(2, 1, [b"z"]) == last_base


def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    seg, _, _, data = _log_with_tail(tmp_path)
    seg.write_bytes(data + bytes(8192))  # size grew, data never landed (a crash after a metadata update)
    with Log.open(tmp_path) as log:
        assert log.end_offset == 12 and seg.stat().st_size == len(data)


def test_corruption_before_valid_frames_raises(tmp_path: Path) -> None:
    seg, _, _, data = _log_with_tail(tmp_path)
    second = _frame_starts(seg)[1]
    for pos in (second, second + 10, second + 30):  # header and body of the middle frame
        damaged = bytearray(data)
        damaged[pos] ^= 0x10
        seg.write_bytes(bytes(damaged))
        with pytest.raises(CorruptLog) as info:
            Log.open(tmp_path)
        assert info.value.path == str(seg) and info.value.offset == second
        assert "valid frame follows" in info.value.reason
    seg.write_bytes(data)
    with Log.open(tmp_path) as log:  # a failed open released the directory lock
        assert log.end_offset == 12


def test_corruption_in_a_sealed_segment_raises(tmp_path: Path) -> None:
    with Log.open(tmp_path, segment_bytes=200) as log:
        _fill(log, 6, 5)
        first = Path(log.segments()[0].path)
        assert len(log.segments()) >= 3
    data = bytearray(first.read_bytes())
    data[-3] ^= 1
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as info:
        Log.open(tmp_path, segment_bytes=200, verify=True)
    assert info.value.path == str(first)
    with Log.open(tmp_path, segment_bytes=200) as log:  # lazily: the damage shows on first read
        assert log.read_entries(log.segments()[1].base_offset, log.end_offset)
        with pytest.raises(CorruptLog, match=first.name):
            log.read_entries(0, 5)
    first.write_bytes(bytes(data[:-1]))  # a sealed segment may not be short either
    with Log.open(tmp_path, segment_bytes=200) as log, pytest.raises(CorruptLog):
        log.verify()


def test_a_directory_is_opened_once(tmp_path: Path) -> None:
    with Log.open(tmp_path), pytest.raises(BlockingIOError, match="already open"):
        Log.open(tmp_path)
    Log.open(tmp_path).close()


def test_fsync_policies_track_what_is_durable(tmp_path: Path) -> None:
    with Log.open(tmp_path / "none", fsync="none", segment_bytes=200) as log:
        _fill(log, 5, 5)
        assert log.flushed_offset == 0
        log.flush()
        assert log.flushed_offset == 25
    with Log.open(tmp_path / "interval", fsync="interval", fsync_interval_ms=3_600_000) as log:
        _fill(log, 2, 5)
        assert log.flushed_offset == 0
        log.truncate(3)
        assert log.flushed_offset == 0
        log.flush()
        assert log.flushed_offset == 3
    with pytest.raises(ValueError, match="fsync"):
        Log.open(tmp_path / "x", fsync="always")  # type: ignore[arg-type]


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 12), st.integers(0, 30)),
        st.tuples(st.just("truncate"), st.floats(0, 1.05), st.just(0)),
        st.tuples(st.just("delete"), st.floats(0, 1), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
        st.tuples(st.just("frames"), st.integers(1, 3), st.integers(1, 8)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, segment_bytes=st.sampled_from([120, 400, 4096]))
def test_matches_a_list_model(ops: list[tuple[str, float, int]], segment_bytes: int) -> None:
    """Any sequence of appends, truncations, deletions and reopenings reads back like a plain list."""
    with tempfile.TemporaryDirectory() as tmp:
        model: Model = []
        start = 0
        epoch = 1
        log = Log.open(tmp, segment_bytes=segment_bytes, index_interval_bytes=64)
        try:
            for op, a, b in ops:
                if op == "append":
                    n, size = int(a), b
                    payloads = [bytes([len(model) % 251]) * size for _ in range(n)]
                    epoch += len(model) % 2
                    assert log.append(epoch, len(model) % 7, payloads) == len(model)
                    model += [(epoch, len(model) % 7, p) for p in payloads]
                elif op == "frames":
                    raw = b"".join(
                        encode_batch(
                            len(model) + i * b,
                            epoch,
                            3,
                            [b"f%d" % (len(model) + i * b + j) for j in range(b)],
                        )
                        for i in range(int(a))
                    )
                    assert log.append_frames(raw) == len(model) + int(a) * b
                    model += [(epoch, 3, b"f%d" % o) for o in range(len(model), len(model) + int(a) * b)]
                elif op == "truncate":
                    cut = max(int(a * len(model)), start)
                    log.truncate(cut)
                    del model[cut:]
                    epoch = model[-1][0] if model else epoch
                elif op == "delete":
                    log.delete_segments_below(int(a * len(model)))
                    start = log.start_offset
                else:
                    log.close()
                    log = Log.open(tmp, segment_bytes=segment_bytes, index_interval_bytes=64)
                assert (log.start_offset, log.end_offset) == (start, len(model))
                got = log.read_entries(start, len(model))
                assert got == [(o, *model[o]) for o in range(start, len(model))]
                if model and start < len(model):
                    assert log.last_epoch == model[-1][0]
        finally:
            log.close()


def test_a_misplaced_tail_frame_is_corruption_not_a_torn_write(tmp_path: Path) -> None:
    seg, _, _, _data = _log_with_tail(tmp_path)
    seg.rename(tmp_path / "00000000000000000005.log")  # frames no longer match the segment's name
    with pytest.raises(CorruptLog, match="base offset 0, expected 5") as info:
        Log.open(tmp_path)
    assert info.value.offset == 0


def test_a_sealed_segment_missing_its_last_frame_is_detected(tmp_path: Path) -> None:
    with Log.open(tmp_path, segment_bytes=200) as log:
        _fill(log, 6, 5)
        first = Path(log.segments()[0].path)
    starts = _frame_starts(first)
    first.write_bytes(first.read_bytes()[: starts[-1]])
    with pytest.raises(CorruptLog, match="next segment starts at"):
        Log.open(tmp_path, verify=True)


def test_leftover_of_an_interrupted_truncation_is_discarded(tmp_path: Path) -> None:
    seg, _, _, data = _log_with_tail(tmp_path)
    seg.with_name(seg.name + ".swap").write_bytes(data[:10])
    with Log.open(tmp_path) as log:
        assert log.end_offset == 12
    assert not list(tmp_path.glob("*.swap"))


def test_frames_larger_than_the_scan_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("replog.segment.SCAN_CHUNK", 64)  # force chunk boundaries inside and across frames
    with Log.open(tmp_path, segment_bytes=700) as log:
        for n in (1, 30, 2, 50, 3):
            log.append(1, 1, _payloads(log.end_offset, n))
        model = _entries(log)
        assert len(log.segments()) > 1
    with Log.open(tmp_path, segment_bytes=700, verify=True) as log:
        assert _entries(log) == model


def _disk_read(log: Log, start: int, max_bytes: int, end: int | None = None) -> bytes:
    """`read` bypassing the in-memory tail cache."""
    saved = log._tail
    log._tail = TailCache(saved.limit)
    try:
        return log.read(start, max_bytes, end=end)
    finally:
        log._tail = saved


def test_tail_cache_serves_what_the_disk_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads served from the cache of recent frames equal reads from the files, through appends of both
    kinds, mid-batch truncation, eviction, retention and reset."""
    import replog.log as replog_log

    monkeypatch.setattr(replog_log, "TAIL_CACHE_BYTES", 300)  # a few frames: eviction happens (new logs)

    def check(log: Log) -> None:
        for start in range(log.start_offset, log.end_offset):
            for end in (None, start + 2):
                whole = _disk_read(log, start, 10_000, end)
                assert log.read(start, 10_000, end=end) == whole, (start, end)
                for max_bytes in (1, 120):  # "about max_bytes": whole frames, at least one, a prefix of all
                    got = log.read(start, max_bytes, end=end)
                    assert got and whole.startswith(got) and scan_frames(got).error is None, (start, max_bytes)
        assert log.read_entries(log.start_offset, log.end_offset) == _entries(log)

    with Log.open(tmp_path / "leader", segment_bytes=400, fsync="none") as leader, \
            Log.open(tmp_path / "follower", segment_bytes=400, fsync="none") as follower:
        for k in range(12):
            leader.append(1, 5, _payloads(leader.end_offset, 1 + k % 3))
            follower.append_frames(leader.read(follower.end_offset, 10_000))
            check(leader)
            check(follower)
        assert leader._tail.nbytes <= 2 * 300
        leader.truncate(leader.end_offset - 2)  # lands inside the last batch
        follower.truncate(leader.end_offset)
        check(leader)
        check(follower)
        leader.append(2, 5, _payloads(leader.end_offset, 2))
        follower.append_frames(leader.read(follower.end_offset, 10_000))
        check(leader)
        check(follower)
        leader.delete_segments_below(leader.end_offset - 3)
        check(leader)
        follower.reset(50)
        assert follower.read(50, 100) == b""
        follower.append_frames(encode_batch(50, 2, 5, _payloads(50, 3)))
        check(follower)
