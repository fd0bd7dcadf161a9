"""``conductor restore --from DIR --as NAME``: a backup becomes a new module, in this cluster or another.

1. The folder's layout and the backup's manifest are checked, then every
   byte of every file it needs (:meth:`BackupFolder.verify`): a damaged file
   is refused, named, before the cluster is touched.
2. The module is placed by the usual rules (``Conductor.place_module``) under
   ``NAME`` with the backed-up spec; its code artifact, if it has one, is
   shipped and prepared as a deploy does (:func:`conductor.shipping.deploy_code`).
3. Before the module exists, each group's checkpoint is pushed to every
   replica chosen for it (``RestoreCheckpoint``;
   :mod:`conductor.worker.restore_receiver` installs it and starts the
   replog right after its applied offset).
4. The module is created in ZooKeeper as a deploy creates it: its workers
   open the restored stores, elect leaders and serve. A failure in 2-3
   discards what was pushed; nothing is left in ZooKeeper.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from conductor.backups.layout import BackupError, BackupFolder, BackupManifest, GroupBackup
from conductor.controller import Conductor
from conductor.metastore import GroupState, ModuleSpec
from conductor.shipping import deploy_code
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.far_horizon import CHUNK_BYTES
from topology.artifact import Artifact

#: (group, replica) streams at once
PARALLEL_PUSHES = 4
#: one group's push to one worker
PUSH_TIMEOUT_S = 3600.0

#: bytes done, bytes in all; called from the pushing threads
Progress = Callable[[int, int], None]


def open_verified(root: Path, backup_id: str | None = None, on_bytes: Callable[[int], None] | None = None
                  ) -> tuple[BackupFolder, BackupManifest]:
    """The backup, its layout, manifest and every file checked (BackupDamaged names the first bad file)."""
    folder = BackupFolder(root)
    manifest = folder.open(backup_id)
    folder.verify(manifest, on_bytes)
    return folder, manifest


def restored_spec(manifest: BackupManifest, name: str) -> ModuleSpec:
    """The backed-up spec under its new name (``defined_as``: the name its code declares); it starts in the code
    version its stores were backed up in."""
    spec = ModuleSpec.from_json(json.dumps(manifest.spec))
    declared = spec.defined_as or spec.name
    return dataclasses.replace(spec, name=name, initial_code=None, defined_as=None if declared == name else declared)


def restore_backup(conductor: Conductor, folder: BackupFolder, manifest: BackupManifest, name: str,
                   on_step: Callable[[str], None] | None = None,
                   on_progress: Progress | None = None) -> dict[int, GroupState]:
    """Create module ``name`` from a verified backup (see the module docstring); the placed groups."""
    step = on_step or (lambda _m: None)
    spec = restored_spec(manifest, name)
    if name in conductor.ms.modules.names():  # (the workers refuse it too; this says it before any transfer)
        raise BackupError(f"module {name} exists: a restore only creates a module; pick another name with --as "
                          f"(or `conductor destroy {name}` first)")
    push = Pusher(folder, manifest, name, on_progress or (lambda _d, _t: None))
    if manifest.code is not None:
        artifact = Artifact(folder.path(manifest.code).read_bytes(), manifest.code_kind, manifest.code_origin)
        if artifact.sha256 != spec.code:
            raise BackupError(f"the backup's code artifact hashes to {artifact.sha256}, its spec names {spec.code}")
        return deploy_code(conductor, spec, artifact, step, before_create=push)
    groups = conductor.place_module(spec)  # code on the workers' import path (a module deployed without --code)
    nodes = sorted({n for st in groups.values() for n in st.replicas})
    channels = {n: open_channel(info.address, GRPC_OPTIONS) for n in nodes
                if (info := conductor.ms.nodes.get(n)) is not None}
    try:
        if len(channels) < len(nodes):
            raise BackupError(f"workers {sorted(set(nodes) - set(channels))} left ZooKeeper while placing {name}")
        return conductor.deploy(spec, push(groups, channels))
    finally:
        for ch in channels.values():
            ch.close()


class Pusher:
    """Step 3: every group's checkpoint to each of its replicas, in parallel; on failure, discards what it pushed."""

    def __init__(self, folder: BackupFolder, manifest: BackupManifest, name: str, on_progress: Progress) -> None:
        self.folder = folder
        self.groups = {g.group: g for g in manifest.groups}
        self.name = name
        self.on_progress = on_progress
        self._done = 0

    def __call__(self, placed: dict[int, GroupState], channels: dict[str, grpc.Channel]) -> dict[int, GroupState]:
        """Push, then the groups with each replica's restored storage incarnation recorded (as its replica would
        record it, under no session yet): one whose restored storage is lost before it confirms is refused."""
        assert set(placed) == set(self.groups), "placed groups differ from the backup's"
        incarnations: dict[tuple[int, str], int] = {}
        jobs = [(g, n) for g, st in sorted(placed.items()) for n in st.replicas]
        total = sum(self.groups[g].checkpoint_manifest().total_bytes() for g, _n in jobs)
        self.on_progress(0, total)

        def one(job: tuple[int, str]) -> None:
            g, n = job
            stub = pbg.ReplicationStub(channels[n])
            try:
                reply = stub.RestoreCheckpoint(self._chunks(self.groups[g], total), timeout=PUSH_TIMEOUT_S)
                incarnations[(g, n)] = reply.incarnation
            except grpc.RpcError as e:
                raise BackupError(f"worker {n} did not take group {g} of {self.name}: {e.code().name} "
                                  f"{e.details()}") from None

        try:
            with concurrent.futures.ThreadPoolExecutor(PARALLEL_PUSHES, thread_name_prefix="restore") as pool:
                for fut in [pool.submit(one, j) for j in jobs]:
                    fut.result()
        except BaseException:
            self._discard(jobs, channels)
            raise
        return {g: dataclasses.replace(st, storage=tuple((n, incarnations[(g, n)], 0) for n in st.replicas))
                for g, st in placed.items()}

    def _chunks(self, g: GroupBackup, total: int) -> Iterator[pb.RestoreChunk]:
        yield pb.RestoreChunk(module=self.name, group=g.group, manifest_json=g.checkpoint_manifest().to_json())
        for f in g.files:
            with open(self.folder.path(f), "rb") as fh:
                offset = 0
                while True:
                    data = fh.read(CHUNK_BYTES)
                    if data or offset == 0:  # an empty file still gets one (empty) chunk
                        yield pb.RestoreChunk(module=self.name, group=g.group, file=f.name, file_offset=offset,
                                              data=data)
                    offset += len(data)
                    self._done += len(data)  # (a progress figure: threads race on it, harmlessly)
                    self.on_progress(self._done, total)
                    if not data:
                        break

    def _discard(self, jobs: list[tuple[int, str]], channels: dict[str, grpc.Channel]) -> None:
        for g, n in jobs:
            try:
                pbg.ReplicationStub(channels[n]).RestoreCheckpoint(
                    iter([pb.RestoreChunk(module=self.name, group=g, discard=True)]), timeout=30)
            except grpc.RpcError:
                pass  # the worker deletes its staging at its next start; the group folder stays until then
