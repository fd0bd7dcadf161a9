"""Durable leader-epoch checkpoint: the ``(epoch, start offset)`` pairs of a replica.

KIP-101 truncation compares these pairs between leader and follower, so losing
or misreading them can make a follower keep entries the new leader never had.
The file is therefore replaced atomically (:mod:`replog.durable_file`) and
carries a CRC32C, so a reader sees either the old or the new list, and
damage is reported instead of silently trusted.

Format (text, so an operator can read it with ``cat``)::

    millrace-epochs 1
    3
    0 0
    2 1500
    5 9120
    crc32c 1a2b3c4d

Line 1 names the format and its version, line 2 the number of pairs, then one
``epoch start_offset`` pair per line, and last the CRC32C (hex) of every byte
before that line.  Epochs strictly increase and start offsets never decrease.
The in-memory logic (lookups, assignment, truncation of the cache) lives in
:mod:`replog.epochs`; this module only persists what it is given.
"""

from __future__ import annotations

import os
from pathlib import Path

from crc32c import crc32c

from replog.durable_file import replace_durably
from replog.errors import CorruptEpochFile

__all__ = ["EpochFile"]

_MAGIC = "millrace-epochs 1"


def _check_pairs(pairs: list[tuple[int, int]]) -> str | None:
    """Why ``pairs`` is not a valid epoch list, or ``None``."""
    prev: tuple[int, int] | None = None
    for epoch, start in pairs:
        if epoch < 0 or start < 0:
            return f"negative value in pair ({epoch}, {start})"
        if prev is not None:
            if epoch <= prev[0]:
                return f"epoch {epoch} does not increase after epoch {prev[0]}"
            if start < prev[1]:
                return f"start offset {start} of epoch {epoch} is below {prev[1]} of epoch {prev[0]}"
        prev = (epoch, start)
    return None


class EpochFile:
    """The checkpoint at ``path`` (by convention ``<taskgroup>/epochs``, next to ``replog/``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> list[tuple[int, int]]:
        """The saved pairs, oldest epoch first; ``[]`` if the file does not exist yet (a new replica).

        Raises :class:`CorruptEpochFile` when the checksum, the syntax or the order
        of the pairs is wrong.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        where = str(self.path)
        body, sep, last = data.rstrip(b"\n").rpartition(b"\n")
        if not sep or not last.startswith(b"crc32c "):
            raise CorruptEpochFile(where, "missing checksum line (truncated write?)")
        try:
            stored = int(last[len(b"crc32c ") :], 16)
        except ValueError:
            raise CorruptEpochFile(where, f"unreadable checksum {last!r}") from None
        body += b"\n"
        if crc32c(body) != stored:
            raise CorruptEpochFile(where, "checksum mismatch")
        try:
            lines = body.decode("ascii").splitlines()
        except UnicodeDecodeError:
            raise CorruptEpochFile(where, "non-ASCII content") from None
        if not lines or lines[0] != _MAGIC:
            raise CorruptEpochFile(where, f"unknown format header {lines[0] if lines else ''!r}")
        try:
            count = int(lines[1])
            pairs = []
            for line in lines[2:]:
                epoch_s, start_s = line.split(" ")
                pairs.append((int(epoch_s), int(start_s)))
        except (IndexError, ValueError):
            raise CorruptEpochFile(where, "malformed pair list") from None
        if count != len(pairs):
            raise CorruptEpochFile(where, f"header says {count} pairs, found {len(pairs)}")
        problem = _check_pairs(pairs)
        if problem is not None:
            raise CorruptEpochFile(where, problem)
        return pairs

    def save(self, pairs: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> None:
        """Replace the checkpoint with ``pairs``, durably and atomically.

        Raises ``ValueError`` for pairs that are out of order (refusing to persist a
        list :meth:`load` would reject later).
        """
        pairs = [(int(e), int(s)) for e, s in pairs]
        problem = _check_pairs(pairs)
        if problem is not None:
            raise ValueError(f"refusing to save leader epochs {pairs}: {problem}")
        lines = [_MAGIC, str(len(pairs)), *(f"{e} {s}" for e, s in pairs)]
        body = ("\n".join(lines) + "\n").encode("ascii")
        data = body + f"crc32c {crc32c(body):08x}\n".encode("ascii")
        replace_durably(self.path, data)

    def __repr__(self) -> str:
        return f"EpochFile({str(self.path)!r})"
