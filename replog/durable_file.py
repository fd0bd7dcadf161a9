"""Atomic, durable replacement of a small file: the epoch checkpoint, the storage marks.

A replica trusts these files after a crash (which entries it may keep, what it
acknowledged), so a crash at any moment must leave either the old file or the
new one, never a torn mix of both: the bytes go to a temp file beside the
target, which is fsynced, renamed over the target, and then the directory is
fsynced too, because the rename lives in the directory, not in the file.
Each file's format and checksum stay with its own module.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "replace_durably"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make creations, renames and deletions in ``path`` durable (they live in the directory, not the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (creating its directory if needed); durable when this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
