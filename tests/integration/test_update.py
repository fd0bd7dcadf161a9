"""`conductor update` on a real RF=3 cluster with a writer appending (ack="applied") throughout (issue 17).

* new topology code and a new PState: no append fails, none acknowledged is lost, every record is counted
  by exactly one version (its weight says which), records after the switch follow the new code; the
  largest gap between acknowledgements during the update is printed;
* a version whose define() raises on one worker is refused with that worker's error, the old one serves on;
* a schema migration: reads during the background rewrite are migrated, a leader killed during the rewrite
  resumes it from its cursor after restart (on the new leader), and at the end every stored value has the
  new schema; a rollback to the old schema without a migration back is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from bench.lifecycle_app import MODULE, REF, Writer, artifact
from conductor.cli import app
from conductor.cli_views import module_view
from conductor.client import Cluster
from conductor.client.code import CACHE_ENV, default_cache
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore.module_spec import (
    MAX_TIME_LAG_MS,
    MIGRATION_BATCH_INTERVAL_MS,
    MIGRATION_BATCH_KEYS,
    ModuleSpec,
)
from conductor.shipping import CodeRefused, deploy_code
from conductor.status import module_status
from conductor.updating import update_code
from pstate import Map, P, Record, TaskGroupStore
from tests.integration.cluster_helpers import converged, group_status, groups_of, wait_for
from topology.upgrade import UpdateRefused

TASKS, GROUPS = 4, 2
KEYS = 50


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[DevCluster]:
    dc = DevCluster(tmp_path / "cluster", nodes=3, session_timeout=4.0)
    dc.start()
    try:
        yield dc
    finally:
        dc.stop()


@contextlib.contextmanager
def conductor(dc: DevCluster) -> Iterator[Conductor]:
    c = Conductor(dc.hosts, "test-updater")
    c.ms.start()
    try:
        yield c
    finally:
        c.ms.close()


def deploy_v1(dc: DevCluster, options: dict[str, str] | None = None) -> None:
    with conductor(dc) as c:
        spec = ModuleSpec(name=MODULE, module_ref=REF, tasks=TASKS, threads=GROUPS, workers=3, replication_factor=3,
                          options=options or {})
        groups = deploy_code(c, spec, artifact("v1"))
    for g, st in groups.items():
        wait_for(lambda g=g, st=st: group_status(dc, st.leader, MODULE, g).role == "leader", 30,
                 f"group {g} to serve")


def update(dc: DevCluster, version: str, **kw: Any) -> Any:
    with conductor(dc) as c:
        return update_code(c, MODULE, artifact(version), REF, **kw)


def test_new_code_and_a_new_pstate_switch_with_no_failed_append(cluster: DevCluster, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "operator-cache"))
    deploy_v1(cluster)
    assert default_cache().has(artifact("v1").sha256)  # the machine that shipped it keeps it
    with Cluster.connect(cluster.hosts, timeout_s=30) as client:
        writer = Writer(client.depot(MODULE, "*events"), keys=KEYS).start()
        wait_for(lambda: len(writer.acks) > 200, 60, "the writer to get going")
        before = time.monotonic()
        result = update(cluster, "v2")
        after = time.monotonic()
        n = len(writer.acks)
        wait_for(lambda: len(writer.acks) > n + 200, 60, "appends after the switch")
        writer.stop()
        assert result.switched and result.plan.added_pstates == ["$$last"], result
        # a small artifact is put on every worker directly (none fetches it from another while serving)
        v2 = artifact("v2").sha256
        assert all((cluster.node_dir(n) / "_code" / v2 / "artifact.zip").is_file() for n in cluster.nodes)
        assert default_cache().has(v2)
        assert not writer.errors, writer.errors[:3]
        weights = Counter(a.value for a in writer.acks)
        assert set(weights) == {1, 10} and weights[10] >= 200, weights
        # each record counted by exactly one version: the counts are the sum of the weights acknowledged
        expected: Counter[str] = Counter()
        for a in writer.acks:
            expected[a.record["key"]] += a.value
        counts = client.pstate(MODULE, "$$counts")
        assert {k: counts.select_one(k) for k in expected} == dict(expected)
        # once a record is processed by v2 every later one is (one switch offset per group)
        last = client.pstate(MODULE, "$$last")
        for key in expected:
            mine = [a for a in writer.acks if a.record["key"] == key]
            switched = [a.value for a in mine]
            assert switched == sorted(switched), f"{key}: {switched}"
            assert last.select_one(key) == mine[-1].record["i"]
        gap = max(writer.gaps_ms(before, after + 0.5))
        steady = sorted(writer.gaps_ms(0, before))
        print(f"\nupdate: switch {result.switch_s * 1000:.0f} ms; largest gap between acknowledgements during it "
              f"{gap:.1f} ms (steady p99 {steady[int(len(steady) * 0.99)]:.1f} ms)")
        st = module_status_of(cluster)
        assert st["code"]["version"] == artifact("v2").sha256 and not st["code"]["switching"]
        # a rollback is an update: v1 does not declare $$last, so it needs --allow-drop
        with pytest.raises(UpdateRefused, match=r"drops \$\$last and their data; pass --allow-drop"):
            update(cluster, "v1")
        back = update(cluster, "v1", allow_drop=True)
        assert back.switched and back.plan.removed_pstates == ["$$last"]
        assert client.depot(MODULE, "*events").append_with_acks({"key": "k0", "i": -1})[1] == {"count": 1}
        assert counts.select_one("k0") == expected["k0"] + 1


def module_status_of(dc: DevCluster) -> dict[str, Any]:
    with conductor(dc) as c:
        return module_status(c.ms, MODULE)


def test_a_version_that_fails_on_one_worker_is_refused_and_the_old_one_serves(cluster: DevCluster,
                                                                             tmp_path: Path) -> None:
    deploy_v1(cluster)
    with Cluster.connect(cluster.hosts, timeout_s=30) as client:
        writer = Writer(client.depot(MODULE, "*events"), keys=KEYS).start()
        wait_for(lambda: len(writer.acks) > 50, 60, "the writer to get going")
        with pytest.raises(CodeRefused, match=r"worker n2: .*RuntimeError: n2 refuses this version") as refused:
            update(cluster, "bad")
        assert set(refused.value.refusals) == {"n2"}
        n = len(writer.acks)
        wait_for(lambda: len(writer.acks) > n + 50, 60, "appends after the refusal")
        assert {a.value for a in writer.acks} == {1}
        st = module_status_of(cluster)
        assert st["code"]["version"] == artifact("v1").sha256 and not st["code"]["switching"]
        # the same through the CLI: one red line with the worker's error; then a good version switches
        for version in ("bad", "v2"):
            (tmp_path / f"{version}.zip").write_bytes(artifact(version).data)
        bad = cli(cluster, "update", MODULE, "--module", REF, "--code", str(tmp_path / "bad.zip"))
        assert bad.exit_code == 1 and "Traceback" not in bad.output, bad.output
        assert "was not updated" in bad.stderr and "worker n2: RuntimeError: n2 refuses this version" in bad.stderr
        good = cli(cluster, "update", MODULE, "--module", REF, "--code", str(tmp_path / "v2.zip"))
        assert good.exit_code == 0 and "switched from" in good.output, good.output
        assert f"code version {artifact('v2').sha256[:12]}" in cli(cluster, "status", MODULE).output
        n = len(writer.acks)
        wait_for(lambda: len(writer.acks) > n + 50, 60, "appends after the switch")
        writer.stop()
        assert not writer.errors and {a.value for a in writer.acks} == {1, 10}


def cli(dc: DevCluster, *args: str) -> Any:
    return CliRunner().invoke(app, [*args, "--zk", dc.hosts], catch_exceptions=False)


def test_a_schema_migration_rewrites_in_the_background_across_a_leader_kill(cluster: DevCluster) -> None:
    deploy_v1(cluster, {MIGRATION_BATCH_KEYS: "10", MIGRATION_BATCH_INTERVAL_MS: "100"})
    keys = [f"m{i}" for i in range(400)]
    with Cluster.connect(cluster.hosts, timeout_s=30) as client:
        client.depot(MODULE, "*events").append_many([{"key": k, "i": 0} for k in keys], ack="applied")
        with pytest.raises(UpdateRefused, match=r"\$\$counts changed its schema .* without a new migration"):
            update(cluster, "v3_unmigrated")
        result = update(cluster, "v3")
        assert result.switched and result.plan.migrations == {"$$counts": "to-record"}
        writer = Writer(client.depot(MODULE, "*events"), keys=KEYS).start()
        counts = client.pstate(MODULE, "$$counts")
        sample = keys[::37]
        assert all(counts.select_one(k) == {"n": 1, "was": 1} for k in sample)  # migrated on read at once
        status = module_status_of(cluster)
        assert "$$counts" in status["code"]["migrations"], status["code"]
        console = Console(width=200, record=True)
        console.print(module_view(status))
        assert "migrating $$counts (to-record)" in console.export_text()
        # kill the leader of group 0 mid-rewrite; the new leader goes on from the replicated cursor
        victim = groups_of(cluster, MODULE)[0].leader
        assert victim is not None
        cluster.nodes[victim].kill()
        assert all(counts.select_one(k) == {"n": 1, "was": 1} for k in sample)
        cluster.start_node(victim)
        wait_for(lambda: not module_status_of(cluster)["code"]["migrations"], 120, "the migration to finish")
        writer.stop()
        assert not writer.errors, writer.errors[:3]
        assert all(counts.select_one(k) == {"n": 1, "was": 1} for k in keys)
        written = Counter(a.record["key"] for a in writer.acks)
        # (a retry after the leader kill may count a record twice: appends are at least once)
        assert all(counts.select_one(k)["n"] >= n for k, n in written.items())
    # the rewrite went on from its cursor: no group started over (each value rewritten once)
    groups = groups_of(cluster, MODULE)
    rewritten = 0
    for g, st in groups.items():
        assert st.leader is not None
        progress = list(group_status(cluster, st.leader, MODULE, g).migrations)
        assert [(m.pstate, m.id, m.done) for m in progress] == [("$$counts", "to-record", True)]
        rewritten += progress[0].rewritten
    assert len(keys) <= rewritten <= len(keys) + KEYS, rewritten
    # every replica of every group stores the new schema only (once the restarted one has caught up)
    wait_for(lambda: converged(cluster, MODULE), 120, "every replica to apply its leader's log")
    cluster.stop()
    schema = Map(str, Record(n=int, was=int))
    for g, st in groups.items():
        for node in st.replicas:
            store = TaskGroupStore(cluster.node_dir(node) / MODULE / str(g) / "state", {"$$counts": Map(str, int)})
            try:
                raw = store.select("$$counts", P.map_vals())  # read as stored: no migration applied
            finally:
                store.close()
            assert raw and all(isinstance(v, dict) for v in raw), (g, node, [v for v in raw if not isinstance(v, dict)][:3])
            schema.validate({f"k{i}": v for i, v in enumerate(raw)}, "$$counts")


def test_update_with_a_worker_down_switches_and_the_worker_returns_on_the_new_code(cluster: DevCluster) -> None:
    """Issue 27: a stopped worker (out of every ISR) is skipped, with a message; restarted, it runs the new code."""
    deploy_v1(cluster, {MAX_TIME_LAG_MS: "2000"})
    down = "n3"
    with Cluster.connect(cluster.hosts, timeout_s=30) as client:
        writer = Writer(client.depot(MODULE, "*events"), keys=KEYS).start()
        wait_for(lambda: len(writer.acks) > 50, 60, "the writer to get going")
        cluster.nodes[down].stop()
        wait_for(lambda: all(down not in st.isr for st in groups_of(cluster, MODULE).values()), 30,
                 f"{down} to leave every ISR")
        steps: list[str] = []
        result = update(cluster, "v2", on_step=steps.append)
        assert result.switched, result
        assert any(s.startswith(f"skipping {down}: not live and in no ISR") for s in steps), steps
        cluster.start_node(down)
        cluster.wait_nodes([down])
        wait_for(lambda: all(down in st.isr for st in groups_of(cluster, MODULE).values()), 60,
                 f"{down} to rejoin every ISR")
        v2 = artifact("v2").sha256
        assert (cluster.node_dir(down) / "_code" / v2 / "artifact.zip").is_file()
        wait_for(lambda: all(group_status(cluster, down, MODULE, g).code_version == v2 for g in range(GROUPS)),
                 30, f"{down}'s replicas to apply the switch")
        n = len(writer.acks)
        wait_for(lambda: len(writer.acks) > n + 50, 60, "appends after the worker's return")
        writer.stop()
        assert not writer.errors, writer.errors[:3]
