"""Far-horizon catchup: a follower too far behind copies the leader's checkpoint files instead of replaying.

The leader's state machine decides *that* a follower needs it (``StartFarHorizon``,
see :mod:`replog.replica`); this module moves the bytes. The follower pulls: it
calls ``FetchCheckpoint`` on the leader once per **round**. Each call makes a
fresh RocksDB checkpoint (hard links to immutable SST files, so it costs a
memtable flush, not a copy; or shares one just made for another follower of
the group: :meth:`CheckpointShelf.take`) and streams, in large chunks, only the files the
follower does not already hold: SST names are stable across checkpoints, so a
second round copies just what was flushed or compacted during the first. Rounds
go on until :func:`replog.catchup.round_is_last` says so (the checkpoint is
within half the near-horizon window of the leader's log end; Rama restarts
from scratch instead); then the follower
installs the last checkpoint and replays entries from it like any follower.

Every file is checked against the manifest's size and CRC32C as it arrives
(and fsynced); a file damaged in transit is dropped and fetched again in the
next round, and the install is told which files passed (their
:func:`~pstate.checkpoint.file_stamp`), so it does not read them again (a
test damages chunks on purpose through :attr:`WorkerHooks.chunk_sent
<conductor.worker.hooks.WorkerHooks.chunk_sent>`). The leader keeps each
follower's checkpoint on a :class:`CheckpointShelf` until that follower's next
round, its release call, or an idle timeout, so abandoned transfers do not pin
old SST files forever.

Install itself is checked and ordered by the follower's task thread (it owns the store and the
log), its writes on an install thread while the replica is parked: :mod:`conductor.worker.checkpoint_install`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import grpc

from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from conductor.wire.checked import checked_handler
from conductor.wire.packing import varint
from conductor.worker.hooks import ChunkFilter
from conductor.worker.throttle import CopyPacing, CopyThrottle
from conductor.worker.unbuffered_file import UnbufferedFile
from pstate.checkpoint import Checked, FileStamp, Manifest, ManifestFile, file_stamp
from replog.catchup import MAX_ROUNDS, behind_at_install, round_is_last

log = logging.getLogger("millrace.far_horizon")

#: bytes per streamed message: large, since gRPC Python pays ~160 us per message, yet far below the 64 MiB limit
CHUNK_BYTES = 2 * 1024 * 1024
#: the smallest chunk a throttled follower may ask for (per-message costs stay a few percent of a copy)
MIN_CHUNK_BYTES = 128 * 1024
#: a throttled copy asks for chunks of this many seconds at its rate: the leader's work on one chunk (read,
#: encode, send) is a short burst between writers' appends, not 2 MiB at once every few hundred milliseconds
CHUNK_PACE_S = 1 / 64
#: a checkpoint kept for a follower that has not come back for this long is released
IDLE_TTL_S = 300.0
#: a checkpoint made for one follower's round serves another follower of the same group whose round starts
#: within this many seconds (a reassignment to RF 3 starts both copies together, and their rounds stay in step):
#: one memtable flush, one GIL-holding RocksDB checkpoint and one checksum pass instead of one per follower
SHARE_WITHIN_S = 1.0
#: how long the follower's install may wait for its task thread
INSTALL_TIMEOUT_S = 120.0

Pairs = list[tuple[int, int]]
ShelfKey = tuple[str, int, str]  # (module, group, follower)


@dataclass
class Shelved:
    """One checkpoint kept for one follower's transfer."""

    directory: Path
    manifest: Manifest
    epoch_pairs: Pairs
    leader_log_end: int
    last_used: float = field(default_factory=time.monotonic)
    #: when the checkpoint itself was made (a shared one keeps its maker's: see :meth:`CheckpointShelf.take`)
    made: float = field(default_factory=time.monotonic)


class CheckpointShelf:
    """The checkpoints a leader node keeps for transfers in progress, at most one per (group, follower).

    A new round replaces the follower's previous checkpoint (its files are
    hard links, so what both share costs nothing and the rest is freed).
    Checkpoints are made one at a time on a worker, and one made for a
    follower serves the other followers of its group whose rounds start
    within :data:`SHARE_WITHIN_S`, even one whose follower released it
    meanwhile (:meth:`take`): each costs the leader a
    memtable flush, a RocksDB checkpoint that holds the GIL (every thread of
    the worker waits, the event loop serving writers included; 75 ms when two
    groups' first checkpoints of a reassignment ran at once) and a checksum
    pass, and four at once were the longest stall of a scale to RF 3.
    """

    def __init__(self, root: Path, idle_ttl_s: float = IDLE_TTL_S, share_within_s: float = SHARE_WITHIN_S) -> None:
        self.root = root
        self.idle_ttl_s = idle_ttl_s
        self.share_within_s = share_within_s
        shutil.rmtree(root, ignore_errors=True)  # leftovers of an earlier run belong to no transfer
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        #: held while a checkpoint is made or shared: one at a time per worker
        self._making = threading.Lock()
        self._kept: dict[ShelfKey, Shelved] = {}
        self._seq = 0
        #: checkpoints that were served by linking another follower's (shared) rather than made
        self.shared = 0

    def take(self, key: ShelfKey, make: Callable[[Path], Shelved], log_end: Callable[[], int] | None = None,
             epoch: int | None = None) -> Shelved:
        """Replace ``key``'s checkpoint with a fresh one made by ``make(directory)`` (blocking: call off the loop).

        With ``log_end`` (the leader's log end now) and ``epoch``, a checkpoint of the same group made in that
        leader epoch within :data:`SHARE_WITHIN_S` for another follower is hard-linked into ``key``'s directory
        instead, with the log end now: it is the group's applied state at its offset as much as a new one would
        be, only a little older. Never one at or below the offset of ``key``'s previous checkpoint, so every
        round of a follower gets a newer checkpoint than its last.
        """
        with self._making:
            self._drop_old_slots()
            with self._lock:
                previous = self._kept.get(key)
                self._seq += 1
                directory = self.root / f"{key[0]}-{key[1]}-{key[2]}-{self._seq}"
            self._drop(key)  # (not release: the group's slot is what this round may share)
            floor = -1 if previous is None else previous.manifest.applied_offset
            shelved = None
            if log_end is not None:
                shelved = self._share(key, directory, floor, epoch, log_end)
            if shelved is None:
                shelved = make(directory)
                if log_end is not None:
                    self._keep_for_sharing(key, shelved)
            with self._lock:
                self._kept[key] = shelved
        return shelved

    def _keep_for_sharing(self, key: ShelfKey, shelved: Shelved) -> None:
        """(holding ``_making``) Link a checkpoint just made into the group's own slot (the follower ``""``), so
        it still serves another follower's round after its own follower released it: the first follower to
        finish a copy releases its checkpoint before the other's last round asks (one more flush and
        checkpoint, at the busiest moment of a scale). Dropped once older than :data:`SHARE_WITHIN_S` (at the
        next :meth:`take` or :meth:`sweep`) or with the group's last follower's (:meth:`release`)."""
        slot: ShelfKey = (key[0], key[1], "")
        self._drop(slot)
        with self._lock:
            self._seq += 1
            directory = self.root / f"{key[0]}-{key[1]}--{self._seq}"
        linked = _linked(shelved, directory, shelved.leader_log_end)
        if linked is not None:
            with self._lock:
                self._kept[slot] = linked

    def _drop_old_slots(self) -> None:
        now = time.monotonic()
        with self._lock:
            old = [k for k, s in self._kept.items() if not k[2] and now - s.made > self.share_within_s]
        for k in old:
            self._drop(k)

    def _share(self, key: ShelfKey, directory: Path, floor: int, epoch: int | None,
               log_end: Callable[[], int]) -> Shelved | None:
        """(holding ``_making``) Another follower's fresh checkpoint of ``key``'s group, linked into ``directory``;
        None when there is none (or it went meanwhile: its follower released it)."""
        now = time.monotonic()
        with self._lock:
            fresh = [s for k, s in self._kept.items() if k[:2] == key[:2] and k != key
                     and now - s.made <= self.share_within_s and s.manifest.applied_offset > floor
                     and (epoch is None or s.manifest.leader_epoch == epoch)]
        if not fresh:
            return None
        linked = _linked(max(fresh, key=lambda s: s.manifest.applied_offset), directory, log_end())
        if linked is not None:
            self.shared += 1
        return linked

    def release(self, key: ShelfKey) -> bool:
        """Drop ``key``'s checkpoint (its follower is done, or it sat idle); its group's slot goes with the last
        follower's, so no checkpoint outlives the transfers of its group."""
        dropped = self._drop(key)
        with self._lock:
            last = key[2] and not any(k[:2] == key[:2] and k[2] for k in self._kept)
        if last:
            self._drop((key[0], key[1], ""))
        return dropped

    def _drop(self, key: ShelfKey) -> bool:
        with self._lock:
            shelved = self._kept.pop(key, None)
        if shelved is not None:
            shutil.rmtree(shelved.directory, ignore_errors=True)
        return shelved is not None

    def sweep(self) -> int:
        """Release checkpoints idle longer than the TTL; returns how many (and drop the groups' old slots)."""
        self._drop_old_slots()
        now = time.monotonic()
        with self._lock:
            stale = [k for k, s in self._kept.items() if now - s.last_used > self.idle_ttl_s]
        for k in stale:
            log.info("released the far-horizon checkpoint of %s/%d for %s (idle %.0f s)", k[0], k[1], k[2],
                     self.idle_ttl_s)
            self.release(k)
        return len(stale)

    def keys(self) -> list[ShelfKey]:
        with self._lock:
            return list(self._kept)

    def close(self) -> None:
        for k in self.keys():
            self.release(k)


def _linked(source: Shelved, directory: Path, log_end: int) -> Shelved | None:
    """``source``'s checkpoint hard-linked into ``directory`` (made: a checkpoint's directory is only streamed from,
    never written), with ``log_end`` and the time ``source`` was made; None if its files went meanwhile."""
    try:
        directory.mkdir(parents=True)
        for f in source.manifest.files:
            os.link(source.directory / f.name, directory / f.name)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return Shelved(directory, source.manifest, source.epoch_pairs, log_end, made=source.made)


# ---------------------------------------------------------------------------------------- leader side


def read_chunk(path: Path, name: str, offset: int, size: int, buf: bytearray,
               chunk_sent: ChunkFilter | None = None) -> bytes:
    """Data chunk ``name`` at ``offset`` (``size`` bytes, from the manifest) read and encoded as its message.

    Blocking: :func:`stream_checkpoint` runs it in a thread, so neither the
    read nor the copy into the message holds the event loop (which serves the
    writers' appends on the same leader). ``buf`` is reused by the stream: a
    thread allocating a fresh 2 MiB per read page-faults new memory of its
    malloc arena every time; the encoded message is the only fresh copy.
    """
    view = memoryview(buf)[:size]
    with open(path, "rb", buffering=0) as fh:
        fh.seek(offset)
        n = fh.readinto(view)
    if n != size:
        raise FileNotFoundError(f"{path} ended at {offset + (n or 0)} of at least {offset + size} bytes")
    return encode_data_chunk(name, offset, view if chunk_sent is None else chunk_sent(view))


def chunk_for_rate(rate: int) -> int:
    """The chunk a follower copying at ``rate`` B/s asks for (0: unpaced, the leader's own size)."""
    if rate <= 0:
        return 0
    return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, int(rate * CHUNK_PACE_S)))


def served_chunk_bytes(asked: int) -> int:
    """The chunk size a leader streams for a request that asked for ``asked`` (0: :data:`CHUNK_BYTES`)."""
    return CHUNK_BYTES if asked <= 0 else max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, asked))


def encode_data_chunk(name: str, offset: int, data: bytes | memoryview) -> bytes:
    """``CheckpointChunk(file=name, file_offset=offset, data=data)`` in wire format, copying ``data`` once.

    upb's ``SerializeToString`` of a fresh 2 MiB message grows its buffer by
    doubling in a new arena and frees it: about 3 MB of freshly faulted pages
    per MB sent (bench.catchup measured it as the leader's largest cost).
    Fields 2, 3 and 4 are simple to write by hand; the reader is unchanged.
    """
    nb = name.encode()
    return b"".join((b"\x12", varint(len(nb)), nb, b"\x18", varint(offset), b"\x22", varint(len(data)), data))


FETCH_METHOD = "/millrace.Replication/FetchCheckpoint"
#: conductor backup's rounds: served exactly as FETCH_METHOD, authorized as an operator's (admin) call
BACKUP_METHOD = "/millrace.Replication/BackupCheckpoint"


def _read_varint(raw: memoryview, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = raw[i]
        i += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i
        shift += 7


def _parse(raw: bytes) -> pb.CheckpointChunk | tuple[str, int, memoryview]:
    chunk: pb.CheckpointChunk = pb.CheckpointChunk.FromString(raw)
    if chunk.HasField("info"):
        return chunk
    return chunk.file, chunk.file_offset, memoryview(chunk.data)


def decode_chunk(raw: bytes) -> pb.CheckpointChunk | tuple[str, int, memoryview]:
    """The follower's side of :func:`encode_data_chunk`: a data chunk as (file, offset, view of its bytes).

    Parsing a 2 MiB message with protobuf copies the data into fresh memory
    once more; a view into the received bytes does not. Anything else (the
    round's description, or fields in another order) goes through protobuf;
    the description comes back as the message itself.
    """
    view = memoryview(raw)
    try:
        if view[0] != 0x12:
            return _parse(raw)
        n, i = _read_varint(view, 1)
        name = bytes(view[i:i + n]).decode()
        i += n
        if view[i] != 0x18:
            return _parse(raw)
        offset, i = _read_varint(view, i + 1)
        if view[i] != 0x22:
            return _parse(raw)
        n, i = _read_varint(view, i + 1)
        if i + n != len(view):
            return _parse(raw)
        return name, offset, view[i:i + n]
    except IndexError:
        return _parse(raw)  # raises DecodeError for a truncated message


def serialize_chunk(message: pb.CheckpointChunk | bytes) -> bytes:
    """FetchCheckpoint's response serializer: pre-encoded data chunks pass through, the description is serialized."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def replication_handler(servicer: pbg.ReplicationServicer) -> grpc.GenericRpcHandler:
    """The Replication service with checked request bodies; FetchCheckpoint (and BackupCheckpoint, the same
    rounds for ``conductor backup``) may yield pre-encoded chunks."""
    return checked_handler(pb.DESCRIPTOR.services_by_name["Replication"], servicer,
                           {"FetchCheckpoint": serialize_chunk, "BackupCheckpoint": serialize_chunk})


async def stream_checkpoint(shelved: Shelved, have: list[pb.CheckpointFile], chunk_sent: ChunkFilter | None = None,
                            chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[pb.CheckpointChunk | bytes]:
    """The messages of one round: the checkpoint's description, then every file the follower lacks, chunked.

    Each data chunk is read and encoded in a thread (:func:`read_chunk`); the
    next one is read while this one is sent, so the disk read and gRPC's send
    overlap, and the event loop only hands finished messages to gRPC. Two
    chunk buffers per stream, never more: memory per transfer is bounded.
    Data chunks come pre-encoded (:func:`encode_data_chunk`); serve them
    through :func:`replication_handler`. ``chunk_sent`` is a test's hook on each data chunk (see
    :class:`~conductor.worker.hooks.WorkerHooks`), called in that thread.
    """
    assert chunk_bytes > 0, chunk_bytes
    held = {(f.name, f.size, f.crc32c) for f in have}
    send = [f for f in shelved.manifest.files if (f.name, f.size, f.crc32c) not in held]
    pairs = shelved.epoch_pairs
    yield pb.CheckpointChunk(info=pb.CheckpointInfo(
        manifest_json=shelved.manifest.to_json(), epochs=[e for e, _s in pairs], epoch_starts=[s for _e, s in pairs],
        leader_log_end=shelved.leader_log_end, send_bytes=sum(f.size for f in send)))
    # an empty file still gets one (empty) chunk, so the follower creates it
    chunks = [(f.name, offset, min(chunk_bytes, f.size - offset)) for f in send
              for offset in range(0, max(f.size, 1), chunk_bytes)]
    buffers = (bytearray(chunk_bytes), bytearray(chunk_bytes))

    def read(i: int) -> asyncio.Future[bytes]:
        name, offset, size = chunks[i]
        return asyncio.ensure_future(asyncio.to_thread(
            read_chunk, shelved.directory / name, name, offset, size, buffers[i % 2], chunk_sent))

    ahead = read(0) if chunks else None
    try:
        for i in range(len(chunks)):
            assert ahead is not None
            current, ahead = ahead, (read(i + 1) if i + 1 < len(chunks) else None)
            message = await current  # (chunk i + 1 reads into the other buffer meanwhile)
            shelved.last_used = time.monotonic()
            yield message
    finally:
        if ahead is not None:  # the follower went away mid-round: the read in flight is not wanted
            ahead.cancel()


# -------------------------------------------------------------------------------------- follower side


@dataclass
class CatchupProgress:
    """What ``conductor status`` and the node log show of a running catchup."""

    leader: str
    round: int = 0
    bytes_total: int = 0  #: this round's bytes to copy
    bytes_done: int = 0
    copied_total: int = 0  #: every round's bytes so far
    refetched: int = 0  #: files that failed their checksum in transit and were fetched again
    started: float = field(default_factory=time.monotonic)
    round_started: float = field(default_factory=time.monotonic)
    state: str = "copying"

    def rate(self) -> float:
        """Bytes per second of the current round."""
        elapsed = time.monotonic() - self.round_started
        return self.bytes_done / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        r = self.rate()
        return (self.bytes_total - self.bytes_done) / r if r > 0 else None


#: installs a verified checkpoint on the task thread: (staging dir, manifest, epoch pairs, the files checked on
#: arrival, for :func:`pstate.checkpoint.install`) -> None or why not
InstallFn = Callable[[Path, Manifest, Pairs, Checked], "str | None"]


class Catchup:
    """One far-horizon transfer on the follower, in its own thread (blocking gRPC and file writes stay off the loop)."""

    def __init__(self, name: str, module: str, group: int, follower: str, leader: str, address: str, epoch: int,
                 staging: Path, near_lag: int, install: InstallFn, *,
                 channel_options: list[tuple[str, Any]] | None = None,
                 on_done: Callable[[CatchupProgress], None] | None = None,
                 pacing: CopyPacing | None = None) -> None:
        self.name = name
        self.module = module
        self.group = group
        self.follower = follower
        self.leader = leader
        self.address = address
        self.epoch = epoch
        self.staging = staging
        self.near_lag = near_lag
        self._install = install
        self._on_done = on_done
        self._options = channel_options or []
        self.progress = CatchupProgress(leader)
        self.outcome: str | None = None  #: "installed" or why it stopped; None while running
        self.thread = threading.Thread(target=self._run, name=f"catchup-{name}", daemon=True)
        #: each received file is fsynced here while the next one streams, so install finds clean pages
        self._flusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"catchup-fsync-{name}")
        self._flushing: dict[str, concurrent.futures.Future[None]] = {}
        #: the stamp of each file when it passed its check on arrival (install trusts those still so stamped)
        self._stamps: dict[str, FileStamp] = {}
        self._stop = threading.Event()
        self._last_log = 0.0
        #: paces the copy to ``pacing.limit()`` bytes per second, read live (a reassignment's copies; 0: unpaced),
        #: drawn from a budget this worker's copies of the module share (conductor.worker.throttle); none: unpaced
        self._throttle = (CopyThrottle(lambda: 0, wait=self._stop.wait) if pacing is None
                          else CopyThrottle(pacing.limit, wait=self._stop.wait, budget=pacing.budget))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def _run(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        verified: dict[str, ManifestFile] = {}
        channel = open_channel(self.address, self._options)  # TLS: the worker's certificate, if it has one
        # Responses stay raw bytes: decode_chunk parses data chunks without copying them.
        fetch = channel.unary_stream(FETCH_METHOD, request_serializer=pb.FetchCheckpointRequest.SerializeToString,
                                     response_deserializer=None)
        log.warning("%s: far-horizon catchup from %s (%s) started", self.name, self.leader, self.address)
        try:
            self.outcome = self._rounds(fetch, verified)
        except _Stopped:
            self.outcome = "stopped"
        except grpc.RpcError as e:
            self.outcome = f"leader {self.leader} stopped the transfer: {e.code().name} {e.details()}"
        except Exception as e:
            log.exception("%s: far-horizon catchup failed", self.name)
            self.outcome = f"failed: {e}"
        finally:
            self._flusher.shutdown(wait=True)
            self.progress.state = self.outcome or "stopped"
            try:
                for _ in fetch(self._request([], release=True), timeout=10):
                    pass
            except grpc.RpcError:
                pass
            channel.close()
            shutil.rmtree(self.staging, ignore_errors=True)
        p = self.progress
        if self._on_done is not None:
            self._on_done(p)
        elapsed = time.monotonic() - p.started
        log.warning("%s: far-horizon catchup from %s: %s after %d round(s), %.1f MB in %.3f s (%.1f MB/s), "
                    "%d file(s) re-fetched", self.name, self.leader, self.outcome, p.round, p.copied_total / 1e6,
                    elapsed, p.copied_total / 1e6 / max(elapsed, 1e-9), p.refetched)

    def _request(self, have: list[ManifestFile], release: bool = False) -> pb.FetchCheckpointRequest:
        return pb.FetchCheckpointRequest(
            module=self.module, group=self.group, follower=self.follower, epoch=self.epoch, release=release,
            have=[pb.CheckpointFile(name=f.name, size=f.size, crc32c=f.crc32c) for f in have],
            chunk_bytes=chunk_for_rate(self._throttle.limit()))

    def _rounds(self, fetch: grpc.UnaryStreamMultiCallable, verified: dict[str, ManifestFile]) -> str:
        previous: tuple[float, int] | None = None  # (when the previous round started, the leader's log end then)
        for rnd in range(1, MAX_ROUNDS + 1):
            if self._stop.is_set():
                return "stopped"
            manifest, pairs, leader_end = self._round(rnd, fetch, verified)
            started = self.progress.round_started
            rate = None if previous is None else (leader_end - previous[1]) / max(started - previous[0], 1e-3)
            previous = (started, leader_end)
            wanted = {f.name for f in manifest.files}
            for name in [n for n in verified if n not in wanted]:  # compacted away on the leader
                del verified[name]
                (self.staging / name).unlink(missing_ok=True)
            complete = all(verified.get(f.name) == f for f in manifest.files)
            behind = behind_at_install(leader_end - 1 - manifest.applied_offset, time.monotonic() - started, rate,
                                       self.near_lag)
            if complete and round_is_last(behind, self.near_lag, rnd):
                self.progress.state = "installing"
                for fut in self._flushing.values():
                    fut.result()
                why_not = self._install(self.staging, manifest, pairs, {n: self._stamps[n] for n in verified})
                return "installed" if why_not is None else f"not installed: {why_not}"
            log.info("%s: round %d: checkpoint at offset %d is %d entries behind the leader%s; another round",
                     self.name, rnd, manifest.applied_offset, behind, "" if complete else " (files to re-fetch)")
        raise AssertionError("unreachable")  # the last round always returns

    def _round(self, rnd: int, fetch: grpc.UnaryStreamMultiCallable,
               verified: dict[str, ManifestFile]) -> tuple[Manifest, Pairs, int]:
        p = self.progress
        p.round = rnd
        p.round_started = time.monotonic()
        p.bytes_done = 0
        p.state = "copying"
        manifest: Manifest | None = None
        pairs: Pairs = []
        leader_end = 0
        by_name: dict[str, ManifestFile] = {}
        current: IncomingFile | None = None
        for raw in fetch(self._request(list(verified.values())), wait_for_ready=False):
            if self._stop.is_set():
                raise _Stopped
            chunk = decode_chunk(raw)
            if isinstance(chunk, pb.CheckpointChunk):
                info = chunk.info
                manifest = Manifest.from_json(info.manifest_json)
                pairs = list(zip(info.epochs, info.epoch_starts, strict=True))
                leader_end = info.leader_log_end
                by_name = {f.name: f for f in manifest.files}
                p.bytes_total = info.send_bytes
                continue
            name, offset, data = chunk
            if current is None or current.meta.name != name:
                if current is not None:
                    self._finish(current, verified)
                meta = by_name.get(name)
                if meta is None or os.sep in name or name in ("", ".", ".."):
                    raise ValueError(f"leader sent {name!r}, which its manifest does not list")
                verified.pop(meta.name, None)
                pending = self._flushing.pop(meta.name, None)
                if pending is not None:
                    pending.result()  # an earlier copy of the same name is being fsynced: let it finish first
                current = IncomingFile(meta, self.staging / meta.name)
            if offset != current.size:
                raise ValueError(f"{name}: chunk at {offset}, expected {current.size}")
            current.write(data)
            p.bytes_done += len(data)
            p.copied_total += len(data)
            self._maybe_log()
            self._throttle.pace(len(data))
        if current is not None:
            self._finish(current, verified)
        if manifest is None:
            raise ValueError("the leader's round carried no checkpoint description")
        return manifest, pairs, leader_end

    def _finish(self, f: IncomingFile, verified: dict[str, ManifestFile]) -> None:
        f.flush()
        if f.size == f.meta.size and f.crc == f.meta.crc32c:
            verified[f.meta.name] = f.meta
            self._stamps[f.meta.name] = file_stamp(f.path)  # (every byte is written: fsync changes no stamp)
            self._flushing[f.meta.name] = self._flusher.submit(f.sync_and_close)
            return
        f.close()
        self.progress.refetched += 1
        f.path.unlink(missing_ok=True)
        log.warning("%s: %s arrived damaged (size/CRC32C %d/%#010x, manifest %d/%#010x); fetching it again",
                    self.name, f.meta.name, f.size, f.crc, f.meta.size, f.meta.crc32c)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < 2.0:
            return
        self._last_log = now
        log.info("%s: %s", self.name, describe(self.progress))


class _Stopped(Exception):
    """The node is closing the replica: abandon the transfer (the leader re-offers later)."""


class IncomingFile:
    """A file being received: written as it comes, around the page cache where the disk allows
    (:mod:`conductor.worker.unbuffered_file`), checksummed on the way."""

    def __init__(self, meta: ManifestFile, path: Path) -> None:
        self.meta = meta
        self.path = path
        self.size = 0
        self.crc = 0
        self._out = UnbufferedFile(path)

    def write(self, data: bytes | memoryview) -> None:
        self._out.write(data)
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += len(data)

    def flush(self) -> None:
        """Every byte in the file (the CRC verdict covers what was written; the file's stamp is taken next)."""
        self._out.drain()

    def sync_and_close(self) -> None:
        self._out.sync()
        self._out.close()

    def close(self) -> None:
        self._out.close()


def describe(p: CatchupProgress) -> str:
    """One log line: round, bytes, rate and ETA."""
    eta = p.eta_s()
    return (f"far-horizon catchup from {p.leader}: round {p.round}, {p.bytes_done / 1e6:.1f} of "
            f"{p.bytes_total / 1e6:.1f} MB at {p.rate() / 1e6:.1f} MB/s, ETA "
            f"{'-' if eta is None else f'{eta:.0f} s'} ({p.state})")
