"""Changing the cluster's shape while it runs (issue 27), on real processes: ZooKeeper, conductors, workers.

A writer appends with ``ack="applied"`` throughout every reassignment; no
append may fail, and every acknowledged record must be on every replica
afterwards (``assert_replicas_identical`` stops the cluster and reads each
replica's replog and depots from disk).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor import testing
from conductor.cli import app
from conductor.client import Cluster
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.module_spec import MAX_NEAR_SYNC_MESSAGE_LAG, REASSIGN_COPY_BYTES_PER_S
from tests.integration.cluster_helpers import (
    MODULE_REF,
    Appender,
    assert_replicas_identical,
    converged,
    groups_of,
    replica_state,
    wait_for,
)

SESSION_TIMEOUT = 4.0
PLAN_TIMEOUT_S = 120.0


@pytest.fixture
def dc(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    marker = request.node.get_closest_marker("cluster")
    nodes, conductors = marker.args if marker is not None else (3, 1)
    cluster = DevCluster(tmp_path / "cluster", nodes=nodes, conductors=conductors, session_timeout=SESSION_TIMEOUT,
                         balance_interval=0)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def cli(dc: DevCluster, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--zk", dc.hosts])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def plan_done(dc: DevCluster, module: str) -> bool:
    with Metastore(dc.hosts) as ms:
        return ms.plans.get(module) is None


def live_nodes(dc: DevCluster) -> set[str]:
    with Metastore(dc.hosts) as ms:
        return set(ms.nodes.sessions())


def spec_of(dc: DevCluster, module: str) -> tuple[int, int]:
    with Metastore(dc.hosts) as ms:
        spec, _ = ms.modules.get(module)
    return spec.replication_factor, spec.workers


def settled(dc: DevCluster, module: str, rf: int) -> bool:
    groups = groups_of(dc, module)
    return all(len(st.replicas) == rf and not st.reassigning and set(st.isr) == set(st.replicas)
               and st.leader is not None for st in groups.values())


@contextlib.contextmanager
def writing(dc: DevCluster, pad: int = 0, per_s: float | None = None) -> Iterator[Appender]:
    """An ``ack="applied"`` writer running throughout; afterwards no append failed and none was lost.
    ``pad``: random bytes (in hex) per record, so the replicas' stores have bytes to copy; ``per_s``: at most
    that many appends a second (None: as fast as the cluster acknowledges them)."""
    began = time.monotonic()

    def make(n: int) -> dict[str, str]:
        if per_s is not None:  # (the appender's thread makes each record just before its append)
            time.sleep(max(0.0, began + n / per_s - time.monotonic()))
        return {"user": f"u{n % 13}", "id": f"r{n}", "pad": os.urandom(pad).hex()}
    with Cluster.connect(dc.hosts, timeout_s=30) as cluster:
        appender = Appender(cluster.depot("Clicks", "*raw"), window=16, make=make).start()
        try:
            wait_for(lambda: appender.count() > 200, 30, "appends to flow")
            yield appender
            n = appender.count()
            wait_for(lambda: appender.count() > n + 200, 30, "appends to go on")
        finally:
            appender.stop()
    assert appender.failed == 0, appender.errors[:3]
    wait_for(lambda: converged(dc, "Clicks"), 60, "every replica to apply its leader's whole log")
    if pad:  # far-horizon copies: an added replica's replog starts at its checkpoint, its data is the same
        assert_same_data(dc, "Clicks", appender.acked)
    else:
        assert_replicas_identical(dc, "Clicks", appender.acked)


def assert_same_data(dc: DevCluster, module: str, acked: list[dict[str, str]]) -> None:
    """Stop the cluster; every replica of a group holds the same depot records and applied offset, and every
    acknowledged record is there."""
    groups = groups_of(dc, module)
    dc.stop()
    seen: set[str] = set()
    for g, st in groups.items():
        states = {r: replica_state(dc.root, r, module, g) for r in st.replicas}
        lead = states[st.replicas[0]]
        for r, s in states.items():
            assert (s["depots"], s["applied"], s["log_end"]) == (lead["depots"], lead["applied"], lead["log_end"]), \
                f"group {g}: replica {r} differs from {st.replicas[0]}"
        seen.update(rec["id"] for rows in lead["depots"].values() for _off, rec in rows)
    missing = [r["id"] for r in acked if r["id"] not in seen]
    assert not missing, f"{len(missing)} acknowledged record(s) lost, e.g. {missing[:5]}"


def test_rf_1_to_3_then_3_to_2_while_writing_loses_nothing(dc: DevCluster) -> None:
    testing.deploy(dc, MODULE_REF, name="Clicks", tasks=4, threads=2, replication_factor=1)
    refused = CliRunner().invoke(app, ["scale", "Clicks", "--threads", "4", "--zk", dc.hosts])
    assert refused.exit_code == 1 and "a data" in refused.output and "migration" in refused.output, refused.output
    with writing(dc) as appender:
        out = cli(dc, "scale", "Clicks", "--replicationFactor", "3", "--wait", str(PLAN_TIMEOUT_S))
        assert "task groups after the reassignment" in out, out
        assert spec_of(dc, "Clicks") == (3, 3)
        wait_for(lambda: settled(dc, "Clicks", 3), 30, "every group on 3 in-sync replicas")
        n = appender.count()
        wait_for(lambda: appender.count() > n + 200, 30, "appends to go on at RF 3")

        before = groups_of(dc, "Clicks")
        cli(dc, "scale", "Clicks", "--replicationFactor", "2", "--wait", str(PLAN_TIMEOUT_S))
        assert spec_of(dc, "Clicks") == (2, 3)
        wait_for(lambda: settled(dc, "Clicks", 2), 30, "every group on 2 in-sync replicas")
        after = groups_of(dc, "Clicks")
        for g, st in after.items():
            for gone in set(before[g].replicas) - set(st.replicas):
                gdir = dc.node_dir(gone) / "Clicks" / str(g)
                wait_for(lambda gdir=gdir: not gdir.exists(), 30, f"{gdir} (a removed replica) to be deleted")


@pytest.mark.slow
@pytest.mark.cluster(5, 1)
def test_workers_3_to_5_to_3_and_rf_3_to_5_to_3_spread_leaders(dc: DevCluster) -> None:
    testing.deploy(dc, MODULE_REF, name="Clicks", tasks=8, threads=8, replication_factor=3)  # (the helper reads tasks 0-7)
    with writing(dc):
        for workers in (5, 3):
            cli(dc, "scale", "Clicks", "--workers", str(workers), "--concurrency", "4",
                "--wait", str(PLAN_TIMEOUT_S))
            assert spec_of(dc, "Clicks") == (3, workers)
            wait_for(lambda: settled(dc, "Clicks", 3), 30, "every group on 3 in-sync replicas")
            groups = groups_of(dc, "Clicks")
            hosting = Counter(r for st in groups.values() for r in st.replicas)
            assert len(hosting) == workers and max(hosting.values()) - min(hosting.values()) <= 1, hosting
            share = math.ceil(len(groups) / workers)
            wait_for(lambda share=share: max(Counter(st.leader for st in groups_of(dc, "Clicks").values())
                                             .values()) <= share + 1, 30, f"leaders spread over {workers} workers")
            if workers == 5:  # RF 3 -> 5 -> 3 on five workers
                for rf in (5, 3):
                    cli(dc, "scale", "Clicks", "--replicationFactor", str(rf), "--concurrency", "4",
                        "--wait", str(PLAN_TIMEOUT_S))
                    assert spec_of(dc, "Clicks") == (rf, 5)
                    wait_for(lambda rf=rf: settled(dc, "Clicks", rf), 30, f"every group on {rf} in-sync replicas")


@pytest.mark.slow
@pytest.mark.cluster(4, 2)
def test_standby_conductor_finishes_a_reassignment(dc: DevCluster) -> None:
    testing.deploy(dc, MODULE_REF, name="Clicks", tasks=6, threads=6, replication_factor=1)
    with writing(dc):
        cli(dc, "scale", "Clicks", "--replicationFactor", "3", "--concurrency", "1", "--no-wait")
        wait_for(lambda: any(st.reassigning for st in groups_of(dc, "Clicks").values()), 30,
                 "the first group to start")
        with Metastore(dc.hosts) as ms:
            active = ms.conductors.contenders()[0]
        dc.conductors[active].kill()
        wait_for(lambda: plan_done(dc, "Clicks"), PLAN_TIMEOUT_S + SESSION_TIMEOUT, "the standby to finish")
        assert spec_of(dc, "Clicks") == (3, 3)
        wait_for(lambda: settled(dc, "Clicks", 3), 30, "every group on 3 in-sync replicas")


@pytest.mark.slow
@pytest.mark.cluster(4, 1)
def test_replace_dead_node_then_decommission_live_one(dc: DevCluster) -> None:
    groups = testing.deploy(dc, MODULE_REF, name="Clicks", tasks=4, threads=4, replication_factor=3)
    placed = sorted({r for st in groups.values() for r in st.replicas})
    spare = next(n for n in sorted(dc.nodes) if n not in placed)
    victim = placed[0]
    with writing(dc):
        testing.kill_worker(dc, victim)
        shutil.rmtree(dc.node_dir(victim))
        refused = CliRunner().invoke(app, ["replace-node", placed[1], "--zk", dc.hosts])
        assert refused.exit_code == 1 and "is live" in refused.output, refused.output
        wait_for(lambda: victim not in live_nodes(dc), SESSION_TIMEOUT + 10, f"{victim}'s session to expire")
        cli(dc, "replace-node", victim, "--with", spare, "--wait", str(PLAN_TIMEOUT_S))
        wait_for(lambda: settled(dc, "Clicks", 3), 30, "every group back on 3 in-sync replicas")
        assert all(victim not in st.replicas for st in groups_of(dc, "Clicks").values())

        leaving = placed[1]
        dc.start_node(victim)  # (an empty worker under the old id: it takes the decommissioned replicas)
        dc.wait_nodes([victim])
        cli(dc, "decommission", leaving, "--wait", str(PLAN_TIMEOUT_S))
        wait_for(lambda: settled(dc, "Clicks", 3), 30, "every group on 3 in-sync replicas")
        assert all(leaving not in st.replicas for st in groups_of(dc, "Clicks").values())


@pytest.mark.slow
def test_throttled_copies_and_a_cancel_that_rolls_back_what_did_not_complete(dc: DevCluster) -> None:
    # (a copy slower than the group's writes never catches up: the rate and the near-horizon window leave room;
    # the window is 200 entries: the client batches a window of async appends into few entries, and with 1,000
    # every added replica caught up by replay, no far-horizon copy to throttle. The writer is paced: unpaced, a
    # quiet box acknowledged ~0.6 KB records faster than 0.5 MB/s a group, and every copy went round after round
    # until the test gave up; 500 a second is ~80 KB/s a group, a sixth of the copy's rate)
    rate = 500_000
    testing.deploy(dc, MODULE_REF, name="Clicks", tasks=4, threads=4, replication_factor=1,
                   options={MAX_NEAR_SYNC_MESSAGE_LAG: "200", REASSIGN_COPY_BYTES_PER_S: str(rate)})
    with writing(dc, pad=300, per_s=500) as appender:
        wait_for(lambda: appender.count() > 8000, 90, "a store with bytes to copy")
        cli(dc, "scale", "Clicks", "--replicationFactor", "3", "--concurrency", "1", "--no-wait")
        wait_for(lambda: sum(len(st.replicas) == 3 and not st.reassigning
                             for st in groups_of(dc, "Clicks").values()) >= 1, 60, "a first group to complete")
        cli(dc, "scale", "Clicks", "--cancel", "--wait", str(PLAN_TIMEOUT_S))
        groups = groups_of(dc, "Clicks")
        assert not any(st.reassigning for st in groups.values())
        sizes = Counter(len(st.replicas) for st in groups.values())
        assert sizes[3] >= 1 and sizes[1] >= 1, groups  # completed groups stay; the others went back
        assert spec_of(dc, "Clicks") == (1, 1)  # a cancelled plan leaves the spec
    copies = [(float(mb), float(s)) for path in (dc.root / "logs").glob("node-*.log")
              for mb, s in re.findall(r"far-horizon catchup from \w+: installed after \d+ round\(s\), "
                                      r"([\d.]+) MB in ([\d.]+) s", path.read_text())]
    assert copies and max(mb for mb, _ in copies) >= 0.5, copies
    assert all(mb / s <= rate / 1e6 * 1.3 for mb, s in copies if mb >= 0.5), copies
