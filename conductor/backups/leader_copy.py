"""A group's backup copied into ``DIR`` by its leader's worker itself, when that worker sees ``DIR``.

``DIR`` is a directory, local or mounted: when the group's leader runs on a
machine that sees it at the same path (one machine, or a shared mount), the
leader copies its checkpoint's files in with the kernel
(``Replication.BackupToFolder``, :mod:`conductor.worker.backup_folder`)
instead of streaming every byte through this process. The CLI proves which
folder it means with a **probe**: a file ``.probe-<32 hex digits>`` it writes
into ``DIR`` holding a random token, named in the request; the worker writes
only into a folder where it reads that token (and the folder's marker names
the module), and below it follows no symlink. A worker that does not see the
folder, may not write there, or predates the RPC answers ``UNIMPLEMENTED``:
the group is streamed as before (:func:`conductor.backups.take._copy_round`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from conductor.backups.layout import BackupError, BackupFolder
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from conductor.wire.options import GRPC_OPTIONS
from pstate.checkpoint import Manifest


@dataclass(frozen=True)
class Probe:
    """The file that tells a worker which folder the operator named (its name and content go in the request)."""

    folder: str  #: DIR, absolute (not resolved: the operator's path, as the worker must see it)
    name: str
    token: bytes


@contextmanager
def probe(folder: BackupFolder) -> Iterator[Probe]:
    """Write this backup's probe into the folder (fsynced: a worker on another machine reads it over the
    mount), and remove it when the backup ends."""
    token = os.urandom(16)
    p = Probe(os.path.abspath(folder.root), f".probe-{os.urandom(16).hex()}", token)
    path = Path(p.folder) / p.name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, token)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        yield p
    finally:
        path.unlink(missing_ok=True)


class LeaderCannotCopy(Exception):
    """The leader's worker does not write into the folder (why: its answer); stream the group instead."""


def leader_round(folder: BackupFolder, p: Probe, address: str, module: str, group: int, epoch: int, bid: str,
                 progress: Callable[[int, int], None]) -> Manifest:
    """One BackupToFolder round: the leader copies the files the folder lacks; returns the checkpoint's manifest.

    LeaderCannotCopy when the worker answers UNIMPLEMENTED; any other gRPC error is the caller's to retry.
    """
    have = folder.stored(group)
    request = pb.BackupToFolderRequest(
        module=module, group=group, backup=bid, epoch=epoch, folder=p.folder, probe=p.name, token=p.token,
        have=[pb.CheckpointFile(name=n, size=s, crc32c=c) for n, s, c in have])
    manifest: Manifest | None = None
    total = 0
    done = False
    with open_channel(address, GRPC_OPTIONS) as channel:
        try:
            for msg in pbg.ReplicationStub(channel).BackupToFolder(request, wait_for_ready=False):
                if msg.HasField("info"):
                    manifest = Manifest.from_json(msg.info.manifest_json)
                    total = msg.info.send_bytes
                    progress(0, total)
                    continue
                progress(msg.copied_bytes, total)
                done = msg.done
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise LeaderCannotCopy(e.details() or "it does not copy into folders") from None
            raise
    if manifest is None or not done:
        raise BackupError(f"the leader of {module}/{group} at {address} ended its copy into {p.folder} early")
    return manifest
