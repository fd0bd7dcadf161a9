"""Crash consistency of the task-group store (WAL off, atomic flush, one WriteBatch per entry).

A clean run on a "leader" store produces a long run of replog payloads and the
expected state after every offset.  A child process then applies those
payloads to a fresh store (tiny memtables, so RocksDB flushes often) and is
SIGKILLed at random points, many times.  After every kill the store is
reopened: its state must equal the expected state at exactly
``_meta.applied_offset`` — never a mix of two offsets — and the next child
resumes from ``applied_offset + 1``.  A final uninterrupted run must end in
the clean run's final state.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path as FsPath
from typing import Any

import msgpack

from pstate import Map, P, Set, TaskGroupStore

SCHEMAS: dict[str, Any] = {"$$counts": Map(str, int), "$$follows": Map(str, Set(str).subindexed())}
DEPOTS = ["*events"]
ENTRIES = 1500
REPO = str(FsPath(__file__).resolve().parents[2])

CHILD = r"""
import sys, msgpack
from pstate import Map, Set, TaskGroupStore
path, entries_file = sys.argv[1], sys.argv[2]
with open(entries_file, "rb") as fh:
    payloads = msgpack.unpackb(fh.read())
store = TaskGroupStore(path, {"$$counts": Map(str, int), "$$follows": Map(str, Set(str).subindexed())},
                       depots=["*events"], write_buffer_size=64 * 1024)
start = store.applied_offset + 1
print(start, flush=True)
for off in range(start, len(payloads)):
    store.apply(off, payloads[off])
store.close()
print("done", flush=True)
"""


def snapshot(store: TaskGroupStore) -> Any:
    d = store.depot("*events")
    info = d.partition_info(0)
    return (
        sorted(store.select("$$counts", P.all())),
        sorted((u, sorted(fs)) for u, fs in store.select("$$follows", P.all())),
        store.select("$$follows", P.map_vals().count()),
        (info.start, info.end, d.read(0, info.start, max_bytes=1 << 30)),
    )


def build_entries(path: FsPath) -> tuple[list[bytes], list[Any]]:
    rng = random.Random(1234)
    words = [f"w{i}" for i in range(60)]
    users = [f"u{i}" for i in range(15)]
    leader = TaskGroupStore(path, SCHEMAS, depots=DEPOTS)
    payloads: list[bytes] = []
    states: list[Any] = []
    try:
        for off in range(ENTRIES):
            cs = leader.changes()
            for _ in range(rng.randint(5, 40)):
                r = rng.random()
                if r < 0.5:
                    cs.transform("$$counts", P.key(rng.choice(words)).null_to_val(0).update(lambda n: n + 1))
                elif r < 0.6:
                    cs.transform("$$counts", P.key(rng.choice(words)).remove())
                elif r < 0.85:
                    cs.transform("$$follows", P.key(rng.choice(users)).add(*rng.sample(words, 3)))
                elif r < 0.95:
                    cs.transform("$$follows", P.key(rng.choice(users)).discard(*rng.sample(words, 5)))
                else:
                    cs.transform("$$follows", P.key(rng.choice(users)).sorted_range("w1", "w3").remove())
            cs.depot_append("*events", 0, [f"entry {off}" * 3])
            if off % 100 == 99:
                cs.depot_trim("*events", 0, off - 50)
            payload = cs.encode()
            leader.apply(off, payload)
            payloads.append(payload)
            states.append(snapshot(leader))
    finally:
        leader.close()
    return payloads, states


def test_sigkill_during_apply_leaves_state_at_exactly_applied_offset(tmp_path: FsPath) -> None:
    t0 = time.monotonic()
    payloads, states = build_entries(tmp_path / "leader")
    entries_file = tmp_path / "entries.msgpack"
    entries_file.write_bytes(msgpack.packb(payloads))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": REPO}
    state_dir = tmp_path / "replica"
    rng = random.Random(99)
    kills = 0
    persisted = []
    attempts = 0
    while kills < 12 and attempts < 40 and time.monotonic() - t0 < 45:
        attempts += 1
        proc = subprocess.Popen([sys.executable, str(script), str(state_dir), str(entries_file)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # the child has opened the store and starts applying
            assert first.strip().lstrip("-").isdigit(), (first, proc.stderr.read() if proc.stderr else "")
            time.sleep(rng.uniform(0.0, 0.1))  # a full run of the remaining entries takes ~0.1 s
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        store = TaskGroupStore(state_dir, SCHEMAS, depots=DEPOTS)
        try:
            applied = store.applied_offset
            persisted.append(applied)
            got = snapshot(store)
            want = states[applied] if applied >= 0 else snapshot_empty()
            diff = [i for i in range(4) if got[i] != want[i]]
            assert got == want, f"state after kill {kills} does not match offset {applied}: parts {diff} differ"
        finally:
            store.close()
        if applied == ENTRIES - 1:  # the child finished before the kill: start over to keep killing
            shutil.rmtree(state_dir)
    print(f"kills={kills} attempts={attempts} applied offsets after reopen: {persisted}")
    assert kills >= 10, f"only {kills} kills landed mid-run"
    assert max(persisted) > 0, "nothing was ever persisted: flushes did not happen"
    # finish without interruption (from wherever the last kill left it): same state as the clean run
    proc = subprocess.Popen([sys.executable, str(script), str(state_dir), str(entries_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    store = TaskGroupStore(state_dir, SCHEMAS, depots=DEPOTS)
    try:
        assert store.applied_offset == ENTRIES - 1
        assert snapshot(store) == states[-1]
    finally:
        store.close()


def snapshot_empty() -> Any:
    return ([], [], [], (0, 0, []))
