"""Durable storage marks of one replica (:class:`replog.eligibility.StorageMarks`), beside its epoch file.

The marks are rewritten with every log flush, so the file is one
fixed-size record overwritten in place and made durable with ``fdatasync``
(one small write, no rename), and it carries a CRC32C: a torn or damaged
record reads as :class:`CorruptStorageMarks`, which the replica treats as lost
storage (it cannot prove it holds what it acknowledged). Only the first write
creates the file, atomically (:mod:`replog.durable_file`).

The applied floor (``StorageMarks.applied``) rides in the same record. It is
written with every flush's fdatasync as the other marks, and also after every
apply without a sync (:meth:`MarksFile.update` with ``sync=False``, one
``pwrite``): the page cache keeps that across a SIGKILL, so a killed replica
re-applies everything it applied; after a power loss the floor trails by at most
one flush. Every value such a write carries is already durable elsewhere (the
acked mark as before, the floor's entries in the flushed replog), so losing it
loses nothing promised.

In ``always`` mode a flush's marks are written beside the log's ``fdatasync``
(:meth:`MarksFile.save` without a sync, then :meth:`MarksFile.sync` from another
thread while the log's runs), claiming the flush in flight (``claimed``), and the
flush is reported once both returned (docs/data-on-disk.md, "The storage marks").

Record (little-endian, 68 bytes): ``b"MRMARKS4"``, incarnation (u64), acked
(i64), installing (i64), applied (i64), clean (u32), volatile (u32), boot (u64),
claimed (i64), CRC32C of the bytes before it (u32). Older files are read and
rewritten in the new format: ``b"MRMARKS3"`` (60 bytes, no claimed field: -1),
``b"MRMARKS2"`` (48 bytes, no volatile or boot either: an ``always``-mode storage)
and ``b"MRMARKS1"`` (40 bytes, no applied field either: floor -1).

``volatile`` (``replication.fsync=interval``, :func:`replog.eligibility.check_storage`)
is set with a synced write before the first acknowledgement from the page
cache, with the machine's ``boot`` id, and stays set while the replica runs in
that mode; a clean close writes ``clean`` after the last flush.
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

_MAGIC = b"MRMARKS4"
_BODY = struct.Struct("<8sQqqqIIQq")
_CRC = struct.Struct("<I")
SIZE = _BODY.size + _CRC.size
#: the format before the marks were written beside the log: no claimed field
_MAGIC_V3 = b"MRMARKS3"
_BODY_V3 = struct.Struct("<8sQqqqIIQ")
#: the format before the durability modes: no volatile or boot fields
_MAGIC_V2 = b"MRMARKS2"
_BODY_V2 = struct.Struct("<8sQqqqI")
#: the format before the applied floor: no applied field
_MAGIC_V1 = b"MRMARKS1"
_BODY_V1 = struct.Struct("<8sQqqI")
_SIZES = {SIZE: (_MAGIC, _BODY), _BODY_V3.size + _CRC.size: (_MAGIC_V3, _BODY_V3), _BODY_V2.size + _CRC.size: (_MAGIC_V2, _BODY_V2),
          _BODY_V1.size + _CRC.size: (_MAGIC_V1, _BODY_V1)}


class MarksFile:
    """The marks at ``path`` (by convention ``<taskgroup>/marks``, next to ``epochs``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.current: StorageMarks | None = None
        #: the last write was not synced (the next synced update syncs even if nothing changed)
        self._unsynced = False

    def load(self) -> StorageMarks | None:
        """The saved marks; None if the file does not exist (a new storage directory)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        where = str(self.path)
        if len(data) not in _SIZES:
            raise CorruptStorageMarks(where, f"{len(data)} bytes, expected {SIZE}")
        expect, fmt = _SIZES[len(data)]
        body, (stored,) = data[:fmt.size], _CRC.unpack(data[fmt.size:])
        if crc32c(body) != stored:
            raise CorruptStorageMarks(where, "checksum mismatch")
        volatile, boot, claimed = 0, 0, -1
        if fmt is _BODY:
            magic, incarnation, acked, installing, applied, clean, volatile, boot, claimed = fmt.unpack(body)
        elif fmt is _BODY_V3:
            magic, incarnation, acked, installing, applied, clean, volatile, boot = fmt.unpack(body)
        elif fmt is _BODY_V2:
            magic, incarnation, acked, installing, applied, clean = fmt.unpack(body)
        else:
            (magic, incarnation, acked, installing, clean), applied = fmt.unpack(body), -1
        if magic != expect or incarnation == 0 or clean not in (0, 1) or volatile not in (0, 1):
            raise CorruptStorageMarks(where, "not a storage marks record")
        self.current = StorageMarks(incarnation, acked, installing, bool(clean), applied, bool(volatile), boot,
                                    claimed)
        return self.current

    def save(self, marks: StorageMarks, *, sync: bool = True) -> None:
        """Write ``marks``; durable before returning unless ``sync`` is False (then in the page cache only,
        which a killed process does not lose: see the module docstring for when that is enough)."""
        body = _BODY.pack(_MAGIC, marks.incarnation, marks.acked, marks.installing, marks.applied,
                          int(marks.clean), int(marks.volatile), marks.boot, marks.claimed)
        data = body + _CRC.pack(crc32c(body))
        if self._fd is None and not self.path.exists():
            replace_durably(self.path, data)
        else:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY)
            os.pwrite(self._fd, data, 0)
            if sync:
                os.fdatasync(self._fd)
        self._unsynced = not sync
        self.current = marks

    def update(self, *, sync: bool = True, **change: int | bool) -> None:
        """Save the current marks with ``change`` applied (they must have been loaded or saved first)."""
        assert self.current is not None, f"{self.path}: marks updated before they were loaded or saved"
        new = replace(self.current, **change)  # type: ignore[arg-type]
        if new != self.current:
            self.save(new, sync=sync)
        elif sync and self._unsynced and self._fd is not None:
            os.fdatasync(self._fd)
            self._unsynced = False

    def lower_to(self, end: int) -> None:
        """Before the log is cut to ``end``: no mark may acknowledge or claim an entry from ``end`` on (synced)."""
        assert self.current is not None, f"{self.path}: marks lowered before they were loaded or saved"
        self.update(acked=min(self.current.acked, end - 1), claimed=min(self.current.claimed, end - 1))

    def sync(self) -> None:
        """Make the last :meth:`save` without a sync durable (``fdatasync``). It may run on another thread than
        the one that saved, while that one fsyncs the log; nothing else may use this file until it returns."""
        if self._unsynced and self._fd is not None:
            os.fdatasync(self._fd)
            self._unsynced = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"MarksFile({str(self.path)!r})"
