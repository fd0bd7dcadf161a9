"""The `conductor` CLI against real processes: ZooKeeper, a conductor and three worker nodes.

Commands run in-process through typer's CliRunner (fast, and a traceback
fails the test with the real stack); `conductor dev` runs as the installed
console script because the point there is that its processes outlive it.
Nothing is mocked: deploy waits on real leaders' GroupStatus RPCs, the
unreachable case is a SIGSTOPped node, the balance case a killed and
restarted one.

The tests of one module share a deployed `Clicks` (deploying once keeps the
file fast); `test_destroy` runs last and removes it.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from conductor.cli import app
from conductor.client import Cluster
from conductor.devcluster import DevCluster, stop_from_state
from conductor.metastore import Metastore
from conductor.security.identity import Identity
from tests.integration.cluster_helpers import write_tally_app

REPO = Path(__file__).resolve().parents[2]
DEPLOY = ["deploy", "--module", "examples.clicks:Clicks", "--tasks", "4", "--threads", "2", "--workers", "3",
          "--replicationFactor", "3"]

runner = CliRunner()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    # No periodic balancing: the balance test decides from the skew it sees whether a switch is due.
    dc = DevCluster(tmp_path_factory.mktemp("cli-cluster"), nodes=3, balance_interval=0)
    dc.start()
    try:
        yield dc
    finally:
        dc.stop()


def cli(cluster: DevCluster, *args: str, input: str | None = None) -> Result:
    """Run one `conductor` command in-process against the cluster; unexpected exceptions propagate."""
    result = runner.invoke(app, [*args, "--zk", cluster.hosts], input=input, catch_exceptions=False)
    return result


def status_json(cluster: DevCluster, module: str = "Clicks") -> dict[str, Any]:
    result = cli(cluster, "status", module, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def all_serving_with_full_isr(cluster: DevCluster) -> bool:
    st = status_json(cluster)
    return st["serving"] == len(st["groups"]) and all(len(g["isr"]) == 3 for g in st["groups"])


@pytest.fixture(scope="module")
def clicks(cluster: DevCluster) -> Result:
    """Clicks deployed through the CLI (once for the module's tests)."""
    result = cli(cluster, *DEPLOY)
    assert result.exit_code == 0, result.output
    return result


def assert_one_red_line(result: Result, *fragments: str) -> None:
    """An expected error: exit 1, one line on stderr naming the problem, no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


# ---- deploy ---------------------------------------------------------------------------------------------


def test_deploy_waits_for_serving_leaders_and_prints_a_summary(cluster: DevCluster, clicks: Result) -> None:
    out = clicks.stdout
    assert "deployed Clicks (examples.clicks:Clicks)" in out
    assert "2/2 task groups serving" in out
    # deploy returned only once every leader said so over GroupStatus, so status agrees at once
    st = status_json(cluster)
    assert [g["replica"]["role"] for g in st["groups"]] == ["leader", "leader"]


def test_deploy_errors_are_one_red_line_with_the_fix(cluster: DevCluster, clicks: Result) -> None:
    assert_one_red_line(cli(cluster, *DEPLOY), "already deployed")
    assert_one_red_line(cli(cluster, *DEPLOY[:-4], "--workers", "4", "--replicationFactor", "4"),
                        "only 3 are live", "start more worker nodes")
    assert_one_red_line(cli(cluster, *DEPLOY[:4], "1", *DEPLOY[5:]), "tasks=1", "use tasks >= threads")
    assert_one_red_line(cli(cluster, "deploy", "--module", "examples.nope:Clicks", *DEPLOY[3:]),
                        "cannot import 'examples.nope'")
    assert_one_red_line(cli(cluster, *DEPLOY, "--option", "replication.bogus=1"),
                        "unknown module option", "replication.min.isr")


def test_missing_zookeeper_address_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .millrace-dev here
    monkeypatch.delenv("MILLRACE_ZK", raising=False)
    assert_one_red_line(runner.invoke(app, ["status"]), "pass --zk", "MILLRACE_ZK", "conductor dev")


def test_zookeeper_address_from_env_then_from_the_dev_state_file(
        cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MILLRACE_ZK", cluster.hosts)
    from_env = runner.invoke(app, ["status"], catch_exceptions=False)
    assert from_env.exit_code == 0 and "3 live worker node(s)" in from_env.stdout, from_env.output

    monkeypatch.delenv("MILLRACE_ZK")
    (tmp_path / ".millrace-dev").mkdir()
    (tmp_path / ".millrace-dev" / "cluster.json").write_text(json.dumps({"zk": cluster.hosts}))
    from_file = runner.invoke(app, ["status"], catch_exceptions=False)
    assert from_file.exit_code == 0 and "3 live worker node(s)" in from_file.stdout, from_file.output


# ---- status ---------------------------------------------------------------------------------------------


def test_status_lists_modules_and_each_group(cluster: DevCluster, clicks: Result) -> None:
    overview = cli(cluster, "status")
    assert overview.exit_code == 0, overview.output
    assert "Clicks" in overview.stdout and "examples.clicks:Clicks" in overview.stdout
    assert all(n in overview.stdout for n in ("n1", "n2", "n3"))

    st = status_json(cluster)
    assert (st["tasks"], st["group_count"], st["replication_factor"], st["min_isr"]) == (4, 2, 3, 2)
    assert [g["group"] for g in st["groups"]] == [0, 1]
    for g in st["groups"]:
        assert g["leader"] in {"n1", "n2", "n3"} and g["serving"], g
        assert sorted(g["isr"]) == ["n1", "n2", "n3"] and g["osr"] == []
        assert g["tasks"] == [g["group"], g["group"] + 2]
        assert sorted(f["node"] for f in g["followers"]) == sorted(set(g["isr"]) - {g["leader"]})
        assert all(f["lag"] == 0 for f in g["followers"]), g["followers"]
    assert len({g["leader"] for g in st["groups"]}) == 2  # placement spreads the leaders

    table = cli(cluster, "status", "Clicks")
    assert table.exit_code == 0, table.output
    for header in ("group", "leader", "epoch", "ISR", "OSR", "log end", "apply offset", "follower lag"):
        assert header in table.stdout
    assert "2/2 task groups serving" in table.stdout


def test_status_shows_an_unresponsive_leader_as_unreachable(cluster: DevCluster, clicks: Result) -> None:
    leader = status_json(cluster)["groups"][0]["leader"]
    node = cluster.nodes[leader]
    node.signal(signal.SIGSTOP)  # alive for ZooKeeper (for a few seconds) but answers no RPC
    try:
        started = time.monotonic()
        result = cli(cluster, "status", "Clicks")
        took = time.monotonic() - started
    finally:
        node.signal(signal.SIGCONT)
    assert result.exit_code == 0, result.output
    assert "unreachable" in result.stdout and leader in result.stdout
    assert took < 5, f"status took {took:.1f}s; one unreachable node must cost one 2 s timeout"
    wait_for("every group serving again", lambda: all_serving_with_full_isr(cluster))


def test_status_watch_refreshes_until_ctrl_c(cluster: DevCluster, clicks: Result) -> None:
    exe = str(Path(sys.executable).parent / "conductor")
    proc = subprocess.Popen([exe, "status", "Clicks", "--watch", "--zk", cluster.hosts], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO)
    # Piped, it prints one snapshot per second: wait for the second one (a loaded machine starts the CLI
    # slowly, so a fixed sleep is not enough), then interrupt it as a person would.
    lines: list[str] = []
    stdout = proc.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
    try:
        reader.start()
        deadline = time.monotonic() + 60
        while sum("2/2 task groups serving" in line for line in list(lines)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
        reader.join(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert out.count("2/2 task groups serving") >= 2, out
    assert "Traceback" not in out


def test_status_of_unknown_module_is_a_clear_error(cluster: DevCluster) -> None:
    assert_one_red_line(cli(cluster, "status", "NoSuchModule"), "'NoSuchModule' is not deployed")


# ---- set-option / balance / destroy --------------------------------------------------------------------------


def test_set_option_validates_and_prints_old_and_new(cluster: DevCluster, clicks: Result) -> None:
    result = cli(cluster, "set-option", "Clicks", "replication.min.isr", "1")
    assert result.exit_code == 0, result.output
    assert "replication.min.isr: 2 (default) -> 1" in result.stdout
    with Metastore(cluster.hosts) as ms:
        assert ms.modules.get("Clicks")[0].options == {"replication.min.isr": "1"}

    bad_key = cli(cluster, "set-option", "Clicks", "replication.min.isrr", "1")
    assert_one_red_line(bad_key, "unknown module option 'replication.min.isrr'", "known options:",
                        "replication.min.isr", "replication.max.time.lag.millis")
    assert_one_red_line(cli(cluster, "set-option", "Clicks", "replication.min.isr", "4"),
                        "cannot exceed the replication factor 3")
    assert_one_red_line(cli(cluster, "set-option", "Clicks", "replog.segment.bytes", "1"),
                        "replog.segment.bytes", "must be between 65,536")
    assert_one_red_line(cli(cluster, "set-option", "Clicks", "replication.depot.append.timeout.millis", "500"),
                        "must exceed replication.max.time.lag.millis")
    with Metastore(cluster.hosts) as ms:  # the refused values never reached ZooKeeper
        assert ms.modules.get("Clicks")[0].options == {"replication.min.isr": "1"}


def test_trim_and_per_depot_options_and_status_shows_each_depot(cluster: DevCluster, clicks: Result) -> None:
    """`conductor set-option` takes a per-depot option, `conductor trim` moves a partition's start on every
    replica (clamped to its applied end), and `conductor status` shows the depot's offsets and sizes."""
    result = cli(cluster, "set-option", "Clicks", "depot.compaction.*raw", "1")
    assert result.exit_code == 0, result.output
    assert "depot.compaction.*raw: 0 (default) -> 1" in result.stdout
    assert_one_red_line(cli(cluster, "set-option", "Clicks", "depot.retention.bytes.*raw", "lots"),
                        "depot.retention.bytes.*raw", "must be a whole number")
    with Metastore(cluster.hosts) as ms:
        ms.modules.set_option("Clicks", "depot.compaction.*raw", "0")  # (back: *raw has no key to compact by)
    with Cluster.connect(cluster.hosts) as client:
        raw = client.depot("Clicks", "*raw")
        raw.append_many([{"id": f"t{i}"} for i in range(30)], ack="applied")
        task = max(range(4), key=lambda t: raw.partition_info(t)[1])
        end = raw.partition_info(task)[1]
        result = cli(cluster, "trim", "Clicks", "*raw", "--before", "10", "--task", str(task))
        assert result.exit_code == 0, result.output
        assert raw.partition_info(task) == (10, end)
        assert cli(cluster, "trim", "Clicks", "*raw", "--before", str(end + 100)).exit_code == 0
        assert all(s == e for s, e in (raw.partition_info(t) for t in range(4)))
    assert_one_red_line(cli(cluster, "trim", "Clicks", "*nope", "--before", "1", "--task", "0"), "*nope")
    table = cli(cluster, "status", "Clicks")
    assert table.exit_code == 0, table.output
    assert "*raw" in table.stdout and "records" in table.stdout
    depots = [d for g in status_json(cluster)["groups"] for d in g["replica"]["depots"] if d["depot"] == "*raw"]
    assert task in {d["task"] for d in depots}
    assert all(d["records"] == 0 and d["start"] == d["end"] for d in depots)


def test_balance_moves_leadership_back_after_a_failover(cluster: DevCluster, clicks: Result) -> None:
    victim = status_json(cluster)["groups"][0]["leader"]
    cluster.nodes[victim].kill()
    wait_for(f"group 0 to fail over from {victim}", lambda: status_json(cluster)["groups"][0]["leader"] != victim)
    cluster.start_node(victim)
    cluster.wait_nodes([victim])
    wait_for(f"{victim} back in every ISR", lambda: all_serving_with_full_isr(cluster))

    # The failover may have put both leaders on one node (it does with today's placement and election order).
    skewed = max(Counter(g["leader"] for g in status_json(cluster)["groups"]).values()) > 1

    result = cli(cluster, "balance", "Clicks")
    assert result.exit_code == 0, result.output
    assert ("switched" if skewed else "already balanced") in result.stdout, result.stdout
    after = status_json(cluster)
    assert max(Counter(g["leader"] for g in after["groups"]).values()) == 1, after["groups"]
    wait_for("every group serving after the switch", lambda: all_serving_with_full_isr(cluster))


def test_deploy_and_update_import_the_app_from_where_the_user_stands(cluster: DevCluster, tmp_path: Path) -> None:
    # A fresh folder holding only the app's package, outside the repository; the installed console script
    # (its sys.path[0] is its bin folder, and PYTHONPATH names only the product) must find `tallyapp` here.
    app_dir = tmp_path / "myproject"
    write_tally_app(app_dir)
    exe = str(Path(sys.executable).parent / "conductor")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def conductor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args, "--zk", cluster.hosts], capture_output=True, text=True, env=env,
                              cwd=cwd, timeout=120)

    deployed = conductor("deploy", "--module", "tallyapp.counting:Tally", "--tasks", "2", "--threads", "1",
                         "--workers", "3", "--replicationFactor", "3", cwd=app_dir)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "deployed Tally (tallyapp.counting:Tally)" in deployed.stdout
    assert "fork_posix" not in deployed.stderr and "Traceback" not in deployed.stderr, deployed.stderr
    try:
        # Elsewhere, the package is not importable unless --app-dir points at it.
        write_tally_app(app_dir, extra="# version 2\n")
        refused = conductor("update", "Tally", "--module", "tallyapp.counting:Tally", cwd=tmp_path)
        assert refused.returncode == 1 and "--app-dir" in refused.stderr, refused.stderr
        updated = conductor("update", "Tally", "--module", "tallyapp.counting:Tally", "--app-dir", str(app_dir),
                            cwd=tmp_path)
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert "Tally switched from" in updated.stdout
    finally:
        destroyed = cli(cluster, "destroy", "Tally", "--yes")
        assert destroyed.exit_code == 0, destroyed.output


def test_destroy_asks_unless_yes_and_removes_the_module(cluster: DevCluster, clicks: Result) -> None:
    declined = cli(cluster, "destroy", "Clicks", input="n\n")
    assert_one_red_line(declined, "not confirmed", "--yes")
    with Metastore(cluster.hosts) as ms:
        assert ms.modules.names() == ["Clicks"]

    result = cli(cluster, "destroy", "Clicks", "--yes")
    assert result.exit_code == 0, result.output
    assert "destroyed Clicks" in result.stdout
    with Metastore(cluster.hosts) as ms:
        assert ms.modules.names() == []
    assert_one_red_line(cli(cluster, "status", "Clicks"), "not deployed")
    assert "no modules deployed" in cli(cluster, "status").stdout


# ---- conductor dev ----------------------------------------------------------------------------------------


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child of init that nobody reaped yet is not running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_dev_starts_a_background_cluster_and_stop_ends_it(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "conductor")
    root = tmp_path / "dev"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def conductor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args, "--dir", str(root)], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=90)

    try:
        started = conductor("dev", "--nodes", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((root / "cluster.json").read_text())
        pids = [*state["zookeeper"].values(), *state["conductors"].values(), *state["nodes"].values()]
        assert len(pids) == 4
        assert all(running(p) for p in pids), "the cluster must outlive the `conductor dev` process"
        for fragment in (state["zk"], *map(str, pids), "node-n2.log", "conductor deploy", "conductor dev --stop"):
            assert fragment in started.stdout, (fragment, started.stdout)
        with Metastore(state["zk"]) as ms:
            assert ms.nodes.live() == ["n1", "n2"]

        again = conductor("dev")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already running" in again.stdout
        assert json.loads((root / "cluster.json").read_text())["nodes"] == state["nodes"]  # nothing new started

        stopped = conductor("dev", "--stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "stopped" in stopped.stdout
        assert not (root / "cluster.json").exists()
        assert [p for p in pids if running(p)] == []

        # A restart must not trip over the previous run's ZooKeeper sessions (workers would be refused).
        restarted = conductor("dev", "--nodes", "2")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        with Metastore(json.loads((root / "cluster.json").read_text())["zk"]) as ms:
            assert ms.nodes.live() == ["n1", "n2"]
    finally:
        if (root / "cluster.json").exists():
            stop_from_state(root)


def test_dev_secure_runs_with_tls_acls_and_zookeeper_auth_and_the_cli_uses_them(tmp_path: Path) -> None:
    """`conductor dev --secure`: certificates, a 0600 ZooKeeper digest file, the state file naming both, the panel
    showing how an app connects; the CLI in that folder changes the protected ACL znode with the digest by itself."""
    exe = str(Path(sys.executable).parent / "conductor")
    root = tmp_path / ".millrace-dev"  # the CLI's default folder: commands run in tmp_path find the cluster
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("MILLRACE_ZK_AUTH", None)

    def conductor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=90)

    try:
        started = conductor("dev", "--secure", "--nodes", "1", "--ui-port", "0")
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((root / "cluster.json").read_text())
        zk_auth = Path(state["zk_auth"])
        assert zk_auth == root / "zk-auth" and stat.S_IMODE(zk_auth.stat().st_mode) == 0o600
        out = " ".join(started.stdout.split())
        for fragment in ("mutual TLS on every link", "Cluster.connect(", "ZooKeeper digest auth"):
            assert fragment in out, (fragment, started.stdout)
        assert zk_auth.read_text().split(":", 1)[1].strip() not in started.stdout, "no password is shown"
        granted = conductor("acl", "grant", "app/billing", "Billing", "query")
        assert granted.returncode == 0, granted.stdout + granted.stderr
        with Metastore(state["zk"]) as ms:  # (reads need no digest)
            assert ms.acls.get()[0].granted(Identity("app", "billing"), "Billing") == {"query"}
        status = conductor("status")
        assert status.returncode == 0 and "TLS" in status.stdout, status.stdout + status.stderr
    finally:
        if (root / "cluster.json").exists():
            stop_from_state(root)
