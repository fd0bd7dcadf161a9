"""Checkpoints for far-horizon catchup: an immutable file set plus a checksummed manifest.

``TaskGroupStore.checkpoint(dir, leader_epoch)`` asks RocksDB for a checkpoint
(hard links to the immutable SST files, after an atomic flush of every column
family — with the WAL off that flush is what puts the memtables into the
checkpoint) and writes ``manifest.json``: every file's name, size and CRC32C,
the applied offset the files hold and the leader epoch.  The follower fetches
the files it lacks (in rounds; names are stable across checkpoints because SST
files are immutable), then :func:`install` verifies every checksum and swaps
the store in atomically, and replays the replog from ``applied_offset + 1``.
A file whose writer already checked its bytes against the manifest as they
arrived (a far-horizon copy does, chunk by chunk) and made it durable need
not be read again: the writer hands :func:`install` its :func:`file_stamp`
(``checked``), and a hard link that still has that stamp is trusted (nor is
it copied, even a MANIFEST: the writer gives its files up). Any other file
is read and checked in full.

Atomic swap: ``dest`` is a symlink to a versioned directory; ``install`` fills
a fresh directory, fsyncs every file and the directory, and replaces the
symlink with ``rename(2)``, which is atomic, so a crash leaves either the old
store or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import crc32c

from pstate.errors import CorruptStore, StorageError

MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ManifestFile:
    name: str
    size: int
    crc32c: int


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds; JSON so operators can read it."""

    applied_offset: int
    leader_epoch: int
    files: tuple[ManifestFile, ...]

    def to_json(self) -> str:
        return json.dumps({
            "format": 1,
            "applied_offset": self.applied_offset,
            "leader_epoch": self.leader_epoch,
            "files": [{"name": f.name, "size": f.size, "crc32c": f.crc32c} for f in self.files],
        }, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Manifest:
        try:
            d = json.loads(text)
            files = tuple(ManifestFile(str(f["name"]), int(f["size"]), int(f["crc32c"])) for f in d["files"])
            return Manifest(int(d["applied_offset"]), int(d["leader_epoch"]), files)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptStore(MANIFEST_NAME, f"unreadable manifest ({exc})") from exc

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


#: which bytes a check covered: (device, inode, size, modification time in ns); a write to the file changes it
FileStamp = tuple[int, int, int, int]
#: files of a checkpoint directory whose writer checked them against the manifest (size and CRC32C) as they were
#: written, then made them durable: each file's :func:`file_stamp` when it was checked, by name
Checked = Mapping[str, FileStamp]


def file_stamp(path: str | os.PathLike[str]) -> FileStamp:
    """The file's :data:`FileStamp` now (a hard link of it has the same one)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def file_crc(path: str, *, fsync: bool = False) -> tuple[int, int]:
    """(size, CRC32C) of a file, streamed; with ``fsync``, also made durable."""
    crc = 0
    size = 0
    with open(path, "rb+" if fsync else "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = crc32c.crc32c(chunk, crc)
            size += len(chunk)
        if fsync:
            os.fsync(fh.fileno())
    return size, crc


class SstChecksums:
    """CRC32C of SST files by (device, inode, size, mtime): each is read once per process, not once per checkpoint.

    SST files are immutable and a checkpoint hard-links the live ones (same inode), so every round of a
    far-horizon copy and every backup would otherwise read the whole store again to describe it. Only ``.sst``
    files are remembered (RocksDB appends to MANIFEST and rewrites OPTIONS and CURRENT). A copy of a file
    whose bytes rotted on disk after it was described still fails its check where it lands (the follower's,
    the backup folder's, a restore's). Bounded (least recently used first out) and thread-safe.
    """

    def __init__(self, capacity: int = 1 << 16) -> None:
        assert capacity > 0, capacity
        self.capacity = capacity
        self._crcs: OrderedDict[FileStamp, int] = OrderedDict()
        self._lock = threading.Lock()

    def describe(self, path: str) -> tuple[int, int]:
        """(size, CRC32C) of the file at ``path``."""
        if not path.endswith(".sst"):
            return file_crc(path)
        key = file_stamp(path)
        with self._lock:
            crc = self._crcs.get(key)
            if crc is not None:
                self._crcs.move_to_end(key)
                return key[2], crc
        size, crc = file_crc(path)
        if size == key[2]:
            with self._lock:
                self._crcs[key] = crc
                while len(self._crcs) > self.capacity:
                    self._crcs.popitem(last=False)
        return size, crc


#: the process's SST checksums (every store's checkpoints)
SST_CHECKSUMS = SstChecksums()


def _link_or_copy(src: str, dest: str, want: ManifestFile, stamp: FileStamp | None) -> tuple[int, int]:
    """Hard-link SST files (immutable: no second copy of a fetched checkpoint) and copy the rest; (size, CRC32C).

    RocksDB appends to its MANIFEST and rewrites CURRENT, so those must not
    share an inode with the source. The checksum is computed from ``dest``,
    so a link still verifies every byte the installed store will read.
    A file with a ``stamp`` (its writer checked those bytes against ``want``
    and made them durable, and gives the file up: see :func:`install`) is
    hard-linked whatever its kind, and trusted while the link still has that
    stamp (the same inode, unchanged since): neither read nor copied again.
    """
    if stamp is not None:
        try:
            os.link(src, dest)
        except FileNotFoundError:
            raise
        except OSError:
            pass  # (another file system, say: copied and checked below)
        else:
            if stamp[2] == want.size and file_stamp(dest) == stamp:
                return want.size, want.crc32c
            os.unlink(dest)  # changed since its check: placed and checked like any other file
    try:
        if not src.endswith(".sst"):
            raise OSError("copy")
        os.link(src, dest)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        shutil.copyfile(src, dest)
    return file_crc(dest, fsync=True)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def take_checkpoint(directory: str, applied_offset: int, leader_epoch: int) -> Manifest:
    """Describe a RocksDB checkpoint directory and write its manifest (called by the store)."""
    files = []
    for name in sorted(os.listdir(directory)):
        if name == MANIFEST_NAME:
            continue
        full = os.path.join(directory, name)
        if not os.path.isfile(full):
            raise StorageError("checkpoint", f"unexpected non-file {full} in checkpoint")
        size, crc = SST_CHECKSUMS.describe(full)
        files.append(ManifestFile(name, size, crc))
    m = Manifest(applied_offset, leader_epoch, tuple(files))
    mpath = os.path.join(directory, MANIFEST_NAME)
    with open(mpath, "w") as fh:
        fh.write(m.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(directory)
    return m


def read_manifest(directory: str) -> Manifest:
    with open(os.path.join(directory, MANIFEST_NAME)) as fh:
        return Manifest.from_json(fh.read())


def store_dir(dest: str | os.PathLike[str]) -> str:
    """The directory to open the store at ``dest`` at, so that no swap at ``dest`` redirects its files.

    RocksDB names every file it writes by the path it was opened at; a store
    opened through ``dest`` must therefore be closed before :func:`swap_in`
    replaces ``dest``. Opened at its own versioned directory instead, it may
    be closed after the swap (off a far-horizon install's task thread). So:
    the directory behind ``dest`` when it is a symlink (an installed store);
    a new empty versioned directory behind a new symlink when nothing is at
    ``dest`` (made durable: a crash leaves at most an empty directory nobody
    points at); ``dest`` itself when it is a plain directory (a store made
    before stores were versioned: its first install closes it first).
    """
    dest = os.path.abspath(os.fspath(dest))
    if os.path.islink(dest):
        return os.path.realpath(dest)
    if os.path.exists(dest):
        return dest
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    target = os.path.join(parent, f".{os.path.basename(dest)}.{uuid.uuid4().hex[:12]}")
    os.mkdir(target)
    os.symlink(os.path.basename(target), dest)
    fsync_dir(parent)
    return target


def remove_stale_versions(dest: str | os.PathLike[str]) -> list[str]:
    """Delete the versioned directories beside ``dest`` that ``dest`` does not point at; return their paths.

    A crash during a far-horizon install leaves one behind: a staged store
    never swapped in, or the retired one its copy thread had not deleted yet.
    Nobody else ever reads them, so they are only disk space. Call it only
    while nothing of this process stages or retires a store for ``dest`` (a
    replica's first open in the process): a live install's staged directory
    looks the same.
    """
    dest = os.path.abspath(os.fspath(dest))
    parent, base = os.path.split(dest)
    if not os.path.isdir(parent):
        return []
    keep = os.path.realpath(dest) if os.path.islink(dest) else None
    prefix = f".{base}."
    removed = []
    for name in sorted(os.listdir(parent)):
        path = os.path.join(parent, name)
        if not name.startswith(prefix):
            continue
        if os.path.islink(path):  # a swap's new link, made but not renamed over ``dest``
            os.unlink(path)
        elif os.path.realpath(path) != keep:
            shutil.rmtree(path, ignore_errors=True)
        else:
            continue
        removed.append(path)
    return removed


def install(src_dir: str | os.PathLike[str], manifest: Manifest, dest: str | os.PathLike[str],
            checked: Checked | None = None) -> str:
    """Verify a checkpoint's files against ``manifest`` and atomically make ``dest`` point at a copy.

    :func:`stage_install` then :func:`swap_in`, and the old directory deleted. The store at ``dest`` must
    be closed. Returns the versioned directory now behind ``dest``.
    """
    target = stage_install(src_dir, manifest, dest, checked)
    try:
        old = swap_in(target, dest)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def stage_install(src_dir: str | os.PathLike[str], manifest: Manifest, dest: str | os.PathLike[str],
                  checked: Checked | None = None) -> str:
    """Verify a checkpoint's files against ``manifest`` into a fresh versioned directory beside ``dest``.

    Any file whose size or CRC32C differs (or that is missing) is refused with
    :class:`CorruptStore` naming it, and nothing is left behind. ``dest`` is
    not touched (its store may stay open and in use): only :func:`swap_in`
    makes the directory returned the one behind ``dest``, so this part (every
    link, check and fsync) may run on any thread, ahead of the swap.
    ``checked``: the files the caller already checked against ``manifest`` as
    it wrote them and made durable, and gives up (it deletes its own names of
    them and never writes them again: a far-horizon copy's staging
    directory); each is hard-linked, and trusted while still as stamped (see
    the module docstring).
    """
    checked = checked or {}
    src = os.fspath(src_dir)
    dest = os.path.abspath(os.fspath(dest))
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    target = os.path.join(parent, f".{os.path.basename(dest)}.{uuid.uuid4().hex[:12]}")
    os.mkdir(target)
    try:
        for f in manifest.files:
            if os.sep in f.name or f.name in ("", ".", ".."):
                raise CorruptStore(f.name, "file name in manifest is not a plain name")
            s_path = os.path.join(src, f.name)
            d_path = os.path.join(target, f.name)
            try:
                size, crc = _link_or_copy(s_path, d_path, f, checked.get(f.name))
            except FileNotFoundError as exc:
                raise CorruptStore(s_path, "file listed in the manifest is missing") from exc
            if size != f.size or crc != f.crc32c:
                raise CorruptStore(s_path, f"size/CRC32C {size}/{crc:#010x} != manifest {f.size}/{f.crc32c:#010x}")
        with open(os.path.join(target, MANIFEST_NAME), "w") as fh:
            fh.write(manifest.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(target)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def swap_in(target: str, dest: str | os.PathLike[str]) -> str | None:
    """Atomically make ``dest`` a symlink to ``target`` (made by :func:`stage_install` beside it); durable on return.

    Returns the directory ``dest`` held before (the caller deletes it once its
    store is closed), or None. A store opened through ``dest`` must be closed
    first: RocksDB names its new files by that path, which now leads to
    ``target``. A crash leaves ``dest`` as it was or as ``target``.
    """
    dest = os.path.abspath(os.fspath(dest))
    parent = os.path.dirname(dest)
    assert os.path.dirname(os.path.abspath(target)) == parent, (target, dest)
    old: str | None = None
    if os.path.islink(dest):
        old = os.path.join(parent, os.readlink(dest))
    elif os.path.exists(dest):
        # first install over a plain directory: move it aside (one non-atomic step, once)
        old = f"{target}.old"
        os.rename(dest, old)
    link_tmp = f"{target}.link"
    os.symlink(os.path.basename(target), link_tmp)
    os.replace(link_tmp, dest)
    fsync_dir(parent)
    if old is not None and os.path.realpath(old) == os.path.realpath(target):
        return None
    return old
