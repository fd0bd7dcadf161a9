"""Millrace on several machines (issue 15's "done when"), each machine a network namespace of its own.

Three ZooKeeper servers, a conductor and three workers, each on its own host, run WordCount deployed from code
that is on no worker's path (RF=3, 20,000 sentences appended with ``ack="applied"``). Then:

* Spark: a standalone master and two Spark workers on three more hosts (started with the launcher the pyspark
  package ships), and a driver on yet another runs the microbatch topology exactly once, exports the depot to
  Delta (Delta's jars travel with the job) and scans a PState; the test queries the PStates from the host
  namespace.
* Failover: the link of a host leading a group goes down; appends to that group resume within the session
  timeout + 2 s; the link comes back, the worker rejoins every ISR, a ZooKeeper server is killed without any
  failure, and every replica of every group holds the same bytes.

Security is on, as a real deployment runs it (issue 26): a CA made by the test issues every worker a certificate
naming its host's address (an IP SAN), the conductor, an operator (admin, for the deploy and the test's probes) and
the app (granted append and query on WordCount only); every link is mutual TLS, every worker call is authorised,
and the conductor and workers authenticate to ZooKeeper with a digest (`--zk-auth`). The Spark driver and
executors read with the app's certificate (the ``tls*`` options).

The two tests share the cluster (module scope) to keep the run short; each also passes alone.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import msgpack
import pytest
from typer.testing import CliRunner

from conductor.cli import app
from conductor.client import Cluster
from conductor.client.code import CodeCache
from conductor.devcluster import ChildProcess
from conductor.metastore import GroupState, Metastore
from conductor.metastore.zk_auth import ZkPrincipal, write_principal
from conductor.runtime_env import EnvironmentBroken
from conductor.security import certs
from conductor.security.acl import APPEND, QUERY
from conductor.security.identity import Identity
from conductor.security.tls import TlsFiles, TlsSource
from conductor.spark_standalone import StandaloneCluster
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel, use_process_credentials
from conductor.zkserver import ZooKeeperEnsemble
from tests.integration.cluster_helpers import Appender, replica_state, wait_for
from tests.netns import HostNetwork, NamespacesUnavailable

pytestmark = pytest.mark.multihost

REPO = Path(__file__).resolve().parents[2]
SESSION_S = 4.0
#: A follower silent this long leaves the ISR. An applied append waits for every group its hops reach, and the
#: lost machine follows in the other groups: with the default (10 s) those would stall applied appends past the
#: session timeout + 2 s that the failover is held to.
LAG_MS = int(SESSION_S * 1000)
WORKERS = ("w1", "w2", "w3")
LABELS = ["zk1", "zk2", "zk3", "conductor", *WORKERS, "spark-master", "spark-w1", "spark-w2", "driver"]
MODULE = "WordCount"
#: WordCount's code, copied to a package only this test process has on its path
PACKAGE = "mr_multihost_wc"
MODULE_REF = f"{PACKAGE}.word_count:WordCount"
TASKS, GROUPS = 4, 2
#: the app the test appends and queries as (granted on MODULE only), and the operator that deploys and probes
APP, ADMIN = Identity("app", "multihost"), Identity("admin", "multihost")
SENTENCES = 20_000
VOCABULARY = ("the", "cat", "sat", "on", "a", "mat", "while", "seven", "quick", "foxes", "jumped", "over", "lazy",
              "dogs", "near", "old", "mills", "and", "rivers", "millrace", "water", "wheel", "turns", "grain", "into",
              "flour", "every", "morning")

#: Runs inside the driver's host: the microbatch topology (availableNow) and a scan of a PState, both on the
#: standalone cluster; prints one JSON line of what it saw. Spark waits a hard-coded
#: 10 s for a Python worker it starts to connect back, which a loaded two-core machine sometimes misses: such a
#: step is run again, from its checkpoint (which is what makes the microbatch exactly once).
DRIVER = """
import json, sys
from topology.spark import register
from topology.spark.microbatch import run_microbatch
from topology.spark.session import spark_session

from pathlib import Path
from conductor.security.tls import TlsFiles

zk, master, host, root, ca, cert, key = sys.argv[1:8]
tls = TlsFiles(Path(ca), Path(cert), Path(key))
retries = 0

def retried(step):
    global retries
    for attempt in range(4):
        try:
            return step()
        except Exception as e:
            if "Python worker failed to connect back" not in str(e) or attempt == 3:
                raise
            retries += 1
            print(f"Spark missed a Python worker's start ({attempt + 1}); running the step again", flush=True)

spark = spark_session("multihost", master=master, host=host, warehouse=root + "/warehouse")
register(spark)
retried(lambda: run_microbatch(spark, zk, "WordCount", "lengths", root + "/checkpoint",
                               trigger={"availableNow": True}, tls=tls).await_termination())
scanned = retried(lambda: spark.read.format("millrace.pstate").option("cluster", zk).option("module", "WordCount")
                  .option("pstate", "$$counts").option("tlsCa", ca).option("tlsCert", cert).option("tlsKey", key)
                  .load().count())
print(json.dumps({"counts_rows": scanned,
                  "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
                  "retries": retries}), flush=True)
spark.stop()
"""


def sentences(n: int, seed: int = 15) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(3, 5))) for _ in range(n)]


@dataclass
class MultiHost:
    net: HostNetwork
    zk: ZooKeeperEnsemble
    root: Path
    conductor: ChildProcess
    workers: dict[str, ChildProcess]
    sent: list[str]
    pki: Path

    @property
    def hosts(self) -> str:
        return self.zk.hosts

    def node_dir(self, worker: str) -> Path:
        return self.root / "nodes" / worker

    def connect(self) -> Cluster:
        """The app's client: mutual TLS with its certificate (it may append to and query MODULE only)."""
        return Cluster.connect(self.hosts, timeout_s=60, code_cache=CodeCache(self.root / "client-code"),
                               tls=TlsFiles.in_dir(self.pki, APP))

    def groups(self) -> dict[int, GroupState]:
        with Metastore(self.hosts) as ms:
            return {g: st for g, (st, _v) in ms.groups.all(MODULE).items()}

    def address(self, worker: str) -> str:
        return (self.node_dir(worker) / "node.address").read_text()

    def status(self, worker: str, group: int) -> pb.GroupStatusReply:
        with open_channel(self.address(worker)) as ch:  # the operator's certificate (use_process_credentials)
            try:
                return pbg.ClientStub(ch).GroupStatus(pb.GroupStatusRequest(module=MODULE, group=group), timeout=3)
            except grpc.RpcError:
                return pb.GroupStatusReply(role="unreachable")

    def converged(self) -> bool:
        """Every group has its full ISR and every replica applied its leader's whole log."""
        for g, st in self.groups().items():
            if st.leader is None or len(st.isr) != len(st.replicas):
                return False
            lead = self.status(st.leader, g)
            if lead.role != "leader" or lead.applied_offset + 1 != lead.log_end:
                return False
            if any((s := self.status(r, g)).log_end != lead.log_end or s.applied_offset != lead.applied_offset
                   for r in st.replicas):
                return False
        return True


def make_pki(net: HostNetwork, root: Path) -> Path:
    """A CA and every process's certificate: each worker's and the conductor's name its host's address (clients
    check it against the address they dial), the operator's and the app's name none."""
    pki = root / "pki"
    certs.init_ca_dir(pki, name="Millrace multihost test CA")
    for w in WORKERS:
        certs.issue_to_dir(pki, Identity("worker", w), hosts=[net[w].address])
    certs.issue_to_dir(pki, Identity("conductor", "c1"), hosts=[net["conductor"].address])
    for identity in (ADMIN, APP):
        certs.issue_to_dir(pki, identity)
    return pki


def security_args(root: Path) -> list[str]:
    """Mutual TLS with the certificates in root/pki, ZooKeeper digest auth with root/zk-auth."""
    return ["--tls-dir", str(root / "pki"), "--zk-auth", str(root / "zk-auth")]


def spawn_worker(net: HostNetwork, root: Path, zk_hosts: str, worker: str) -> ChildProcess:
    host = net[worker]
    # -P: not even the current folder (this repository) is on the worker's path; the module code is shipped
    return host.spawn(worker, [sys.executable, "-P", "-m", "conductor.worker", "--zk", zk_hosts, "--node-id", worker,
                               "--data-dir", str(root / "nodes" / worker), "--host", "0.0.0.0",
                               "--advertise", host.address, "--session-timeout", str(SESSION_S),
                               "--log-level", "INFO", *security_args(root)],
                      root / f"{worker}.log")


@pytest.fixture(scope="module")
def mh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    root = tmp_path_factory.mktemp("multihost")
    src = root / "src"
    (src / PACKAGE).mkdir(parents=True)
    (src / PACKAGE / "__init__.py").write_text("")
    shutil.copy(REPO / "examples" / "word_count.py", src / PACKAGE / "word_count.py")
    sys.path.insert(0, str(src))
    try:
        net = HostNetwork(LABELS).start()
    except NamespacesUnavailable as e:
        sys.path.remove(str(src))
        pytest.fail(str(e), pytrace=False)
    pki = make_pki(net, root)
    principal = ZkPrincipal.generate("millrace")
    write_principal(root / "zk-auth", principal)
    # the test process is the operator: its probes and the CLI's code shipping present the admin certificate
    use_process_credentials(TlsSource(TlsFiles.in_dir(pki, ADMIN)).grpc_channel_credentials)
    zk = ZooKeeperEnsemble(root / "zk", 3, hosts=[net[f"zk{i}"].address for i in (1, 2, 3)],
                           launch_prefixes=[net[f"zk{i}"].exec_prefix for i in (1, 2, 3)], tick_ms=200)
    try:
        try:
            zk.start(timeout_s=120)
        except EnvironmentBroken as e:
            pytest.fail(f"the ZooKeeper ensemble did not start: {e}", pytrace=False)
        with Metastore(zk.hosts, zk_auth=principal) as ms:  # (the first znodes: writable by the digest alone)
            ms.acls.grant(APP, MODULE, [APPEND, QUERY])
        conductor = net["conductor"].spawn(
            "conductor", [sys.executable, "-P", "-m", "conductor.controller", "--zk", zk.hosts, "--name", "c1",
                          "--session-timeout", str(SESSION_S), "--reconcile-interval", "1",
                          "--balance-interval", "0", "--log-level", "INFO", *security_args(root)],
            root / "conductor.log", env={"MILLRACE_CODE_CACHE": str(root / "conductor-code")})
        workers = {w: spawn_worker(net, root, zk.hosts, w) for w in WORKERS}
        for w in WORKERS:
            wait_for(lambda w=w: (root / "nodes" / w / "node.address").exists(), 120, f"worker {w} to serve")
        r = CliRunner().invoke(app, [*security_args(root), "deploy", "--module", MODULE_REF, "--tasks", str(TASKS), "--threads",
                                     str(GROUPS), "--workers", "3", "--replicationFactor", "3", "--zk", zk.hosts,
                                     "--timeout", "180", "--option", f"replication.max.time.lag.millis={LAG_MS}"])
        assert r.exit_code == 0, r.output
        m = MultiHost(net, zk, root, conductor, workers, sentences(SENTENCES), pki)
        for w in WORKERS:
            assert not (m.node_dir(w) / "examples").exists() and PACKAGE not in m.address(w)
        with m.connect() as cluster:
            offsets = cluster.depot(MODULE, "*sentences").append_many(m.sent, ack="applied")
        assert len(offsets) == SENTENCES and min(offsets) >= 0
        yield m
    finally:
        try:
            net.close()
        finally:
            zk.stop()
            use_process_credentials(None)
            sys.path.remove(str(src))
            for name in [n for n in sys.modules if n.startswith(PACKAGE)]:
                del sys.modules[name]


def expected_lengths(sent: list[str]) -> Counter[int]:
    """What WordCount's `lengths` microbatch computes, in Python: words of the JSON value by length."""
    out: Counter[int] = Counter()
    for s in sent:
        out.update(len(w) for w in re.split(r"[^a-z']+", json.dumps(s).lower()) if w)
    return out


@pytest.mark.timeout(1500)  # the cluster's start-up (module fixture) counts too; six JVMs start on two cores
def test_spark_standalone_runs_the_microbatch_topology_exactly_once(mh: MultiHost) -> None:
    net = mh.net
    spark_hosts = [net["spark-master"], net["spark-w1"], net["spark-w2"]]
    driver = net["driver"]
    out = mh.root / "driver"
    with StandaloneCluster(mh.root / "spark", master_host=spark_hosts[0].address,
                           worker_hosts=[h.address for h in spark_hosts[1:]],
                           launch_prefixes=[h.exec_prefix for h in spark_hosts], cores=1, memory="1g") as sc:
        tls = TlsFiles.in_dir(mh.pki, APP)  # (the executors read the same paths: one file system)
        run = driver.spawn("driver", [sys.executable, "-c", DRIVER, mh.hosts, sc.master_url, driver.address,
                                      str(out), str(tls.ca), str(tls.cert), str(tls.key)], mh.root / "driver.log",
                           env={"MILLRACE_CODE_CACHE": str(mh.root / "driver-code")})
        assert run.proc is not None
        assert run.proc.wait(timeout=900) == 0, run.tail(60)
        executor_logs = [p.read_text(errors="replace") for p in (mh.root / "spark").glob("spark-w*/work/*/*/stderr")]
    seen = json.loads(run.tail(200).splitlines()[-1])
    print(f"driver: {seen}")
    seen.pop("retries")
    assert seen == {"counts_rows": len(set(VOCABULARY)), "executors": 2}, "the PState scanned on the cluster"
    assert len(executor_logs) == 2, "one executor on each Spark worker"
    assert any(re.search(r"Fetching spark://[^ ]+/jars/delta-spark_", log) for log in executor_logs), \
        "Delta's jars travel with the job, from the driver to the executors"

    with mh.connect() as cluster:
        lengths = cluster.pstate(MODULE, "$$lengths")
        want = expected_lengths(mh.sent)
        assert {n: lengths.select_one(n) for n in want} == dict(want), "every batch committed exactly once"
        counts = cluster.pstate(MODULE, "$$counts")
        words = Counter(w for s in mh.sent for w in s.split())
        assert {w: counts.select_one(w) for w in words} == dict(words), "the stream topology counted every word"


def settled(mh: MultiHost, quiet_s: float = 2.0) -> bool:
    """Converged, and no replica's log grew for `quiet_s`."""
    def ends() -> dict[tuple[int, str], int]:
        return {(g, r): mh.status(r, g).log_end for g, st in mh.groups().items() for r in st.replicas}

    if not mh.converged():
        return False
    before = ends()
    time.sleep(quiet_s)
    return ends() == before and mh.converged()


def probe_append(address: str, group: int, ack: int = pb.ACK_APPLIED) -> bool:
    """One append straight to `group` at `address` (a task of the group: task g is in group g)."""
    req = pb.AppendRequest(module=MODULE, group=group, ack=ack, appends=[
        pb.DepotRecords(depot="*sentences", task=group, records=[msgpack.packb("probe after failover")])])
    with open_channel(address) as ch:  # (the operator's certificate)
        try:
            pbg.ClientStub(ch).Append(req, timeout=2)
            return True
        except grpc.RpcError:
            return False


def test_a_lost_leader_host_fails_over_rejoins_byte_identical_and_a_zookeeper_server_is_not_missed(
        mh: MultiHost) -> None:
    net = mh.net
    groups = mh.groups()
    victim = groups[0].leader
    assert victim is not None
    led = [g for g, st in groups.items() if st.leader == victim]
    with mh.connect() as cluster:
        appender = Appender(cluster.depot(MODULE, "*sentences"), window=16,
                            make=lambda n: f"failover sentence number {n}").start()
        try:
            wait_for(lambda: appender.count() > 100, 60, "appends to flow")
            down = time.monotonic()
            net.link_down(net[victim])
            deadline = down + SESSION_S + 2
            for g in led:
                new = wait_for(lambda g=g: (st := mh.groups()[g]).leader not in (None, victim) and st.leader,
                               deadline - time.monotonic(), f"a new leader of group {g}", interval_s=0.1)
                for ack in (pb.ACK_APPEND, pb.ACK_APPLIED):
                    wait_for(lambda g=g, new=new, ack=ack: probe_append(mh.address(new), g, ack),
                             deadline - time.monotonic(), f"an append (ack {ack}) to group {g} through its new "
                             f"leader {new}", interval_s=0.1)
                    print(f"group {g}: an append with ack {pb.Ack.Name(ack)} through {new} after "
                          f"{time.monotonic() - down:.2f} s")
            n = appender.count()
            wait_for(lambda: appender.count() > n + 200, 60, "the app's appends to continue")

            net.link_up(net[victim])
            wait_for(lambda: all(victim in st.isr for st in mh.groups().values()), 180,
                     f"{victim} to rejoin the ISR of every group")

            failed, epochs = appender.failed, {g: st.epoch for g, st in mh.groups().items()}
            zk_leader = mh.zk.leader()
            assert zk_leader is not None
            zk_leader.kill()
            n = appender.count()
            time.sleep(SESSION_S + 2)  # long enough for any session held by the killed server to expire, were it lost
            wait_for(lambda: appender.count() > n + 200, 60, "appends while a ZooKeeper server is down")
            assert appender.failed == failed, appender.errors[failed:]
            assert {g: st.epoch for g, st in mh.groups().items()} == epochs, "no failover: no session was lost"
            assert all(p.alive() for p in [mh.conductor, *mh.workers.values()])
        finally:
            appender.stop()
    # Background entries (outbox trims) may still follow the last append: wait until nothing changes for a while,
    # then stop every worker at once, so no replica misses the apply offset of the last entry.
    wait_for(lambda: settled(mh), 180, "every replica to apply everything, and nothing more to come")
    for p in mh.workers.values():
        p.signal(signal.SIGTERM)
    for p in mh.workers.values():
        p.stop(timeout_s=30)
    for g, st in mh.groups().items():
        states = {r: replica_state(mh.root, r, MODULE, g, module_ref=MODULE_REF) for r in st.replicas}
        first = states[st.replicas[0]]
        for r, s in states.items():
            assert (s["log_end"], s["applied"]) == (first["log_end"], first["log_end"] - 1), f"group {g} on {r}"
            assert s["replog"] == first["replog"], f"group {g}: {r}'s replog differs"
            assert s["depots"] == first["depots"], f"group {g}: {r}'s depot records differ"
