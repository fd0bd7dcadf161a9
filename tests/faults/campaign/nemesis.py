"""The nemesis: a seeded schedule of faults, each injected, held for a while, then healed.

Every fault class is a function that injects the fault into the running cluster and returns what heals it.
Targets are chosen at injection time from what ZooKeeper says now (the leader of a random group, one of its
followers), so a seed replays the same choices of classes, timings and roles, not necessarily the same node
names. Classes are selected by name (see ``CLASSES``); the disk classes stop a follower, change its files
with the worker down, and start it again.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from conductor.metastore import Metastore
from conductor.metastore.layout import NODES_PATH
from conductor.metastore.plans import ReassignmentPlan
from tests.faults.campaign.cluster import (
    CONDUCTORS,
    FULL_DISK_WORKER,
    MODULE,
    WORKERS,
    ZOOKEEPERS,
    FaultCluster,
    wait_until,
)
from tests.faults.campaign.zkwatch import GroupRecorder
from tests.faults.power_loss import lose_machine_page_cache

Heal = Callable[[], None]

PROCESS = ("kill_worker", "pause_worker", "kill_conductor")
NETWORK = ("partition_leader", "partition_zk", "partition_split", "partition_one_way")
ZOOKEEPER = ("kill_zk", "session_expiry")
DISK = ("bitflip_replog", "bitflip_sst", "torn_tail", "lost_data", "disk_full")
#: reassignments (issue 27): not in "all" (seeds recorded before it replay unchanged); `--faults all,membership`
MEMBERSHIP = ("reassign",)
#: Every fault class of a run in the default durability mode, in the order reports list them ("all" is these
#: but MEMBERSHIP).
CLASSES = (*PROCESS, *NETWORK, *ZOOKEEPER, *DISK, *MEMBERSHIP)
#: how long a reassignment's heal waits for a plan to end before cancelling it
PLAN_WAIT_S = 90.0
#: replication.fsync=interval only (`--fsync interval` adds it): a machine losing power, its page cache with it.
#: Kept out of CLASSES so that "all" and every kept seed replay the choices they were recorded with.
POWER = ("power_loss",)
#: every class there is, in report order
EVERY_CLASS = (*CLASSES, *POWER)
#: the most a power loss cuts off one group's last segment: more than one flush interval's writes at the
#: campaign's rate (a stronger fault than the mode promises to survive; the page-cache rule treats it the same)
POWER_CUT_MAX_BYTES = 64 * 1024


class NotApplicable(Exception):
    """The fault cannot be injected in the cluster's present state (nothing to corrupt yet); `heal` undoes
    what the attempt did (restarts the follower it stopped)."""

    def __init__(self, why: str, heal: Heal) -> None:
        super().__init__(why)
        self.heal = heal


@dataclass
class Fault:
    """One injected fault, for the report and for a failing run's story."""

    cls: str
    target: str
    start: float
    end: float | None = None
    detail: str = ""

    def __str__(self) -> str:
        end = f"{self.end:6.1f}" if self.end is not None else "   ..."
        return f"{self.start:6.1f}-{end} s  {self.cls:<16} {self.target:<8} {self.detail}"


@dataclass
class Nemesis:
    """Injects faults of the `enabled` classes until `duration_s` has passed, then heals everything."""

    cluster: FaultCluster
    recorder: GroupRecorder
    rng: random.Random
    enabled: tuple[str, ...]
    now: Callable[[], float]
    faults: list[Fault] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    #: checks a heal could not make because its worker stays down until the final heal (it was cut from
    #: ZooKeeper by an overlapping fault): :meth:`heal_all` makes them once every worker is back
    after_final_heal: list[tuple[Fault, Heal]] = field(default_factory=list)

    # ---------------------------------------------------------------- schedule

    def run(self, duration_s: float) -> None:
        """The schedule: a pause, a fault held 2-8 s, its heal; sometimes a second fault overlaps the first."""
        end = self.now() + duration_s
        while not self.halt.is_set() and self.now() < end - 2:
            self.halt.wait(self.rng.uniform(0.5, 2.0))
            first = self.rng.choice(self.enabled)
            heals: list[tuple[Fault, Heal]] = [self._inject(first)]
            # sometimes a second fault overlaps the first: never a second disk fault (one follower's files at
            # a time), never the same class twice
            others = [c for c in self.enabled if c not in DISK and c != first]
            if others and self.rng.random() < 0.25:
                self.halt.wait(self.rng.uniform(0.2, 2.0))
                heals.append(self._inject(self.rng.choice(others)))
            self.halt.wait(min(self.rng.uniform(2.0, 8.0), max(0.0, end - self.now())))
            # the last injected first, but a reassignment last of all: its heal waits for its plan, and a plan
            # keeps a retired copy until the replicas it kept reconfirm their storage, which a worker another
            # fault keeps down cannot do (seed 3620 --secure waited out both plan timeouts behind a bit flip's
            # stopped worker, and failed the heal)
            for fault, heal in sorted(reversed(heals), key=lambda fh: fh[0].cls in MEMBERSHIP):
                self._heal(fault, heal)

    def _inject(self, cls: str) -> tuple[Fault, Heal]:
        fault = Fault(cls, "-", self.now())
        self.faults.append(fault)
        try:
            heal = getattr(self, cls)(fault)
        except NotApplicable as e:  # e.g. no SST file yet: counted as not injected, not an error
            fault.detail += f" (skipped: {e})"
            fault.end = self.now()
            return fault, e.heal
        except Exception as e:  # an injection that could not happen is reported, never silently dropped
            fault.detail += f" (injection failed: {type(e).__name__}: {e})"
            fault.end = self.now()
            self.errors.append(f"{cls}: {type(e).__name__}: {e}")
            return fault, lambda: None
        return fault, heal

    def _heal(self, fault: Fault, heal: Heal) -> None:
        try:
            heal()
        except Exception as e:
            fault.detail += f" (heal failed: {type(e).__name__}: {e})"
            self.errors.append(f"heal {fault.cls}: {type(e).__name__}: {e}")
        fault.end = self.now()

    def heal_all(self, timeout_s: float = 120) -> None:
        """Everything back: every path, every stopped process continued, every dead process started."""
        c = self.cluster
        c.net.heal_all()
        for p in [*c.workers.values(), *c.conductors.values()]:
            if p.alive():
                os.kill(p.pid, signal.SIGCONT)
        for name in ZOOKEEPERS:
            s = c.zk_server(name)
            if not s.alive():
                s.launch()
        for w, p in c.workers.items():
            if not p.alive():
                c.start_worker(w)
        for name, p in c.conductors.items():
            if not p.alive():
                c.start_conductor(name)
        for w in WORKERS:
            c.wait_worker(w, timeout_s)
        for fault, check in self.after_final_heal:
            self._heal(fault, check)
        self.after_final_heal.clear()

    def injected(self) -> dict[str, int]:
        """Faults injected per class (those whose injection failed are not counted)."""
        out = dict.fromkeys(EVERY_CLASS, 0)
        for f in self.faults:
            if "injection failed" not in f.detail and "(skipped" not in f.detail:
                out[f.cls] += 1
        return out

    # ---------------------------------------------------------------- targets

    def _group(self) -> int:
        return self.rng.randrange(self.cluster.settings.groups)

    def _leader(self, fault: Fault) -> str:
        """A leader (of a random group) with probability 0.8, else any worker."""
        g = self._group()
        leader = self.recorder.leader(g)
        target = leader if leader and self.rng.random() < 0.8 else self.rng.choice(WORKERS)
        fault.target = target
        fault.detail = f"group {g} leader {leader}"
        return target

    def _follower(self, fault: Fault) -> tuple[str, int]:
        g = self._group()
        followers = self.recorder.followers(g) or [w for w in WORKERS if w != self.recorder.leader(g)]
        target = self.rng.choice(sorted(followers))
        fault.target = target
        fault.detail = f"follower of group {g}"
        return target, g

    # ---------------------------------------------------------------- process faults

    def kill_worker(self, fault: Fault) -> Heal:
        w = self._leader(fault)
        self.cluster.workers[w].kill()
        return lambda: self._restart_worker(w, fault)

    def _restart_worker(self, w: str, fault: Fault) -> None:
        """A heal: :meth:`_start_again`."""
        self._start_again(w, fault)

    def _start_again(self, w: str, fault: Fault) -> bool:
        """Start `w` again; True once it runs. If it exits while starting because an overlapping fault still
        cuts it from ZooKeeper (a worker gives up after its connect timeout, as a Kafka broker does), False: the
        final heal starts it again, where a failure is an error of the run."""
        if not self.cluster.workers[w].alive():
            self.cluster.start_worker(w)
        cut_from_zk = any((w, z) in self.cluster.net.cuts for z in ZOOKEEPERS)
        try:
            self.cluster.wait_worker(w, 120)
        except RuntimeError:
            if not cut_from_zk:
                raise
            fault.detail += " (its restart failed while it was cut from ZooKeeper; started again at the final heal)"
            return False
        return True

    def pause_worker(self, fault: Fault) -> Heal:
        w = self._leader(fault)
        self.cluster.workers[w].signal(signal.SIGSTOP)
        return lambda: self.cluster.workers[w].signal(signal.SIGCONT)

    def kill_conductor(self, fault: Fault) -> Heal:
        active = self.recorder.active_conductor()
        if active not in CONDUCTORS:
            raise RuntimeError(f"no active conductor found (election says {active!r})")
        fault.target = active
        self.cluster.conductors[active].kill()

        def heal() -> None:
            if not self.cluster.conductors[active].alive():
                self.cluster.start_conductor(active)
        return heal

    # ---------------------------------------------------------------- network faults

    def _cut(self, pairs: list[tuple[str, str]], both_ways: bool = True) -> Heal:
        net = self.cluster.net
        for a, b in pairs:
            net.cut(net[a], net[b], both_ways=both_ways)

        def heal() -> None:
            for a, b in pairs:
                net.heal(net[a], net[b])
        return heal

    def partition_leader(self, fault: Fault) -> Heal:
        """A leader cut from the other workers, both ways; ZooKeeper still reaches it."""
        w = self._leader(fault)
        return self._cut([(w, o) for o in WORKERS if o != w])

    def partition_one_way(self, fault: Fault) -> Heal:
        """What a leader sends to its followers is dropped, or what they send to it."""
        w = self._leader(fault)
        outbound = self.rng.random() < 0.5
        fault.detail += " outbound" if outbound else " inbound"
        pairs = [(w, o) if outbound else (o, w) for o in WORKERS if o != w]
        return self._cut(pairs, both_ways=False)

    def partition_zk(self, fault: Fault) -> Heal:
        """A worker cut from every ZooKeeper server only (the other workers still reach it)."""
        w = self._leader(fault)
        return self._cut([(w, z) for z in ZOOKEEPERS])

    def partition_split(self, fault: Fault) -> Heal:
        """A minority (a worker, a ZooKeeper server, maybe a conductor) split from the majority."""
        w = self._leader(fault)
        minority = [w, self.rng.choice(ZOOKEEPERS)]
        if self.rng.random() < 0.5:
            minority.append(self.rng.choice(CONDUCTORS))
        majority = [h for h in (*ZOOKEEPERS, *WORKERS, *CONDUCTORS) if h not in minority]
        fault.detail += f" minority {minority}"
        return self._cut([(a, b) for a in minority for b in majority])

    # ---------------------------------------------------------------- ZooKeeper faults

    def kill_zk(self, fault: Fault) -> Heal:
        assert self.cluster.zk is not None
        leader = self.cluster.zk.leader()
        s = leader if leader is not None and self.rng.random() < 0.5 else \
            self.cluster.zk_server(self.rng.choice(ZOOKEEPERS))
        fault.target = s.data_dir.name
        fault.detail = "the ensemble's leader" if s is leader else ""
        s.kill()

        def heal() -> None:
            if not s.alive():
                s.launch()
        return heal

    def session_expiry(self, fault: Fault) -> Heal:
        """A worker's ZooKeeper session expires: cut from every server until its registration is gone."""
        w = self._leader(fault)
        path = f"{NODES_PATH}/{w}"
        owner = self.recorder.registration_owner(path)
        heal = self._cut([(w, z) for z in ZOOKEEPERS])

        def expired() -> bool:
            try:
                now = self.recorder.registration_owner(path, timeout_s=2.0)
            except Exception:
                return False  # no answer is not an expiry
            return now is None or owner is None or now != owner

        try:
            wait_until(expired, self.cluster.settings.session_timeout_s * 3 + 5, f"{w}'s session to expire")
            fault.detail += " (expired)"
        except TimeoutError:
            fault.detail += " (not seen to expire)"
        return heal

    # ---------------------------------------------------------------- disk faults (follower stopped)

    def _stopped_follower(self, fault: Fault, graceful: bool = False) -> tuple[str, int]:
        """A follower of a random group, killed (or stopped with SIGTERM: its stores flush their memtables to
        SST files, which a killed worker never wrote)."""
        w, g = self._follower(fault)
        p = self.cluster.workers[w]
        if graceful:
            p.stop(timeout_s=20)
        else:
            p.kill()
        return w, g

    def _on_stopped_follower(self, fault: Fault, files: Callable[[Path], list[Path]],
                             change: Callable[[list[Path]], None], graceful: bool = False) -> Heal:
        """Stop a follower, change its `files` (of the chosen group, else of any group that has some), restart
        it at the heal; NotApplicable (with the restart) if it has no such file yet."""
        w, g = self._stopped_follower(fault, graceful)
        heal: Heal = lambda: self._restart_worker(w, fault)  # noqa: E731
        groups = [g, *(x for x in range(self.cluster.settings.groups) if x != g)]
        for x in groups:
            found = [f for f in files(self.cluster.group_dir(w, x)) if f.is_file() and f.stat().st_size > 0]
            if found:
                if x != g:
                    fault.detail += f" (group {x}: group {g} has none)"
                change(sorted(found))
                return heal
        raise NotApplicable(f"{w} has no such file yet", heal)

    def _flip_bits(self, files: list[Path], fault: Fault) -> None:
        f = self.rng.choice(files)
        flips = self.rng.randint(1, 8)
        with open(f, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            for _ in range(flips):
                pos = self.rng.randrange(size)
                fh.seek(pos)
                byte = fh.read(1)[0]
                fh.seek(pos)
                fh.write(bytes([byte ^ (1 << self.rng.randrange(8))]))
        fault.detail += f": {flips} bit(s) in {f.parent.parent.name}/{f.parent.name}/{f.name}"

    def bitflip_replog(self, fault: Fault) -> Heal:
        return self._on_stopped_follower(fault, lambda d: list((d / "replog").glob("*.log")),
                                         lambda fs: self._flip_bits(fs, fault))

    def bitflip_sst(self, fault: Fault) -> Heal:
        return self._on_stopped_follower(fault, lambda d: list((d / "state").glob("*.sst")),
                                         lambda fs: self._flip_bits(fs, fault), graceful=True)

    def torn_tail(self, fault: Fault) -> Heal:
        """The last replog segment loses a few bytes of its end, or gains garbage (a write torn by a crash)."""
        def tear(segs: list[Path]) -> None:
            seg, size = segs[-1], segs[-1].stat().st_size
            if self.rng.random() < 0.6:
                cut = self.rng.randint(1, min(size, 300))
                os.truncate(seg, size - cut)
                fault.detail += f": {seg.parent.parent.name}/{seg.name} lost its last {cut} bytes"
            else:
                garbage = self.rng.randbytes(self.rng.randint(1, 64))
                with open(seg, "ab") as fh:
                    fh.write(garbage)
                fault.detail += f": {len(garbage)} garbage bytes after {seg.parent.parent.name}/{seg.name}"
        return self._on_stopped_follower(fault, lambda d: list((d / "replog").glob("*.log")), tear)

    def lost_data(self, fault: Fault) -> Heal:
        """A follower's whole data folder is gone (a replaced disk)."""
        w, _g = self._stopped_follower(fault)
        d = self.cluster.worker_dir(w)
        for child in d.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
        fault.detail += f": {d} emptied"
        return lambda: self._restart_worker(w, fault)

    def power_loss(self, fault: Fault) -> Heal:
        """replication.fsync=interval: a worker's machine loses power (a leader's 80% of the time). SIGKILL, then
        what the reboot does to its files (tests/faults/power_loss.py): every group's last segment loses an
        unsynced tail, the marks read as last synced, under another boot id. Only while every group keeps
        another ISR member (what the mode promises to survive: one in-sync copy keeps power). The heal
        restarts it and waits until every group it lost records its new storage incarnation (the page-cache
        rule acted: it left the ISR to rebuild from the leader, never to be elected on what it lost)."""
        if self.cluster.settings.fsync != "interval":
            raise RuntimeError("power_loss needs --fsync interval (in always mode a power loss loses nothing "
                               "acknowledged: that is torn_tail's unacknowledged tail)")
        w = self._leader(fault)
        before = self.cluster.groups()
        alone = [g for g, st in before.items() if not [m for m in st.isr if m != w]]
        if alone:
            raise NotApplicable(f"{w} is the only in-sync replica of group(s) {alone}", lambda: None)
        self.cluster.workers[w].kill()
        module_dir = self.cluster.group_dir(w, 0).parent
        losses = lose_machine_page_cache(module_dir, lambda size: self.rng.randint(1, min(size, POWER_CUT_MAX_BYTES)))
        lost = {int(x.group_dir.name): x for x in losses}
        fault.detail += ": " + (", ".join(f"group {g} replog {x.end_before}->{x.end_after} (acked {x.acked_before})"
                                          for g, x in lost.items())
                                or "nothing acknowledged from the page cache yet")

        def recorded() -> bool:
            now = self.cluster.groups()
            return all(now[g].incarnation_of(w) != before[g].incarnation_of(w) for g in lost)

        def check() -> None:
            wait_until(recorded, 60, f"{w} to record a new storage incarnation in groups {sorted(lost)} "
                                     "(the page-cache rule)")

        def heal() -> None:
            if self._start_again(w, fault):
                check()
            else:  # (seed 3750 --fsync interval: waited out its 60 s for a worker a partition kept down)
                self.after_final_heal.append((fault, check))
        return heal

    def disk_full(self, fault: Fault) -> Heal:
        """The full-disk worker's tmpfs fills up while it runs."""
        if not self.cluster.settings.tmpfs_mb:
            raise RuntimeError("the cluster has no tmpfs data folder (full-disk class off at start)")
        fault.target = FULL_DISK_WORKER
        filler = self.cluster.worker_dir(FULL_DISK_WORKER) / "filler"
        chunk = b"\0" * (1 << 20)
        with open(filler, "wb", buffering=0) as fh, contextlib.suppress(OSError):
            while fh.write(chunk):
                pass
        fault.detail = f"{filler.stat().st_size >> 20} MiB filler"
        return lambda: filler.unlink(missing_ok=True)

    # ---------------------------------------------------------------- membership (issue 27)

    def reassign(self, fault: Fault) -> Heal:
        """A group's replica (its leader half the time) removed by a reassignment plan (RF 3 -> 2) while other
        faults hit; the heal adds the worker back by a second plan (an empty replica that copies and rejoins
        the ISR). Each plan is waited for (a bounded time), then cancelled if it has not ended."""
        g = self._group()
        with self.cluster.metastore() as ms:
            st, _ = ms.groups.get(MODULE, g)
            if st.reassigning or ms.plans.get(MODULE) is not None:
                raise NotApplicable(f"group {g} is being reassigned already", lambda: None)
            victim = st.leader if st.leader and self.rng.random() < 0.5 else self.rng.choice(sorted(st.replicas))
            original = st.replicas
            ms.plans.create(MODULE, ReassignmentPlan("scale", {g: tuple(r for r in original if r != victim)},
                                                     concurrency=1))
        fault.target = victim
        fault.detail = f"group {g}: {list(original)} -> without {victim}"

        def heal() -> None:
            with self.cluster.metastore() as ms:
                fault.detail += f"; removal {self._await_plan(ms)}"
                if ms.groups.get(MODULE, g)[0].replicas != original:
                    ms.plans.create(MODULE, ReassignmentPlan("scale", {g: original}, concurrency=1))
                    fault.detail += f"; re-adding {victim} {self._await_plan(ms)}"
        return heal

    def _await_plan(self, ms: Metastore) -> str:
        """Wait for the module's plan to end (cancel it after PLAN_WAIT_S); how it ended."""
        try:
            wait_until(lambda: ms.plans.get(MODULE) is None, PLAN_WAIT_S, "the plan")
            return "completed"
        except TimeoutError:
            ms.plans.cancel(MODULE)
        wait_until(lambda: ms.plans.get(MODULE) is None, PLAN_WAIT_S, "the cancelled plan to end")
        return "cancelled"
