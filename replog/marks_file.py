"""Durable storage marks of one replica (:class:`replog.eligibility.StorageMarks`), beside its epoch file.

The acknowledged mark is rewritten after every log flush, so the file is one
fixed-size record overwritten in place and made durable with ``fdatasync``
(one small write, no rename), and it carries a CRC32C: a torn or damaged
record reads as :class:`CorruptStorageMarks`, which the replica treats as lost
storage (it cannot prove it holds what it acknowledged). Only the first write
creates the file, atomically (:mod:`replog.durable_file`).

Record (little-endian, 40 bytes): ``b"MRMARKS1"``, incarnation (u64), acked
(i64), installing (i64), clean (u32), CRC32C of the bytes before it (u32).
"""

from __future__ import annotations

import os
import struct
from dataclasses import replace
from pathlib import Path

from crc32c import crc32c

from replog.durable_file import replace_durably
from replog.eligibility import StorageMarks
from replog.errors import CorruptStorageMarks

__all__ = ["MarksFile"]

_MAGIC = b"MRMARKS1"
_BODY = struct.Struct("<8sQqqI")
_CRC = struct.Struct("<I")
SIZE = _BODY.size + _CRC.size


class MarksFile:
    """The marks at ``path`` (by convention ``<taskgroup>/marks``, next to ``epochs``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.current: StorageMarks | None = None

    def load(self) -> StorageMarks | None:
        """The saved marks; None if the file does not exist (a new storage directory)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        where = str(self.path)
        if len(data) != SIZE:
            raise CorruptStorageMarks(where, f"{len(data)} bytes, expected {SIZE}")
        body, (stored,) = data[:_BODY.size], _CRC.unpack(data[_BODY.size:])
        if crc32c(body) != stored:
            raise CorruptStorageMarks(where, "checksum mismatch")
        magic, incarnation, acked, installing, clean = _BODY.unpack(body)
        if magic != _MAGIC or incarnation == 0 or clean not in (0, 1):
            raise CorruptStorageMarks(where, "not a storage marks record")
        self.current = StorageMarks(incarnation, acked, installing, bool(clean))
        return self.current

    def save(self, marks: StorageMarks) -> None:
        """Make ``marks`` durable before returning."""
        body = _BODY.pack(_MAGIC, marks.incarnation, marks.acked, marks.installing, int(marks.clean))
        data = body + _CRC.pack(crc32c(body))
        if self._fd is None and not self.path.exists():
            replace_durably(self.path, data)
        else:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY)
            os.pwrite(self._fd, data, 0)
            os.fdatasync(self._fd)
        self.current = marks

    def update(self, **change: int | bool) -> None:
        """Save the current marks with ``change`` applied (they must have been loaded or saved first)."""
        assert self.current is not None, f"{self.path}: marks updated before they were loaded or saved"
        new = replace(self.current, **change)  # type: ignore[arg-type]
        if new != self.current:
            self.save(new)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"MarksFile({str(self.path)!r})"
