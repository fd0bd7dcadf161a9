"""A checkpoint taken while another thread applies entries holds exactly the state at its applied offset."""

from __future__ import annotations

import threading
import time
from pathlib import Path as FsPath
from typing import Any

from pstate import P, TaskGroupStore, install
from tests.faults.test_pstate_crash import DEPOTS, SCHEMAS, build_entries, snapshot


def test_checkpoint_under_concurrent_apply_installs_exact_state(tmp_path: FsPath) -> None:
    payloads, states = build_entries(tmp_path / "leader")
    store = TaskGroupStore(tmp_path / "live", SCHEMAS, depots=DEPOTS, write_buffer_size=256 * 1024)
    errors: list[BaseException] = []

    def applier() -> None:
        try:
            for off, p in enumerate(payloads):
                store.apply(off, p)
                if off % 50 == 0:
                    time.sleep(0.001)  # let the checkpointing thread in now and then
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=applier)
    t.start()
    manifests: list[Any] = []
    try:
        i = 0
        while t.is_alive() or i == 0:
            m = store.checkpoint(tmp_path / f"cp{i}", leader_epoch=3)
            manifests.append((i, m))
            i += 1
            time.sleep(0.01)
    finally:
        t.join()
    assert not errors, errors
    store.close()
    assert len(manifests) >= 3
    offsets = {m.applied_offset for _, m in manifests}
    assert len(offsets) >= 2, "checkpoints did not overlap the writes"
    for i, m in manifests:
        dest = tmp_path / "follower" / "state"
        install(tmp_path / f"cp{i}", m, dest)
        replica = TaskGroupStore(dest, SCHEMAS, depots=DEPOTS)
        try:
            assert replica.applied_offset == m.applied_offset
            want = states[m.applied_offset] if m.applied_offset >= 0 else ([], [], [], (0, 0, []))
            assert snapshot(replica) == want
            # near-horizon catchup from there reaches the leader's final state
            for off in range(m.applied_offset + 1, len(payloads)):
                replica.apply(off, payloads[off])
            assert snapshot(replica) == states[-1]
            assert replica.select("$$counts", P.count()) == [len(states[-1][0])]
        finally:
            replica.close()
