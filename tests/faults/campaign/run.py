"""One run of the campaign: start the cluster, append under a seeded nemesis, heal, probe, settle, check.

A run is fully described by its `RunConfig` (seed, duration, fault classes); `RunConfig.command()` is the
command line that replays it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from conductor.client import Cluster
from tests.faults.campaign.checker import Findings, Inputs, check
from tests.faults.campaign.cluster import WORKERS, ClusterSettings, FaultCluster
from tests.faults.campaign.history import BATCHED_SHARE, Clients, History, append
from tests.faults.campaign.module import KEYS
from tests.faults.campaign.nemesis import EVERY_CLASS, POWER, Fault, Nemesis
from tests.faults.campaign.replicas import ReplicaState, applied_on_disk, read_replica
from tests.faults.campaign.zkwatch import GroupEvent, GroupRecorder

#: Client appends give up after this long (then they are `unknown`).
CLIENT_TIMEOUT_S = 10.0
#: How long a healed cluster gets to converge (every replica caught up, full ISRs) before that is a violation.
SETTLE_S = 90.0
#: Tmpfs size of the full-disk worker's data folder when that class is on.
TMPFS_MB = 192


@dataclass(frozen=True)
class RunConfig:
    seed: int
    duration_s: float
    faults: tuple[str, ...]
    clients: int = 8
    #: TLS, authorization and ZooKeeper auth on (ClusterSettings.secure)
    secure: bool = False
    #: the module's durability mode and flush interval (ClusterSettings.fsync, flush_ms)
    fsync: str = "always"
    flush_ms: int = 100
    #: the share of the clients' calls that append several values at once (history.Clients; 0: one a call, the
    #: workload before session 16)
    batched_share: float = BATCHED_SHARE

    def command(self) -> str:
        mode = f" --fsync interval --flush-ms {self.flush_ms}" if self.fsync == "interval" else ""
        return (f"python -m tests.faults.campaign --runs 1 --seed {self.seed} --duration {self.duration_s:g} "
                f"--faults {','.join(self.faults)} --clients {self.clients}{' --secure' if self.secure else ''}"
                f"{mode} --batched-share {self.batched_share:g}")


@dataclass
class RunResult:
    config: RunConfig
    findings: Findings
    faults: list[Fault]
    injected: dict[str, int]
    max_unavailable_after_heal_s: float | None
    ops: dict[str, int]
    seconds: float
    root: Path | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.findings.ok and not self.errors

    def story(self) -> list[str]:
        """What happened, for a failing run: the faults in order, then what the checker found."""
        return [*(str(f) for f in self.faults), *self.errors, *self.findings.lines()]


def _probe_keys(cluster: Cluster) -> dict[int, str]:
    """A key of `*events` for each group (so a probe reaches that group's leader)."""
    handle = cluster.depot("Campaign", "*events")
    out: dict[int, str] = {}
    for k in KEYS:
        out.setdefault(handle._route({"key": k, "id": ""})[1], k)
    return out


def _probe(cluster: Cluster, history: History, group: int, key: str, healed: float, bound_s: float,
           results: dict[int, float | None]) -> None:
    """Append to `group` until one append succeeds; the seconds from `healed` until then (None: never)."""
    n = 0
    while time.monotonic() - healed < max(60.0, 3 * bound_s):
        n += 1
        op = append(cluster, history, "probe", f"probe-{group}-{n}", "*events", key)
        if op.outcome == "ok":
            results[group] = time.monotonic() - healed
            return
        time.sleep(0.1)
    results[group] = None


def save_record(root: Path, history: History, events: list[GroupEvent], faults: list[Fault]) -> None:
    """The run's history, ZooKeeper record and faults as JSON lines beside its logs, for diagnosis."""
    with open(root / "history.jsonl", "w") as fh:
        for op in history.ops:
            fh.write(json.dumps(dataclasses.asdict(op)) + "\n")
    with open(root / "zk_events.jsonl", "w") as fh:
        for ev in events:
            fh.write(json.dumps(dataclasses.asdict(ev)) + "\n")
    (root / "faults.txt").write_text("".join(f"{f}\n" for f in faults))


def run_once(cfg: RunConfig, workdir: Path | None = None, keep: bool = False) -> RunResult:
    unknown = [c for c in cfg.faults if c not in EVERY_CLASS]
    if unknown:
        raise ValueError(f"unknown fault class(es) {unknown}; known: {', '.join(EVERY_CLASS)}")
    if cfg.fsync != "interval" and any(c in POWER for c in cfg.faults):
        raise ValueError("power_loss needs --fsync interval")
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix=f"campaign-{cfg.seed}-", dir=workdir))
    settings = ClusterSettings(tmpfs_mb=TMPFS_MB if "disk_full" in cfg.faults else 0, secure=cfg.secure,
                               fsync=cfg.fsync, flush_ms=cfg.flush_ms)
    fc = FaultCluster(root, settings)
    errors: list[str] = []
    try:
        fc.start()
        fc.deploy()
        history = History()  # times count from here: the cluster serves
        recorder = GroupRecorder(fc.zk_hosts, settings.groups, history).start()
        nemesis = Nemesis(fc, recorder, random.Random(cfg.seed), cfg.faults, history.now)
        try:
            with Cluster.connect(fc.zk_hosts, timeout_s=CLIENT_TIMEOUT_S, tls=fc.app_tls()) as client:
                clients = Clients(client, history, cfg.clients, cfg.seed, cfg.batched_share).start()
                try:
                    nemesis.run(cfg.duration_s)
                finally:
                    clients.stop(CLIENT_TIMEOUT_S + 30)
                nemesis.heal_all()
                healed = time.monotonic()
                bound = settings.session_timeout_s + 2.0
                unavailable: dict[int, float | None] = {}
                probes = [threading.Thread(target=_probe, args=(client, history, g, k, healed, bound, unavailable))
                          for g, k in _probe_keys(client).items()]
                for t in probes:
                    t.start()
                for t in probes:
                    t.join()
            try:
                converged = True
                deadline = time.monotonic() + SETTLE_S
                while not fc.converged():
                    if time.monotonic() > deadline:
                        converged = False
                        break
                    time.sleep(0.5)
            except Exception as e:
                converged = False
                errors.append(f"convergence check failed: {type(e).__name__}: {e}")
            leaders = {g: ev.leader for g, ev in recorder.latest.items()}
            members_of = {g: ev.replicas for g, ev in recorder.latest.items() if ev.replicas}
            events = list(recorder.events)
        finally:
            recorder.close()
        errors += [f"nemesis: {e}" for e in nemesis.errors]
        live = {g: fc.applied_offsets(g) for g in range(settings.groups)}
        fc.freeze_and_stop()
        replicas: dict[int, dict[str, ReplicaState]] = {}
        for g in range(settings.groups):
            # the commit point: the highest applied offset a replica reported before it stopped, or holds
            disk = [a for w in WORKERS if (a := applied_on_disk(fc.group_dir(w, g))) is not None]
            commit = max([*live[g], *disk], default=-1)
            # a worker a reassignment removed holds no replica of the group any more (its data is deleted)
            members = [w for w in WORKERS if g not in members_of or w in members_of[g]]
            replicas[g] = {w: read_replica(fc.group_dir(w, g), w, g, settings.tasks, commit) for w in members}
        findings = check(Inputs(history.ops, replicas, leaders, events, settings.min_isr, unavailable, bound,
                                converged))
        measured = [s for s in unavailable.values() if s is not None]
        result = RunResult(cfg, findings, nemesis.faults, nemesis.injected(),
                           max(measured) if len(measured) == len(unavailable) else None, history.counts(),
                           time.monotonic() - started, root, errors)
        keep = keep or not result.ok  # a failing run's files (logs, replicas) stay for its diagnosis
        if keep:
            save_record(root, history, events, nemesis.faults)
        return result
    except BaseException:
        keep = True
        raise
    finally:
        fc.close(keep_files=keep)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
