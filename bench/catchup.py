"""Far-horizon catchup throughput against a plain gRPC file copy and ``cp`` of the same files, in one run.

    python -m bench.catchup [--quick] [--mb N] [--rounds N] [--dir PATH]

A real RocksDB (:class:`pstate.TaskGroupStore`, one ``Map(int, bytes)`` PState
of 4 KiB random values, so the SST files are as large as the data) is filled
to ``--mb`` megabytes (512 full, 160 ``--quick``) and checkpointed with the
production ``TaskGroupStore.checkpoint``. The same checkpoint directory is
then copied three ways, all on the same disk, the source always warm in the
page cache:

* ``catchup`` (the figure under test): a ``grpc.aio`` server in a separate
  process (``--serve far``; leader and follower never share a GIL, as on two
  nodes) whose ``FetchCheckpoint`` is :class:`conductor.worker.services.ReplicationService`'s
  handler minus the cluster: a :class:`~conductor.worker.far_horizon.CheckpointShelf`
  round (hard links of the checkpoint's files, as RocksDB's checkpoint makes),
  :func:`~conductor.worker.far_horizon.stream_checkpoint` (each chunk read and
  encoded in a thread, the next read while this one is sent), served through ``replication_handler`` (data chunks
  pre-encoded). The client is the production
  :class:`~conductor.worker.far_horizon.Catchup` thread (CRC32C per file as it
  arrives), whose ``install`` callback runs the production
  :func:`pstate.checkpoint.install` into a fresh store directory, given the
  files' arrival stamps as production gives them (hard-links the files checked
  on arrival without reading them again, fsyncs the directory, swaps the
  symlink). Timed from ``Catchup.start()`` to the end of the install.
* ``grpc_copy`` (the peer the goal is set against): the same files over a
  minimal ``grpc.aio`` server-streaming method in another process (``--serve
  raw``; a generic handler with raw ``bytes`` messages, the same 2 MiB chunks,
  files read sequentially on the loop), written by a sync gRPC client and
  fsynced per file plus the directory: no protobuf, no CRC, no manifest, no install.
* ``cp``: ``cp -r`` of the checkpoint directory, then ``sync`` of the copied
  files and directory (what the disk itself can do without a network hop).

MB are 10**6 bytes of the manifest's files. Each round runs the three in
turn after an ``os.sync()`` (no leftover writeback inside a timed section);
rates are medians over ``--rounds`` (5) and the ratios are medians of per-round
ratios (adjacent runs share the shared box's mood). The leader's
``TaskGroupStore.checkpoint`` (flush + hard links + a CRC32C pass) is timed
once and reported apart: a production round pays it before streaming.

Prints a table, then as the LAST line one JSON object (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from bench.unwind import unwind_on
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.far_horizon import (
    CHUNK_BYTES,
    Catchup,
    CheckpointShelf,
    Shelved,
    replication_handler,
    served_chunk_bytes,
    stream_checkpoint,
)
from pstate import Map, TaskGroupStore
from pstate.checkpoint import Checked, Manifest, fsync_dir, install, read_manifest

GOAL_RATIO_VS_GRPC_COPY = 0.8
PSTATE = "$$blobs"
SCHEMAS = {PSTATE: Map(int, bytes)}
VALUE_BYTES = 4096
#: values per applied ChangeSet: 8 MiB WriteBatches fill the store at RocksDB speed, not per-key Python speed
BATCH_VALUES = 2048
EPOCH = 1
MODULE = "Bench"
RAW_METHOD = "/bench.catchup.Copy/Fetch"
SERVER_START_TIMEOUT_S = 60.0
TRANSFER_TIMEOUT_S = 600.0

err = Console(stderr=True)


# ------------------------------------------------------------------------------------------ dataset


def fill_store(path: Path, megabytes: int) -> tuple[TaskGroupStore, int]:
    """A real RocksDB holding ``megabytes`` of random 4 KiB values; returns (open store, keys written).

    Random values keep Snappy from shrinking the SSTs, so the checkpoint is as
    large as the data, like a store of already-compressed payloads.
    """
    store = TaskGroupStore(path, SCHEMAS)
    n_keys = megabytes * 1_000_000 // VALUE_BYTES
    for offset, start in enumerate(range(0, n_keys, BATCH_VALUES)):
        stop = min(start + BATCH_VALUES, n_keys)
        blob = os.urandom((stop - start) * VALUE_BYTES)
        cs = store.changes()
        put = cs.set
        for i in range(start, stop):
            j = (i - start) * VALUE_BYTES
            put(PSTATE, i, blob[j:j + VALUE_BYTES])
        store.apply(offset, cs.changeset())
    return store, n_keys


def warm(directory: Path) -> None:
    """Read every file once so all three copies start from the page cache, not from the disk."""
    for p in directory.iterdir():
        with open(p, "rb") as fh:
            while fh.read(8 << 20):
                pass


# ------------------------------------------------------------------------------------- server side


class _FarHorizonServicer(pbg.ReplicationServicer):
    """``ReplicationService.FetchCheckpoint`` without the node: same shelf, same stream, same read offload.

    ``Worker.checkpoint_round`` makes a fresh RocksDB checkpoint per round; here
    the round hard-links the files of the checkpoint taken up front (what
    RocksDB's checkpoint does for SSTs) and reuses its manifest, so the rounds
    of a run serve identical bytes. The checkpoint's own cost is timed apart.
    """

    def __init__(self, source: Path, shelf: CheckpointShelf) -> None:
        self.source = source
        self.shelf = shelf
        self.manifest = read_manifest(str(source))

    def _round(self, request: pb.FetchCheckpointRequest) -> Shelved:
        def make(directory: Path) -> Shelved:
            directory.mkdir(parents=True)
            for f in self.manifest.files:
                os.link(self.source / f.name, directory / f.name)
            return Shelved(directory, self.manifest, [(EPOCH, 0)], self.manifest.applied_offset + 1)
        return self.shelf.take((request.module, request.group, request.follower), make)

    async def FetchCheckpoint(self, request: pb.FetchCheckpointRequest,
                              context: Any) -> AsyncIterator[pb.CheckpointChunk | bytes]:
        key = (request.module, request.group, request.follower)
        if request.release:
            self.shelf.release(key)
            return
        shelved = await asyncio.to_thread(self._round, request)
        async for chunk in stream_checkpoint(shelved, list(request.have), None, served_chunk_bytes(request.chunk_bytes)):
            yield chunk

    #: the service's backup rounds are the same rounds (the worker's ReplicationService does the same)
    BackupCheckpoint = FetchCheckpoint


def _raw_copy_handler(source: Path) -> grpc.GenericRpcHandler:
    """A plain file stream: a JSON list of (name, size), then every file's bytes in 2 MiB raw messages."""
    files = sorted((p.name, p.stat().st_size) for p in source.iterdir())

    async def fetch(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield json.dumps(files).encode()
        for name, _size in files:
            with open(source / name, "rb") as fh:
                while data := fh.read(CHUNK_BYTES):
                    yield data
    # no (de)serializers: grpc passes bytes through untouched
    handler = grpc.unary_stream_rpc_method_handler(fetch)
    service, method = RAW_METHOD.strip("/").split("/")
    return grpc.method_handlers_generic_handler(service, {method: handler})


async def _serve(kind: str, source: Path, shelf_root: Path) -> None:
    """Serve until stdin closes (the parent exited or closed it), so a dead parent never leaves us behind."""
    server = grpc.aio.server(options=GRPC_OPTIONS)
    shelf: CheckpointShelf | None = None
    if kind == "far":
        shelf = CheckpointShelf(shelf_root)
        server.add_generic_rpc_handlers((replication_handler(_FarHorizonServicer(source, shelf)),))
    else:
        server.add_generic_rpc_handlers((_raw_copy_handler(source),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    try:
        await asyncio.to_thread(sys.stdin.buffer.read)
    finally:
        await server.stop(grace=None)
        if shelf is not None:
            shelf.close()


class ServerProcess:
    """One ``--serve`` child: its own interpreter (own GIL), 127.0.0.1 on a free port, stopped by its pid."""

    def __init__(self, kind: str, source: Path, shelf_root: Path) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.catchup", "--serve", kind, "--source", str(source),
             "--shelf", str(shelf_root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
        self.address = f"127.0.0.1:{self._read_port()}"

    def _read_port(self) -> int:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], SERVER_START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the {self.kind} server did not start (exit code {self.proc.poll()})")
        return int(line)

    def stop(self) -> None:
        stop_child(self.proc)


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child started with pipes for stdin and stdout: closing its stdin first (the polite way: a server
    child stops its server and its shelf), then SIGTERM, then SIGKILL; its pipes closed."""
    if proc.poll() is None:
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None and not stream.closed:
            stream.close()


# ------------------------------------------------------------------------------------- client side


def catchup_copy(address: str, work: Path, manifest: Manifest) -> dict[str, float]:
    """One production far-horizon transfer into ``work``; seconds in total, copying and installing."""
    dest = work / "store"
    marks: dict[str, float] = {}

    def install_fn(staging: Path, m: Manifest, pairs: list[tuple[int, int]], checked: Checked) -> str | None:
        marks["install_start"] = time.perf_counter()
        install(staging, m, dest, checked)
        marks["install_end"] = time.perf_counter()
        return None

    c = Catchup("bench", MODULE, 0, "follower", "leader", address, EPOCH, work / "far-horizon",
                near_lag=1000, install=install_fn, channel_options=GRPC_OPTIONS)
    t0 = time.perf_counter()
    c.start()
    c.thread.join(TRANSFER_TIMEOUT_S)
    if c.running:
        c.stop()
        c.thread.join(30)
        raise RuntimeError("far-horizon catchup did not finish in time")
    if c.outcome != "installed" or "install_end" not in marks:
        raise RuntimeError(f"far-horizon catchup ended {c.outcome!r}")
    if c.progress.copied_total != manifest.total_bytes():
        raise RuntimeError(f"catchup copied {c.progress.copied_total} bytes, manifest {manifest.total_bytes()}")
    return {"total": marks["install_end"] - t0, "copy": marks["install_start"] - t0,
            "install": marks["install_end"] - marks["install_start"]}


def raw_messages(address: str) -> Iterator[bytes]:
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        yield from channel.unary_stream(RAW_METHOD)(b"", timeout=TRANSFER_TIMEOUT_S)


def grpc_copy(address: str, dest: Path) -> float:
    """The plain copy: write each streamed file as it comes, fsync it and, at the end, the directory."""
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    messages = raw_messages(address)
    files = json.loads(next(messages))
    for name, size in files:
        with open(dest / name, "wb") as fh:
            left = size
            while left > 0:
                data = next(messages)
                fh.write(data)
                left -= len(data)
            fh.flush()
            os.fsync(fh.fileno())
    fsync_dir(dest)
    elapsed = time.perf_counter() - t0
    for _ in messages:  # end of stream; closes the channel
        raise RuntimeError("the raw copy server sent more than the files")
    return elapsed


def cp_copy(source: Path, dest: Path) -> float:
    """``cp -r`` then ``sync`` of every copied file and the directory (coreutils fsyncs named files)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(dest)], check=True)
    subprocess.run(["sync", *(str(p) for p in dest.iterdir()), str(dest)], check=True)
    return time.perf_counter() - t0


def verify_installed(store_dir: Path, n_keys: int, applied: int) -> None:
    """The installed store opens and holds what the leader wrote (once, outside the timed runs)."""
    s = TaskGroupStore(store_dir, SCHEMAS)
    try:
        if s.applied_offset != applied:
            raise RuntimeError(f"installed store is at offset {s.applied_offset}, expected {applied}")
        for k in (0, n_keys // 2, n_keys - 1):
            v = s.select_one(PSTATE, k)
            if not isinstance(v, bytes) or len(v) != VALUE_BYTES:
                raise RuntimeError(f"installed store lacks key {k}")
    finally:
        s.close()


# ------------------------------------------------------------------------------------------- driver


def run(root: Path, megabytes: int, rounds: int) -> dict[str, Any]:
    """Build the dataset, start the servers, alternate the copies ``rounds`` times; medians."""
    t = time.perf_counter()
    store, n_keys = fill_store(root / "leader", megabytes)
    fill_s = time.perf_counter() - t
    source = root / "checkpoint"
    t = time.perf_counter()
    manifest: Manifest = store.checkpoint(source, EPOCH)
    checkpoint_s = time.perf_counter() - t
    applied = store.applied_offset
    store.close()
    mb = manifest.total_bytes() / 1e6
    err.log(f"store filled in {fill_s:.1f} s; checkpoint: {len(manifest.files)} files, {mb:.1f} MB "
            f"(taken in {checkpoint_s:.2f} s)")
    warm(source)
    servers: dict[str, ServerProcess] = {}
    times: dict[str, list[float]] = {k: [] for k in ("far", "far_copy", "far_install", "grpc", "cp")}
    try:
        for kind in ("far", "raw"):
            servers[kind] = ServerProcess(kind, source, root / f"shelf-{kind}")
        for r in range(rounds):
            work = root / "run"
            os.sync()  # no writeback left over from the previous copy inside this one
            f = catchup_copy(servers["far"].address, work / "follower", manifest)
            if r == 0:
                verify_installed(work / "follower" / "store", n_keys, applied)
            shutil.rmtree(work)
            times["far"].append(f["total"])
            times["far_copy"].append(f["copy"])
            times["far_install"].append(f["install"])
            os.sync()
            times["grpc"].append(grpc_copy(servers["raw"].address, work / "grpc"))
            shutil.rmtree(work)
            os.sync()
            times["cp"].append(cp_copy(source, work / "cp"))
            shutil.rmtree(work)
            line = (f"round {r + 1}/{rounds}: catchup {mb / f['total']:.0f} MB/s (copy {f['copy']:.2f} s, "
                    f"install {f['install']:.2f} s), grpc copy {mb / times['grpc'][-1]:.0f} MB/s, "
                    f"cp {mb / times['cp'][-1]:.0f} MB/s")
            err.log(line)
    finally:
        for server in servers.values():
            server.stop()

    def med(k: str) -> float:
        return statistics.median(times[k])

    def ratio(k: str, peer: str) -> float:
        """Median of per-round ratios: a run and its peer right after it share the box's mood."""
        return round(statistics.median(b / a for a, b in zip(times[k], times[peer], strict=True)), 3)

    out: dict[str, Any] = {
        "checkpoint_mb": round(mb, 1),
        "checkpoint_files": len(manifest.files),
        "catchup_mb_per_s": round(mb / med("far"), 1),
        "grpc_copy_mb_per_s": round(mb / med("grpc"), 1),
        "cp_mb_per_s": round(mb / med("cp"), 1),
        "ratio_vs_grpc_copy": ratio("far", "grpc"),
        "ratio_vs_cp": ratio("far", "cp"),
        "catchup_s": round(med("far"), 3),
        "catchup_copy_s": round(med("far_copy"), 3),
        "catchup_install_s": round(med("far_install"), 3),
        "grpc_copy_s": round(med("grpc"), 3),
        "cp_s": round(med("cp"), 3),
        "leader_checkpoint_s": round(checkpoint_s, 3),
        "fill_s": round(fill_s, 1),
    }
    return out



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ~160 MB checkpoint (well under a minute)")
    ap.add_argument("--mb", type=int, default=None, help="data to write before the checkpoint (512 full, 160 quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="runs of each copy; medians are reported (9 quick: its copies take ~0.2 s, so noise is large)")
    ap.add_argument("--dir", help="parent of the working directory (default: the repo's build/, on disk)")
    ap.add_argument("--serve", choices=("far", "raw"), help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--shelf", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
        asyncio.run(_serve(args.serve, Path(args.source), Path(args.shelf)))
        return

    megabytes = args.mb or (160 if args.quick else 512)
    args.rounds = args.rounds or (9 if args.quick else 5)
    # the Catchup thread logs start and end at WARNING; the progress lines below say it all
    logging.getLogger("millrace.far_horizon").setLevel(logging.ERROR)
    # unwind like Ctrl-C: children stopped, temp dirs removed (SIGINT too, in case a shell started us ignoring it)
    unwind_on(signal.SIGTERM, signal.SIGINT)
    parent = Path(args.dir) if args.dir else Path(__file__).resolve().parent.parent / "build"
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="millrace-catchup-bench-", dir=parent))
    t0 = time.monotonic()
    try:
        r = run(root, megabytes, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    goal_met = r["ratio_vs_grpc_copy"] >= GOAL_RATIO_VS_GRPC_COPY
    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title=f"far-horizon catchup of a {r['checkpoint_mb']:.0f} MB checkpoint "
                        f"({r['checkpoint_files']} files) on 127.0.0.1, median of {args.rounds}")
    for col in ("copy", "MB/s", "seconds", "catchup / this"):
        table.add_column(col, justify="left" if col == "copy" else "right")
    table.add_row("far-horizon catchup (Catchup + install)", f"{r['catchup_mb_per_s']:,.1f}", f"{r['catchup_s']:.2f}",
                  "1.00")
    table.add_row("  of which streaming + CRC32C", "-", f"{r['catchup_copy_s']:.2f}", "")
    table.add_row("  of which install (verify, link, fsync)", "-", f"{r['catchup_install_s']:.2f}", "")
    table.add_row("plain gRPC stream, raw bytes, fsync", f"{r['grpc_copy_mb_per_s']:,.1f}", f"{r['grpc_copy_s']:.2f}",
                  f"{r['ratio_vs_grpc_copy']:.2f} (goal >= {GOAL_RATIO_VS_GRPC_COPY}: "
                  f"{'[green]met[/]' if goal_met else '[red]MISSED[/]'})")
    table.add_row("cp -r + sync", f"{r['cp_mb_per_s']:,.1f}", f"{r['cp_s']:.2f}", f"{r['ratio_vs_cp']:.2f}")
    table.add_row("leader checkpoint (flush, links, CRC32C; once)", "-", f"{r['leader_checkpoint_s']:.2f}", "")
    console.print(table)
    summary = {
        "bench": "catchup",
        "quick": args.quick,
        "chunk_bytes": CHUNK_BYTES,
        **r,
        "goal_ratio_vs_grpc_copy": GOAL_RATIO_VS_GRPC_COPY,
        "goal_met": goal_met,
        "seconds": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
