"""A checkpoint of a large memtable flushes it first without the store's lock, so the group's applies go on
(pstate.store: TaskGroupStore._flush_ahead); the files still hold exactly the applied offset they are paired with."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pstate import Map, TaskGroupStore
from pstate import store as store_mod
from pstate.checkpoint import install

SCHEMAS = {"$$counts": Map(str, int)}


def _fill(s: TaskGroupStore, first: int, entries: int, keys: int) -> int:
    for off in range(first, first + entries):
        cs = s.changes()
        cs.set_many("$$counts", [(f"k{off}-{i}-" + "x" * 40, i) for i in range(keys)])
        s.apply(off, cs.encode())
    return first + entries


def test_a_large_memtable_is_flushed_without_the_lock_and_applies_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "AHEAD_FLUSH_BYTES", 64 * 1024)
    s = TaskGroupStore(tmp_path / "lead", SCHEMAS)
    nxt = _fill(s, 0, 20, 200)  # well above the (lowered) threshold
    real = TaskGroupStore._compaction_flush
    seen: list[bool] = []  # per flush: could another thread take the store's lock (apply) meanwhile?

    def lock_free(self: TaskGroupStore) -> bool:  # from another thread: the store's lock is reentrant
        got: list[bool] = []

        def probe() -> None:
            if self._lock.acquire(blocking=False):
                self._lock.release()
                got.append(True)
        t = threading.Thread(target=probe)
        t.start()
        t.join()
        return bool(got)

    def flush_and_apply(self: TaskGroupStore) -> None:
        nonlocal nxt
        free = lock_free(self) if not seen else False
        if free:
            applied = threading.Thread(target=_fill, args=(self, nxt, 1, 3))  # an apply during the flush
            applied.start()
            applied.join(timeout=10)
            assert not applied.is_alive(), "an apply waited for the flush ahead"
            nxt += 1
        seen.append(free)
        real(self)

    monkeypatch.setattr(TaskGroupStore, "_compaction_flush", flush_and_apply)
    m = s.checkpoint(tmp_path / "cp", leader_epoch=1)
    assert seen and seen[0], seen  # the first (big) flush ran without the lock
    assert m.applied_offset == nxt - 1 == s.applied_offset  # (the apply during it is in the checkpoint too)
    install(tmp_path / "cp", m, tmp_path / "copy" / "state")
    c = TaskGroupStore(tmp_path / "copy" / "state", SCHEMAS)
    assert c.applied_offset == m.applied_offset and c.select_one("$$counts", f"k{nxt - 1}-2-" + "x" * 40) == 2
    c.close()

    # a small memtable (a later round's) goes through the lock's flush alone: no extra level-0 file (that flush
    # releases the GIL too, issue 27: RocksDB's own flush of it held the GIL through its fsyncs)
    seen.clear()
    _fill(s, nxt, 1, 3)
    s.checkpoint(tmp_path / "cp2", leader_epoch=1)
    assert seen == [False], seen
    s.close()
