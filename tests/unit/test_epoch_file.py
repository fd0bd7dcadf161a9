"""The leader-epoch checkpoint: round trips, atomic replacement and damage detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from replog.epoch_file import EpochFile
from replog.errors import CorruptEpochFile

PAIRS = [(0, 0), (2, 1500), (5, 9120), (6, 9120)]


def test_missing_file_means_no_epochs_yet(tmp_path: Path) -> None:
    assert EpochFile(tmp_path / "epochs").load() == []


def test_round_trip_and_replace(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "group" / "epochs")
    f.save(PAIRS)
    assert f.load() == PAIRS
    assert EpochFile(f.path).load() == PAIRS  # a fresh object reads the same file
    f.save([(7, 10)])
    assert f.load() == [(7, 10)]
    f.save(())
    assert f.load() == []
    assert sorted(p.name for p in f.path.parent.iterdir()) == ["epochs"]  # no temp file left behind


def test_file_is_readable_text(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs")
    f.save([(1, 0), (3, 42)])
    lines = f.path.read_text().splitlines()
    assert lines[:4] == ["millrace-epochs 1", "2", "1 0", "3 42"]
    assert lines[4].startswith("crc32c ")


def test_out_of_order_pairs_are_refused(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs")
    for bad in ([(2, 0), (2, 5)], [(3, 0), (1, 5)], [(1, 10), (2, 5)], [(-1, 0)]):
        with pytest.raises(ValueError, match="refusing"):
            f.save(bad)
    assert not f.path.exists()


def test_every_damaged_byte_is_detected(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs")
    f.save(PAIRS)
    data = f.path.read_bytes()
    for i in range(len(data) - 1):  # the final newline carries no information
        damaged = bytearray(data)
        damaged[i] ^= 0x01
        f.path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptEpochFile) as info:
            f.load()
        assert info.value.path == str(f.path), i


def test_truncated_file_is_detected(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs")
    f.save(PAIRS)
    data = f.path.read_bytes()
    for cut in range(len(data) - 1):
        f.path.write_bytes(data[:cut])
        with pytest.raises(CorruptEpochFile):
            f.load()


def test_a_valid_checksum_over_bad_content_is_still_rejected(tmp_path: Path) -> None:
    from crc32c import crc32c

    f = EpochFile(tmp_path / "epochs")
    body = b"millrace-epochs 1\n2\n5 0\n3 10\n"  # epochs go backwards
    f.path.write_bytes(body + f"crc32c {crc32c(body):08x}\n".encode())
    with pytest.raises(CorruptEpochFile, match="does not increase"):
        f.load()
    body = b"millrace-epochs 1\n3\n5 0\n"  # count disagrees
    f.path.write_bytes(body + f"crc32c {crc32c(body):08x}\n".encode())
    with pytest.raises(CorruptEpochFile, match="says 3 pairs"):
        f.load()
