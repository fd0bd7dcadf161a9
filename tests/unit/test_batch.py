"""The batch frame: layout, round trips, and that every kind of damage is detected."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from replog.batch import (
    HEADER_SIZE,
    Batch,
    check_frames,
    decode_frames,
    encode_batch,
    scan_frames,
    trim_frames,
    truncate_frame,
)
from replog.errors import InvalidFrame


def test_header_layout_matches_the_design() -> None:
    frame = encode_batch(7, 3, [1, 2], [b"ab", b"cde"])
    base, epoch, count, length, crc = struct.unpack_from("<QIIII", frame)
    assert (base, epoch, count) == (7, 3, 2)
    assert length == len(frame) - HEADER_SIZE == 2 * 5 + 5
    # CRC covers the header fields before it and everything after it.
    assert crc == crc32c(frame[HEADER_SIZE:], crc32c(frame[:20]))
    body = frame[HEADER_SIZE:]
    assert body[:2] == bytes([1, 2])  # type column
    assert struct.unpack_from("<2I", body, 2) == (2, 3)  # length column
    assert body[10:] == b"abcde"  # payloads


def test_round_trip_with_one_type_for_all() -> None:
    payloads = [b"x" * n for n in range(50)]
    batch = Batch(encode_batch(100, 9, 4, payloads))
    assert (batch.base_offset, batch.last_offset, batch.next_offset, batch.epoch, batch.count) == (
        100,
        149,
        150,
        9,
        50,
    )
    assert batch.entries() == [(4, p) for p in payloads]
    assert batch.offset_entries()[3] == (103, 9, 4, b"xxx")


def test_encode_rejects_what_could_not_be_decoded() -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        encode_batch(0, 0, 1, [])
    with pytest.raises(ValueError, match="u8"):
        encode_batch(0, 0, 256, [b"a"])
    with pytest.raises(ValueError, match=r"0\.\.255"):
        encode_batch(0, 0, [1, 300], [b"a", b"b"])
    with pytest.raises(ValueError, match="2 entry types for 1"):
        encode_batch(0, 0, [1, 2], [b"a"])
    with pytest.raises(ValueError, match="epoch"):
        encode_batch(0, 1 << 32, 1, [b"a"])
    with pytest.raises(ValueError, match="base offset"):
        encode_batch(-1, 0, 1, [b"a"])


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(0, 1 << 40),
    epoch=st.integers(0, (1 << 32) - 1),
    entries=st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), min_size=1, max_size=30),
)
def test_round_trip_property(base: int, epoch: int, entries: list[tuple[int, bytes]]) -> None:
    types = [t for t, _ in entries]
    frame = encode_batch(base, epoch, types, [p for _, p in entries])
    [batch] = decode_frames(frame, expect_offset=base)
    assert batch.entries() == entries
    assert batch.frame() == frame
    assert (batch.base_offset, batch.epoch, batch.count) == (base, epoch, len(entries))


def _three_frames() -> tuple[bytes, list[bytes]]:
    frames = [
        encode_batch(0, 1, 1, [b"a", b"bb"]),
        encode_batch(2, 1, 2, [b"ccc"]),
        encode_batch(3, 4, [3, 4, 5], [b"", b"dddd", b"e"]),
    ]
    return b"".join(frames), frames


def test_scan_frames_reports_headers_and_boundaries() -> None:
    buf, frames = _three_frames()
    result = scan_frames(buf, expect_offset=0)
    assert result.error is None and not result.torn and result.end == len(buf)
    assert [(f.base_offset, f.epoch, f.entry_count) for f in result.frames] == [
        (0, 1, 2),
        (2, 1, 1),
        (3, 4, 3),
    ]
    assert [f.end - f.start for f in result.frames] == [len(f) for f in frames]
    assert result.frames[1].start == len(frames[0])
    assert [f.next_offset for f in result.frames] == [2, 3, 6]


def test_every_single_byte_flip_is_detected() -> None:
    buf, frames = _three_frames()
    second = len(frames[0])
    for i in range(second, second + len(frames[1])):
        damaged = bytearray(buf)
        damaged[i] ^= 0x5A
        result = scan_frames(bytes(damaged), expect_offset=0)
        assert result.error is not None, f"flip at byte {i} went unnoticed"
        assert result.end == second, f"flip at byte {i}: scan stopped at {result.end}"
        assert len(result.frames) == 1


def test_short_data_is_reported_as_torn() -> None:
    buf, frames = _three_frames()
    last = len(buf) - len(frames[2])
    for cut in range(last + 1, len(buf)):
        result = scan_frames(buf[:cut])
        assert result.torn and result.end == last and len(result.frames) == 2, cut


def test_contiguity_and_epoch_order_are_checked() -> None:
    a = encode_batch(0, 2, 1, [b"a"])
    gap = encode_batch(5, 2, 1, [b"b"])
    assert "expected 1" in (scan_frames(a + gap).error or "")
    assert "expected 3" in (scan_frames(a, expect_offset=3).error or "")
    older = encode_batch(1, 1, 1, [b"b"])
    assert "epoch 1 is lower" in (scan_frames(a + older).error or "")
    assert "epoch 2 is lower" in (scan_frames(a, min_epoch=3).error or "")


def test_lengths_that_do_not_add_up_are_rejected_even_with_a_valid_crc() -> None:
    frame = bytearray(encode_batch(0, 1, 1, [b"ab", b"cd"]))
    struct.pack_into("<2I", frame, HEADER_SIZE + 2, 1, 1)  # lengths say 2 bytes, payload has 4
    struct.pack_into("<I", frame, 20, crc32c(bytes(frame[HEADER_SIZE:]), crc32c(bytes(frame[:20]))))
    assert scan_frames(bytes(frame)).error == "entry lengths do not add up to the payload length"


def test_check_frames_raises_invalid_frame_with_position() -> None:
    buf, frames = _three_frames()
    damaged = bytearray(buf)
    damaged[-1] ^= 1
    with pytest.raises(InvalidFrame) as info:
        check_frames(bytes(damaged))
    assert info.value.position == len(frames[0]) + len(frames[1])
    assert "CRC32C" in str(info.value)


def test_truncate_frame_keeps_a_valid_prefix() -> None:
    frame = encode_batch(10, 3, [1, 2, 3], [b"a", b"b", b"c"])
    cut = truncate_frame(frame, 2)
    [batch] = decode_frames(cut, expect_offset=10)
    assert batch.entries() == [(1, b"a"), (2, b"b")] and batch.epoch == 3
    with pytest.raises(ValueError):
        truncate_frame(frame, 3)


def test_trim_frames_drops_entries_below_an_offset() -> None:
    buf, frames = _three_frames()
    assert trim_frames(buf, 0) == buf
    assert trim_frames(buf, 2) == frames[1] + frames[2]  # boundary: later frames pass byte for byte
    trimmed = trim_frames(buf, 1)
    batches = decode_frames(trimmed, expect_offset=1)
    assert next(e for b in batches for e in b.offset_entries()) == (1, 1, 1, b"bb")
    assert trimmed.endswith(frames[1] + frames[2])
    assert trim_frames(buf, 6) == b""
