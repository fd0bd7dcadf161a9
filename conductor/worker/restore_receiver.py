"""The worker's side of ``conductor restore``: one group's backed-up checkpoint, received before its module exists.

``conductor restore`` places the module as a deploy does, then pushes each
group's checkpoint to every replica chosen for it (``RestoreCheckpoint``, a
client stream: the manifest first, then the files in chunks), and only then
creates the module in ZooKeeper. So when this worker opens the replica it
finds an ordinary store, applied up to the backup's offset, a replog that
starts right after it, an epoch history that puts those offsets in epoch 0,
before any leader of the new module, and storage marks whose incarnation the
group's first znode records (docs/backups.md).

Files land in ``<data>/_restore/`` (module names start with a letter: no clash)
and are checked against the manifest's size and CRC32C as they arrive;
:func:`pstate.checkpoint.install` verifies them again and swaps them in as
``<data>/<module>/<group>/state``, exactly as a far-horizon install does. A
module this worker hosts, or one deployed in ZooKeeper, is never written: a
restore only creates. ``discard`` removes what a failed restore left.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from conductor.wire import millrace_pb2 as pb
from conductor.wire.errors import InvalidRequest
from conductor.worker.far_horizon import IncomingFile
from pstate.checkpoint import Manifest, ManifestFile, install
from replog.eligibility import StorageMarks
from replog.epoch_file import EpochFile
from replog.log import Log
from replog.marks_file import MarksFile

log = logging.getLogger("millrace.node")

#: under the worker's data folder; a restore's staging, deleted when it ends (and at start: see ``sweep``)
RESTORE_DIR = "_restore"
#: the epoch a restored group's history attributes its checkpoint's offsets to (the source's epochs mean nothing in
#: the new module's znodes, whose first leader takes epoch 1)
RESTORED_EPOCH = 0


class RestoreReceiver:
    """Receives restored checkpoints into ``data_dir`` (``exists(module)``: hosted here or deployed; blocking)."""

    def __init__(self, data_dir: Path, exists: Callable[[str], bool]) -> None:
        self.data_dir = data_dir
        self.exists = exists
        self.staging_root = data_dir / RESTORE_DIR
        shutil.rmtree(self.staging_root, ignore_errors=True)  # an interrupted restore's leftovers

    async def receive(self, requests: AsyncIterator[pb.RestoreChunk]) -> pb.RestoreReply:
        first: pb.RestoreChunk | None = None
        staging: Path | None = None
        try:
            async for chunk in requests:
                if first is None:
                    first = chunk
                    module, group = chunk.module, chunk.group
                    if not module or module[0] in "._" or "/" in module:
                        raise InvalidRequest("RestoreCheckpoint", f"not a module name: {module!r}")
                    if await asyncio.to_thread(self.exists, module):
                        raise InvalidRequest("RestoreCheckpoint", f"module {module} exists (hosted here or deployed)"
                                             ": a restore only creates a module; pick another name with --as")
                    if chunk.discard:
                        await asyncio.to_thread(shutil.rmtree, self._group_dir(module, group), True)
                        return pb.RestoreReply()
                    manifest = Manifest.from_json(chunk.manifest_json)
                    staging = self.staging_root / f"{module}-{group}-{uuid.uuid4().hex[:12]}"
                    staging.mkdir(parents=True)
                    reply = await self._files(chunk, requests, manifest, staging)
                    return reply
            raise InvalidRequest("RestoreCheckpoint", "the stream carried no message")
        finally:
            if staging is not None:
                await asyncio.to_thread(shutil.rmtree, staging, True)

    def _group_dir(self, module: str, group: int) -> Path:
        return self.data_dir / module / str(group)

    async def _files(self, first: pb.RestoreChunk, requests: AsyncIterator[pb.RestoreChunk], manifest: Manifest,
                     staging: Path) -> pb.RestoreReply:
        """Receive every file of ``manifest`` (each checked as it ends), then install them as the group's store."""
        by_name = {f.name: f for f in manifest.files}
        done: set[str] = set()
        current: IncomingFile | None = None
        received = 0

        def finish(f: IncomingFile) -> None:
            f.sync_and_close()
            if (f.size, f.crc) != (f.meta.size, f.meta.crc32c):
                raise InvalidRequest("RestoreCheckpoint", f"{f.meta.name} arrived damaged (size/CRC32C "
                                     f"{f.size}/{f.crc:#010x}, manifest {f.meta.size}/{f.meta.crc32c:#010x})")
            done.add(f.meta.name)

        async for chunk in requests:
            if chunk.module != first.module or chunk.group != first.group:
                raise InvalidRequest("RestoreCheckpoint", "one stream restores one group")
            if current is None or current.meta.name != chunk.file:
                if current is not None:
                    await asyncio.to_thread(finish, current)
                meta: ManifestFile | None = by_name.get(chunk.file)
                if meta is None or chunk.file in done:
                    raise InvalidRequest("RestoreCheckpoint", f"{chunk.file!r} is not in the manifest, or came twice")
                current = await asyncio.to_thread(IncomingFile, meta, staging / meta.name)
            if chunk.file_offset != current.size:
                raise InvalidRequest("RestoreCheckpoint", f"{chunk.file}: chunk at {chunk.file_offset}, "
                                     f"expected {current.size}")
            await asyncio.to_thread(current.write, chunk.data)
            received += len(chunk.data)
        if current is not None:
            await asyncio.to_thread(finish, current)
        missing = sorted(set(by_name) - done)
        if missing:
            raise InvalidRequest("RestoreCheckpoint", f"the stream ended without {', '.join(missing)}")
        incarnation = await asyncio.to_thread(self._install, first.module, first.group, staging, manifest)
        return pb.RestoreReply(applied_offset=manifest.applied_offset, bytes=received, incarnation=incarnation)

    def _install(self, module: str, group: int, staging: Path, manifest: Manifest) -> int:
        """The store from the checkpoint, an empty replog that starts after its applied offset, the epoch history
        and the storage marks; the storage's incarnation (``conductor restore`` records it in the group's znode)."""
        gdir = self._group_dir(module, group)
        shutil.rmtree(gdir, ignore_errors=True)  # a failed restore's leftover: the module exists nowhere
        install(staging, manifest, gdir / "state")
        with Log.open(gdir / "replog", fsync="none") as replog:
            replog.reset(manifest.applied_offset + 1)
        # The restored offsets belong to epoch 0, below the first leader's (GroupState.initial: epoch 1): a
        # follower's epoch-end request then finds every replica's history equal, nothing to truncate.
        EpochFile(gdir / "epochs").save([(RESTORED_EPOCH, 0)])
        # Marks with an incarnation the group's first znode records: a replica whose restored storage is lost
        # before it confirms its own (a new, empty directory: a new incarnation) is refused like any that lost
        # what it held, never elected empty (tests/sim/test_restore.py found that window without them).
        upto = manifest.applied_offset
        incarnation = random.SystemRandom().randrange(1, 1 << 63)
        MarksFile(gdir / "marks").save(StorageMarks(incarnation, acked=upto, applied=upto, clean=True))
        log.warning("restored %s/%d from a backup: store applied up to offset %d (%d file(s), %.1f MB); its replog "
                    "starts at %d", module, group, manifest.applied_offset, len(manifest.files),
                    manifest.total_bytes() / 1e6, manifest.applied_offset + 1)
        return incarnation
