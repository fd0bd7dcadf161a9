"""``conductor backup MODULE --to DIR``: a checkpoint of every task group's leader, copied while writers run.

Each group's copy is a far-horizon round taken by an operator instead of a
follower: ``BackupCheckpoint`` on the group's leader makes a RocksDB
checkpoint (hard links and a flush, no copy) of the applied state with its
offset and leader epoch, and streams only the files the folder does not hold
yet (the request's ``have``: the same exchange as a follower's rounds, served
by the same code, :mod:`conductor.worker.far_horizon`). So a second backup
copies what was flushed or compacted since the first. Every file is checked
against the leader's CRC32C as it arrives and stored by rename; the backup's
manifest is written last (:mod:`conductor.backups.layout`).

When the leader's worker sees ``DIR`` itself (the same machine or mount),
it copies the files in with the kernel instead (``BackupToFolder``,
:mod:`conductor.backups.leader_copy`): the same checkpoint, the same checks
and names, without every byte crossing this process; a worker that cannot
answers so and the group is streamed.

Groups are copied in parallel (each at its own applied offset: a backup is
consistent group by group, as a group is the unit of replication). A leader
that changes mid-copy refuses the round (NotLeader); the group is copied
again from the new one. The spec and the code version are read before and
after: an update that ran in between fails the backup (its groups could be
in two versions).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from conductor import __version__
from conductor.backups.layout import (
    BackupError,
    BackupFolder,
    BackupManifest,
    GroupBackup,
    StoredFile,
    new_backup_id,
)
from conductor.backups.leader_copy import LeaderCannotCopy, Probe, leader_round, probe
from conductor.client.code import CodeCache, code_sources
from conductor.metastore import Metastore, ModuleSpec
from conductor.wire import millrace_pb2 as pb
from conductor.wire.channels import open_channel
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.far_horizon import BACKUP_METHOD, IncomingFile, decode_chunk
from pstate.checkpoint import Manifest, ManifestFile, file_crc, fsync_dir

log = logging.getLogger("millrace.backup")

#: groups copied at once (each a stream from its leader)
PARALLEL_GROUPS = 4
#: tries per group: a leader change or a worker restart mid-copy starts the group's copy again
ATTEMPTS = 5
#: statuses worth another try (a new leader, a restarting worker); others (denied, bad request) fail at once
RETRIED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED,
           grpc.StatusCode.CANCELLED}

#: (group, bytes copied so far, bytes to copy in this round); called from the copying threads
Progress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class BackupResult:
    manifest: BackupManifest
    path: Path
    copied_bytes: int  #: bytes this run transferred (the rest was in the folder already)
    seconds: float
    leader_copied: tuple[int, ...] = ()  #: groups whose leader copied the files into the folder itself


def take_backup(ms: Metastore, module: str, root: Path, on_progress: Progress | None = None,
                on_step: Callable[[str], None] | None = None, leader_copies: bool = True) -> BackupResult:
    """Back ``module`` up into the folder ``root`` (see the module docstring); ``leader_copies=False`` streams
    every group through this process even where its leader could copy into the folder itself."""
    step = on_step or (lambda _m: None)
    started = time.monotonic()
    spec, _ = ms.modules.get(module)
    folder = BackupFolder(root)
    folder.claim(module)
    bid = new_backup_id()
    step(f"copying the checkpoints of {spec.threads} task group(s) from their leaders")
    copied = [0] * spec.threads
    by_leader: list[int] = []

    # one thread more than the groups copied at once: the code artifact is stored beside them
    with probe(folder) as p, concurrent.futures.ThreadPoolExecutor(min(PARALLEL_GROUPS, spec.threads) + 1,
                                                                     thread_name_prefix="backup") as pool:
        def one(g: int) -> GroupBackup:
            def progress(done: int, total: int) -> None:
                copied[g] = done
                if on_progress is not None:
                    on_progress(g, done, total)
            return _backup_group(ms, folder, module, g, bid, progress, p if leader_copies else None, step, by_leader)

        code_stored = pool.submit(_store_code, ms, spec, folder, step)  # beside the groups: it needs none of them
        groups = tuple(pool.map(one, range(spec.threads)))
        code, kind, origin = code_stored.result()
    after, _ = ms.modules.get(module)
    if after.code != spec.code:
        raise BackupError(f"{module} switched code version during the backup ({spec.code} -> {after.code}); "
                          "its groups may hold different versions: run the backup again")
    manifest = BackupManifest(bid, module, time.time(), __version__, _spec_dict(spec), code, kind, origin, groups)
    path = folder.commit(manifest)
    return BackupResult(manifest, path, sum(copied), time.monotonic() - started, tuple(sorted(by_leader)))


def _spec_dict(spec: ModuleSpec) -> dict[str, object]:
    doc: dict[str, object] = json.loads(spec.to_json())
    return doc


def _store_code(ms: Metastore, spec: ModuleSpec, folder: BackupFolder,
                step: Callable[[str], None]) -> tuple[StoredFile | None, str, str]:
    """The module's code artifact in ``code/<sha256>/`` (stored once; fetched from a worker that holds it)."""
    if spec.code is None:
        return None, "", ""
    cache = CodeCache(folder.root / "code")
    if not cache.has(spec.code):
        step(f"storing code version {spec.code[:12]}")
        cache.fetch(spec.code, code_sources(ms, spec.name, spec.code))
    version = ms.versions.get(spec.name, spec.code)
    path = cache.artifact_path(spec.code)
    size, crc = file_crc(str(path))
    stored = StoredFile("artifact.zip", str(path.relative_to(folder.root)), size, crc)
    return stored, version.kind if version else "package", version.origin if version else ""


def _backup_group(ms: Metastore, folder: BackupFolder, module: str, group: int, bid: str,
                  progress: Callable[[int, int], None], p: Probe | None,
                  step: Callable[[str], None], by_leader: list[int]) -> GroupBackup:
    """One group's checkpoint from its current leader, retried when the leader changes: copied into the folder
    by the leader itself when it can (``p``: the backup's probe), else streamed here."""
    why = "no attempt"
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(min(0.5 * 2 ** attempt, 5.0))
        st, _ = ms.groups.get(module, group)
        info = ms.nodes.get(st.leader) if st.leader is not None else None
        if info is None:
            why = f"group {group} has no live leader"
            continue
        try:
            if p is not None:
                try:
                    manifest = leader_round(folder, p, info.address, module, group, st.epoch, bid, progress)
                    by_leader.append(group)
                    return _group_backup(folder, manifest, module, group, st.leader or "")
                except LeaderCannotCopy as e:
                    step(f"group {group}: its leader {st.leader} does not copy into the folder ({e}); streaming it")
                    p = None
            return _copy_round(folder, info.address, module, group, st.leader or "", st.epoch, bid, progress)
        except grpc.RpcError as e:
            why = f"leader {st.leader}: {e.code().name} {e.details()}"
            if e.code() not in RETRIED:
                break
            log.info("backup of %s/%d: %s; trying again", module, group, why)
    raise BackupError(f"could not copy task group {group} of {module}: {why}")


def _copy_round(folder: BackupFolder, address: str, module: str, group: int, leader: str, epoch: int, bid: str,
                progress: Callable[[int, int], None]) -> GroupBackup:
    """One BackupCheckpoint round: receive the files the folder lacks, check each, store it under its pool name."""
    have = folder.stored(group)
    gdir = folder.group_dir(group)
    request = pb.FetchCheckpointRequest(
        module=module, group=group, follower=f"backup-{bid}-{group}", epoch=epoch,
        have=[pb.CheckpointFile(name=n, size=s, crc32c=c) for n, s, c in have])
    manifest: Manifest | None = None
    by_name: dict[str, ManifestFile] = {}
    current: IncomingFile | None = None
    done = total = 0
    # each received file is fsynced, checked and renamed here while the next one streams (as a follower's are)
    flusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"backup-fsync-{group}")
    stored_files: list[concurrent.futures.Future[None]] = []
    with open_channel(address, GRPC_OPTIONS) as channel, flusher:
        fetch = channel.unary_stream(BACKUP_METHOD, request_serializer=pb.FetchCheckpointRequest.SerializeToString,
                                     response_deserializer=None)
        try:
            for raw in fetch(request, wait_for_ready=False):
                chunk = decode_chunk(raw)
                if isinstance(chunk, pb.CheckpointChunk):
                    manifest = Manifest.from_json(chunk.info.manifest_json)
                    by_name = {f.name: f for f in manifest.files}
                    total = chunk.info.send_bytes
                    progress(0, total)
                    continue
                name, offset, data = chunk
                if current is None or current.meta.name != name:
                    if current is not None:
                        stored_files.append(flusher.submit(_store, folder, gdir, current))
                    meta = by_name.get(name)
                    if meta is None or "/" in name or name in ("", ".", ".."):
                        raise BackupError(f"leader {leader} sent {name!r}, which its manifest does not list")
                    current = IncomingFile(meta, gdir / f".{meta.name}.part")
                if offset != current.size:
                    raise BackupError(f"{name}: leader {leader} sent a chunk at {offset}, expected {current.size}")
                current.write(data)
                done += len(data)
                progress(done, total)
            if current is not None:
                stored_files.append(flusher.submit(_store, folder, gdir, current))
            for fut in stored_files:
                fut.result()  # a file damaged in transit raises here: the round is tried again
        finally:
            for fut in stored_files:
                fut.cancel()
            concurrent.futures.wait(stored_files)
            if current is not None:
                current.close()
            try:
                for _ in fetch(pb.FetchCheckpointRequest(module=module, group=group, follower=request.follower,
                                                         epoch=epoch, release=True), timeout=10):
                    pass
            except grpc.RpcError:
                pass  # the leader drops it after its idle timeout
    if manifest is None:
        raise BackupError(f"leader {leader} of {module}/{group} sent no checkpoint description")
    fsync_dir(gdir)
    return _group_backup(folder, manifest, module, group, leader)


def _group_backup(folder: BackupFolder, manifest: Manifest, module: str, group: int, leader: str) -> GroupBackup:
    """The group's entry in the backup's manifest: every file of its checkpoint, each found in the folder."""
    stored = folder.stored(group)
    files = []
    for f in manifest.files:
        s = stored.get((f.name, f.size, f.crc32c))
        if s is None:
            raise BackupError(f"{module}/{group}: {f.name} is neither in {folder.group_dir(group)} nor was it sent")
        files.append(s)
    return GroupBackup(group, manifest.applied_offset, manifest.leader_epoch, leader, tuple(files))


def _store(folder: BackupFolder, gdir: Path, f: IncomingFile) -> None:
    """A received file, checked against the leader's manifest, renamed to its pool name (fsynced first)."""
    f.sync_and_close()
    if (f.size, f.crc) != (f.meta.size, f.meta.crc32c):
        f.path.unlink(missing_ok=True)
        raise grpc_retry(f"{f.meta.name} arrived damaged (size/CRC32C {f.size}/{f.crc:#010x}, "
                         f"manifest {f.meta.size}/{f.meta.crc32c:#010x})")
    f.path.rename(gdir / folder.pool_name(f.meta.name, f.meta.crc32c))


class _Damaged(grpc.RpcError):  # type: ignore[misc]  # (grpc ships no types)
    """A file damaged in transit: the group's round is retried like a lost connection."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self.why


def grpc_retry(why: str) -> grpc.RpcError:
    return _Damaged(why)
