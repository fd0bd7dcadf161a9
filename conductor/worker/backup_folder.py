"""``conductor backup`` into a folder the leader sees: the leader's worker copies its checkpoint's files itself.

Streaming every byte through the CLI's gRPC channel costs about 150 MB/s on
one core (bench.backup_figures); when ``DIR`` is a directory the leader's
worker can see as well (the same machine, or the same mount), the worker
copies the files in with the kernel (``copy_file_range``, else ``sendfile``)
in a thread, as Rama and Fluss have each worker upload its own partitions.
The CLI falls back to the stream when the worker answers ``UNIMPLEMENTED``
(:class:`FolderUnusable`, or a worker without this RPC).

Where a worker may write is the point of this module. The request is an
operator's (``admin`` on the module, conductor.worker.authorization), and the
worker writes only into a folder where:

* the path is absolute and has no ``..`` (the admin's own path; symlinks in
  it are the admin's naming, as ``cp`` would follow them);
* the CLI's probe file for this backup is there with the request's token
  (the CLI wrote it just before: the admin can write there, and this worker
  sees the same folder), and the folder's marker names this module
  (:mod:`conductor.backups.layout`: ``BackupFolder.claim`` made it);
* below that folder nothing is followed: ``files/<group>``, the probe and the
  marker are opened relative to the folder's descriptor with ``O_NOFOLLOW``,
  and every file is created and renamed inside ``files/<group>`` by its plain
  name (``.<name>.part``, then ``<crc32c>-<name>``), so a symlink planted in
  the folder cannot send a write elsewhere.

Each copied file is read back through ``mmap`` (from the page cache) and
checked against the checkpoint's CRC32C, fsynced and renamed on a second
thread while the next file copies (crc32c releases the GIL on large
buffers, so the two threads, and groups copied at once, use both cores):
the same guarantees as a streamed file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import hmac
import json
import mmap
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import crc32c

from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest
from conductor.worker.far_horizon import Shelved
from pstate.checkpoint import ManifestFile

#: the probe file's name: the CLI's, for one backup
PROBE_RE = re.compile(r"^\.probe-[0-9a-f]{32}$")
#: bytes per copy_file_range / sendfile call (progress and cancellation are checked between calls)
COPY_CHUNK = 16 * 1024 * 1024
#: copies checked, fsynced and renamed at once: fsyncs in flight together share the file system's journal commits
FSYNC_THREADS = 4
MARKER = "millrace-backups.json"  # conductor.backups.layout.MARKER (the worker does not import the CLI's package)
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
#: seconds between two progress messages of a round
PROGRESS_S = 0.2


class FolderUnusable(ValueError):
    """This worker cannot (or may not) write the backup into the folder; the CLI streams the files instead."""

    grpc_code = "UNIMPLEMENTED"

    def __init__(self, folder: str, reason: str) -> None:
        self.folder = folder
        self.reason = reason
        super().__init__(f"this worker does not write into {folder}: {reason}")


class CopyDamaged(ValueError):
    """A copy that does not read back as the checkpoint's CRC32C: the CLI tries the group again (as a file
    damaged in a stream)."""

    grpc_code = "UNAVAILABLE"


class Cancelled(Exception):
    """The CLI went away (the RPC was cancelled): the copy stops; ``.part`` files are left for the next backup."""


def check_folder(request: pb.BackupToFolderRequest) -> None:
    """Blocking: FolderUnusable (or InvalidRequest) unless this worker may write the group's files into the
    request's folder; checked before a checkpoint is made, and again by the copy."""
    os.close(open_group_dir(request.folder, request.module, request.group, request.probe, request.token))


async def folder_round(request: pb.BackupToFolderRequest,
                       shelved: Shelved) -> AsyncIterator[pb.BackupToFolderProgress]:
    """The messages of one round: the checkpoint's description, progress while a thread copies the files the
    folder lacks (:func:`copy_into`), then ``done``. Closing the stream (the CLI went away) stops the copy."""
    held = {(f.name, f.size, f.crc32c) for f in request.have}
    send = [f for f in shelved.manifest.files if (f.name, f.size, f.crc32c) not in held]
    yield pb.BackupToFolderProgress(info=pb.CheckpointInfo(
        manifest_json=shelved.manifest.to_json(), leader_log_end=shelved.leader_log_end,
        send_bytes=sum(f.size for f in send)))
    copied = [0]
    stop = threading.Event()

    def add(n: int) -> None:
        copied[0] += n  # one writer (the copying thread); the loop only reads it

    def run() -> None:
        gdir = open_group_dir(request.folder, request.module, request.group, request.probe, request.token)
        try:  # the descriptor lives and dies in this thread: no other thread can see its number reused
            copy_into(gdir, shelved.directory, send, add, stop)
        finally:
            os.close(gdir)

    job = asyncio.ensure_future(asyncio.to_thread(run))
    job.add_done_callback(lambda f: f.cancelled() or f.exception())  # a stream closed early leaves it unread
    try:
        while not (await asyncio.wait({job}, timeout=PROGRESS_S))[0]:
            yield pb.BackupToFolderProgress(copied_bytes=copied[0])
        job.result()
        yield pb.BackupToFolderProgress(copied_bytes=copied[0], done=True)
    finally:
        stop.set()  # a cancelled stream: the thread stops at its next chunk


def open_group_dir(folder: str, module: str, group: int, probe: str, token: bytes) -> int:
    """The descriptor of ``folder/files/<group>`` once the folder passes every check (module docstring)."""
    if not os.path.isabs(folder) or ".." in Path(folder).parts:
        raise InvalidRequest("folder", f"{folder!r} is not an absolute path without '..'")
    if not PROBE_RE.match(probe) or len(token) < 16:
        raise InvalidRequest("probe", "a backup into a folder needs the CLI's probe file name and its token")
    try:
        root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise FolderUnusable(folder, f"cannot open it here ({e.strerror})") from None
    try:
        if not hmac.compare_digest(_read_small(root, probe, folder), token):
            raise FolderUnusable(folder, f"its probe {probe} holds another token (not the folder the CLI wrote)")
        try:
            owner = json.loads(_read_small(root, MARKER, folder))["module"]
        except (ValueError, KeyError, TypeError):
            owner = None
        if owner != module:
            raise FolderUnusable(folder, f"its {MARKER} does not name module {module}")
        files = _open_dir(root, "files", folder)
        try:
            return _open_dir(files, str(group), folder)
        finally:
            os.close(files)
    finally:
        os.close(root)


def _read_small(dir_fd: int, name: str, folder: str) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        why = "a symlink" if e.errno == errno.ELOOP else e.strerror
        raise FolderUnusable(folder, f"cannot read {name} there ({why})") from None
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _open_dir(dir_fd: int, name: str, folder: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        why = "a symlink or not a directory" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
        raise FolderUnusable(folder, f"cannot open {name}/ there ({why})") from None


def pool_name(f: ManifestFile) -> str:
    """The name a checkpoint file is stored under (conductor.backups.layout.BackupFolder.pool_name)."""
    return f"{f.crc32c:08x}-{f.name}"


def copy_into(gdir: int, source: Path, files: Sequence[ManifestFile], on_bytes: Callable[[int], None],
              stop: threading.Event) -> None:
    """Copy ``files`` from the checkpoint in ``source`` into the group folder ``gdir`` (module docstring).

    Blocking: run it in a thread. A file whose copy does not match its CRC32C raises :class:`CopyDamaged` (the
    CLI tries the group again); ``stop`` set raises :class:`Cancelled` between chunks.
    """
    flusher = concurrent.futures.ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="backup-fsync")
    pending: list[concurrent.futures.Future[None]] = []
    try:
        for f in files:
            if os.sep in f.name or f.name in ("", ".", ".."):
                raise InvalidRequest("checkpoint", f"file name {f.name!r}")
            part = f".{f.name}.part"
            try:
                os.unlink(part, dir_fd=gdir)  # an interrupted backup's
            except FileNotFoundError:
                pass
            out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=gdir)
            try:
                _copy(source / f.name, out, f.size, on_bytes, stop)
            except BaseException:
                os.close(out)
                os.unlink(part, dir_fd=gdir)
                raise
            # checked, fsynced and renamed on the second thread while this one copies the next file
            pending.append(flusher.submit(_store, gdir, out, part, f))
        for fut in pending:
            fut.result()
        os.fsync(gdir)
    finally:
        for fut in pending:
            fut.cancel()
        flusher.shutdown(wait=True)


def _copy(src: Path, out: int, size: int, on_bytes: Callable[[int], None], stop: threading.Event) -> None:
    """``size`` bytes of ``src`` into ``out`` in the kernel: copy_file_range, else (another file system on an
    older kernel) sendfile."""
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        done = 0
        kernel_copy = True
        while done < size:
            if stop.is_set():
                raise Cancelled
            n = min(COPY_CHUNK, size - done)
            if kernel_copy:
                try:
                    n = os.copy_file_range(fd, out, n, done, done)
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    kernel_copy = False
                    continue
            else:
                os.lseek(out, done, os.SEEK_SET)
                n = os.sendfile(out, fd, done, n)
            if n == 0:
                raise FileNotFoundError(f"{src} ended at {done} of {size} bytes")
            done += n
            on_bytes(n)
    finally:
        os.close(fd)


def _crc(fd: int, size: int) -> int:
    """CRC32C of what was written (page cache: no disk read), mapped rather than read into Python bytes."""
    if size == 0:
        return 0
    with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ) as m:
        return int(crc32c.crc32c(m))


def _store(gdir: int, fd: int, part: str, f: ManifestFile) -> None:
    """A copied file read back against the checkpoint's CRC32C, fsynced, renamed to its pool name (or removed)."""
    try:
        crc = _crc(fd, f.size)
        if crc != f.crc32c:
            os.unlink(part, dir_fd=gdir)
            raise CopyDamaged(f"{f.name} copied into the backup folder reads back with CRC32C {crc:#010x}, "
                              f"the checkpoint's is {f.crc32c:#010x}")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(part, pool_name(f), src_dir_fd=gdir, dst_dir_fd=gdir)
