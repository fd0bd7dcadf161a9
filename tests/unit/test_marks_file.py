"""The storage marks file: durable, checksummed, overwritten in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from replog.eligibility import StorageMarks
from replog.errors import CorruptStorageMarks
from replog.marks_file import SIZE, MarksFile


def test_missing_file_means_new_storage_and_saves_round_trip(tmp_path: Path) -> None:
    f = MarksFile(tmp_path / "g" / "marks")
    assert f.load() is None
    f.save(StorageMarks(12345, acked=-1))
    f.update(acked=41)
    f.update(installing=50)
    f.update(acked=50, installing=-1, clean=True)
    f.close()
    assert MarksFile(tmp_path / "g" / "marks").load() == StorageMarks(12345, acked=50, installing=-1, clean=True)
    assert (tmp_path / "g" / "marks").stat().st_size == SIZE


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_marks_are_reported_not_trusted(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "marks"
    f = MarksFile(path)
    f.save(StorageMarks(7, acked=99))
    f.close()
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[17] ^= 0x40  # inside the acked offset
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(bytes(data[:20]))
    with pytest.raises(CorruptStorageMarks):
        MarksFile(path).load()
