"""A replica reopened while ZooKeeper is away still learns its group's state (campaign seed 3604)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conductor.metastore import MetastoreError
from conductor.worker import recovery
from conductor.worker.hosted import HostedReplica
from conductor.worker.recovery import ReplicaRecovery
from replog.messages import MetastoreChanged


class _Groups:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.reads = 0

    def get(self, module: str, group: int) -> tuple[str, int]:
        self.reads += 1
        if self.reads <= self.failures:
            raise MetastoreError("the session is lost")
        return f"state of {module}/{group}", 7


def test_a_reopened_replica_is_told_its_group_state_once_zookeeper_answers_again(tmp_path: Path,
                                                                                 monkeypatch: Any) -> None:
    # the group watch reports changes only: a group whose state did not change while the session was lost
    # would never tell a replica reopened meanwhile who leads it, and it would never catch up
    monkeypatch.setattr(recovery, "STATE_RETRY_S", 0.01)
    groups = _Groups(failures=3)
    metastore = SimpleNamespace(closed=False, groups=groups)
    posted: list[Any] = []
    host = SimpleNamespace(closed=threading.Event(), post=posted.append)
    rec = HostedReplica("M", 2, ("w1", "w2", "w3"))
    rec.host = host  # type: ignore[assignment]
    rt = SimpleNamespace(spec=SimpleNamespace(name="M"))
    r = ReplicaRecovery("w3", tmp_path, metastore, None, lambda *_: None)  # type: ignore[arg-type]
    r._tell_state(rt, rec, host)  # type: ignore[arg-type]
    deadline = time.monotonic() + 5
    while not posted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(m) for m in posted] == [MetastoreChanged] and posted[0].state == "state of M/2"
    assert groups.reads == 4
    time.sleep(0.05)
    assert len(posted) == 1  # told once, no more reads
    # a replica replaced or closed meanwhile is not told (nor read for)
    host2 = SimpleNamespace(closed=threading.Event(), post=posted.append)
    host2.closed.set()
    r._tell_state(rt, rec, host2)  # type: ignore[arg-type]
    assert len(posted) == 1 and groups.reads == 4
