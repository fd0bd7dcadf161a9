"""A streamed scan across a leader kill (RF=3): the broken stream goes on from its last page on the new leader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.queries import key_name, load_counts
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.testing import converged, deploy, groups_of, wait_for

TASKS, GROUPS, KEYS = 4, 2, 60_000
SESSION_TIMEOUT = 4.0


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("scan-failover") / "cluster", nodes=3,
                         session_timeout=SESSION_TIMEOUT)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_scan_of_every_task_returns_each_key_once_across_a_leader_kill(dc: DevCluster) -> None:
    deploy(dc, "bench.queries:Keys", tasks=TASKS, threads=GROUPS)
    with Cluster.connect(dc.hosts, timeout_s=60) as cluster:
        load_counts(cluster, "Keys", KEYS)
        wait_for(lambda: converged(dc, "Keys"), 60, "every replica to apply the keys")
        calls: list[str] = []
        call_sync = cluster._call_sync

        def counted(module: str, group: int, method: str, request: Any) -> Any:
            calls.append(method)
            return call_sync(module, group, method, request)

        cluster._call_sync = counted  # type: ignore[method-assign]
        seen = bytearray(KEYS)
        pages = cluster.pstate("Keys", "$$counts").scan_pages(None, page_size=100)
        for _ in range(4):  # both groups' streams open and part read
            for k, v in next(pages).items:
                assert v == int(k[1:]) and not seen[v], k
                seen[v] = 1
        victim = groups_of(dc, "Keys")[0].leader
        assert victim is not None
        dc.nodes[victim].kill()
        wait_for(lambda: groups_of(dc, "Keys")[0].leader not in (None, victim), SESSION_TIMEOUT + 10, "a new leader")
        for page in pages:  # the broken streams go on through the call loop, then stream again
            for k, v in page.items:
                assert v == int(k[1:]) and not seen[v], k
                seen[v] = 1
        assert all(seen), [key_name(i) for i, s in enumerate(seen) if not s][:5]
        assert "Scan" in calls, "a page after the kill came through the call loop (then the stream was reopened)"
