"""A reassignment under load: replication factor 1 -> 3 while an ``ack="applied"`` writer appends (issue 27).

    python -m bench.reassign [--quick] [--dir PATH] [--copy-rate BYTES_PER_S] [--rounds N]
    (bench.lifecycle runs it too and reports its figures)

One :class:`~conductor.devcluster.DevCluster` (three workers, plaintext) and the
module of :mod:`bench.lifecycle_app` at ``v1``, deployed with replication
factor 1 and filled with incompressible records (``--quick``: 24 MB of random bytes,
hex-encoded: about 24 MB in each of the two task groups; else four times as
much) so the two replicas the scale adds copy the leader's store by far horizon
(``replication.max.near.sync.message.lag`` is lowered so that they do). Then:

* ``steady``: one writer appends one record at a time; ``steady_p99_ms`` is the
  p99 of the gaps between its acknowledgements (at RF 1; ``rf3_after_p99_ms``,
  the same after the scale, shows what RF 3 itself costs an append);
* ``beside a plain copy``: the same bytes the plan will copy (a file of each group's size to each of the two
  followers to be) through a plain paced gRPC copy between processes of their own, at the throttle's rate per
  follower (:mod:`bench.paced_copy`), the writer still at RF 1: ``writer_p99_beside_plain_copy_vs_steady`` is
  what moving those bytes on this one box costs any design (on separate machines the followers' disks and
  cores would not be the leader's), and ``box_floor_during_vs_steady`` that floor and RF 3's own together;
* the reassignment: a plan to replication factor 3 (what `conductor scale
  --replicationFactor 3` stores), timed until the conductor deleted it
  (``rf1_to_rf3_s``), with the copy throttle at its default
  (``reassignment.copy.bytes.per.second``, a budget each worker's copies of
  the module share; ``--copy-rate`` sets it instead);
  ``writer_p99_during_reassign_vs_steady`` is the writer's p99 during it over
  the steady one (goal <= 2.0);
* ``reassign_copy_mb_per_s``: what the reassignment's far-horizon copies moved
  (every copy's MB, from the workers' logs) over the wall time from the first
  copy's start to the last one's install: throttled, and several at once
  (``reassign_copy_per_copy_mb_per_s``: each copy's MB over its own seconds);
* the copy path against its peer, same run, same cluster (writer stopped),
  alternately ``--rounds`` times: a far-horizon copy of group 0 through the
  leader worker's own ``FetchCheckpoint`` (a fresh checkpoint, the chunk
  stream) into the production :class:`~conductor.worker.far_horizon.Catchup`
  (CRC32C per file, fsync) and :func:`pstate.checkpoint.install`, **unthrottled**
  (``copy_path_mb_per_s``), then exactly the files of that checkpoint through
  a plain gRPC file stream (:func:`bench.catchup.grpc_copy`: raw messages of the
  same 2 MiB, the same plaintext channel options, fsync per file; no manifest,
  no checksum, no install) from a server process on the same machine
  (``plain_grpc_mb_per_s``); ``ratio_copy_vs_plain_grpc`` is the median of
  the per-round ratios (goal >= 0.8). Throttled copies are not compared with
  an unthrottled stream: the throttle's rate is the operator's choice, so
  ``ratio_reassign_copy_vs_plain_grpc`` (the reassignment's own rate over the
  plain one) is shown for context only.

Prints a table and, as the last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.catchup import ServerProcess, grpc_copy
from bench.floor import percentile
from bench.lifecycle_app import MODULE, REF, Writer, artifact
from bench.paced_copy import beside_plain_copy, make_files
from bench.unwind import unwind_on
from conductor.client import Cluster
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.metastore.module_spec import (
    DEFAULT_REASSIGN_COPY_BYTES_PER_S,
    MAX_NEAR_SYNC_MESSAGE_LAG,
    REASSIGN_COPY_BYTES_PER_S,
    ModuleSpec,
)
from conductor.plan_builder import scale_plan
from conductor.shipping import deploy_code
from conductor.status import wait_serving
from conductor.wire.options import GRPC_OPTIONS
from conductor.worker.far_horizon import Catchup
from pstate.checkpoint import Checked, Manifest, install

GOAL_P99_RATIO = 2.0
GOAL_COPY_RATIO = 0.8
_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) WARNING millrace\.far_horizon: [\w$]+/(\d+): "
COPY_START = re.compile(_STAMP + r"far-horizon catchup from \w+ \(.*\) started$", re.M)
COPY_LINE = re.compile(_STAMP + r"far-horizon catchup from \w+: installed after \d+ round\(s\), ([\d.]+) MB in ([\d.]+) s",
                       re.M)
#: a group's ISR as the leader records it (an added replica joined once it lists more than one)
ISR_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ WARNING millrace\.node: [\w$]+/\d+: ISR now \[([^\]]*)\]",
                      re.M)
PAD_BYTES = 2000  #: random bytes (hex: twice as many characters) per filler record
#: filler records per request (one replog entry per group each): enough entries for a far-horizon copy
FILL_BATCH = 20
#: the near-horizon window: a replica further behind copies the leader's store
NEAR_LAG = 100
#: the seconds after the plan's end in which its leader rebalancing falls (max_gap_after_plan_ms)
HANDOFF_WINDOW_S = 3.0
#: seconds between the plain copy's end and the plan (the writer back at its steady pace)
PLAIN_SETTLE_S = 1.0
PROBE = "bench-probe"  #: the follower id the copy-path probe asks the leader's checkpoints for


def deploy_rf1(hosts: str, copy_rate: int | None) -> None:
    c = Conductor(hosts, "bench-reassign")
    c.ms.start()
    try:
        options = {MAX_NEAR_SYNC_MESSAGE_LAG: str(NEAR_LAG)}
        if copy_rate is not None:
            options[REASSIGN_COPY_BYTES_PER_S] = str(copy_rate)
        spec = ModuleSpec(name=MODULE, module_ref=REF, tasks=4, threads=2, workers=1, replication_factor=1,
                          options=options)
        deploy_code(c, spec, artifact("v1"))
        wait_serving(c.ms, MODULE, timeout_s=60)
    finally:
        c.ms.close()


def fill(client: Cluster, megabytes: int) -> int:
    """Incompressible filler records, in batches; how many."""
    depot = client.depot(MODULE, "*events")
    n, per_batch = 0, FILL_BATCH
    while n * PAD_BYTES < megabytes * 1e6:
        depot.append_many([{"key": f"fill{(n + i) % 50}", "i": -1, "pad": os.urandom(PAD_BYTES).hex()}
                           for i in range(per_batch)])
        n += per_batch
    return n


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def copies(logs: Path) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    """(MB, seconds) of every far-horizon copy the workers' logs report installed, and the wall-clock times of
    the first copy's start and the last one's install."""
    text = "\n".join(p.read_text() for p in logs.glob("node-*.log"))
    done = COPY_LINE.findall(text)
    starts = [_stamp(t) for t, _node, _g in COPY_START.findall(text)]
    span = (min(starts), max(_stamp(t) for t, *_ in done)) if done and starts else (float("nan"), float("nan"))
    return [(float(mb), float(s)) for _t, _node, _g, mb, s in done], span


def first_isr_join(logs: Path) -> float:
    """The wall-clock time an added replica first joined an ISR (the module is at RF 1 before), nan if none did."""
    text = "\n".join(p.read_text() for p in logs.glob("node-*.log"))
    joins = [_stamp(t) for t, isr in ISR_LINE.findall(text) if "," in isr]
    return min(joins) if joins else float("nan")


def mixed_p99(rf1: list[float], rf3: list[float], n_rf1: int, n_rf3: int) -> float:
    """The p99 of a window of ``n_rf1`` gaps distributed as ``rf1`` and ``n_rf3`` distributed as ``rf3``."""
    weighted = sorted([(g, n_rf1 / len(rf1)) for g in rf1] + [(g, n_rf3 / len(rf3)) for g in rf3])
    total, seen = n_rf1 + n_rf3, 0.0
    for gap, weight in weighted:
        seen += weight
        if seen >= 0.99 * total:
            return gap
    return weighted[-1][0]


def scale_under_writer(dc: DevCluster, megabytes: int, steady_s: float, rate: int, work: Path) -> dict[str, Any]:
    """Fill at RF 1, then steady / a plain copy / scale to RF 3 / after, one writer throughout; the writer's figures.

    Context for the goal's figure (the p99 of the whole reassignment over the steady one at RF 1): once an added
    replica joins the ISR, appends wait for it, so part of the window runs at RF 3's own cost
    (``writer_p99_during_vs_rf3_after``); ``copying_p99_ms`` is the p99 while the far-horizon copies ran (from
    the first one's start to the last one's install, as the workers' logs date them), the throttle's own window.
    ``max_gap_after_plan_ms``: the largest gap in the seconds after the plan, when its leaders are rebalanced.
    ``rf3_floor_during_vs_steady``: what the figure would be if nothing but the replication factor cost the writer
    anything: the window's appends up to the first ISR join as the steady ones, those after it as the ones at RF 3
    after the plan (their p99 over the steady one; the part of the window at RF 3 is what the plan adds).
    ``writer_p99_beside_plain_copy_vs_steady``: the writer's p99 at RF 1 while the bytes the plan copies (a file
    of each group's size to each of the two added followers, at ``rate`` per follower) go through a plain paced
    gRPC copy between processes of their own (:mod:`bench.paced_copy`), before the plan; what moving them costs
    on this box whatever the design. ``box_floor_during_vs_steady`` puts both floors together: the window's
    appends before the first ISR join as those beside the plain copy, those after it as those at RF 3 after.
    """
    files = work / "plain-source"
    make_files(files, [megabytes] * 2)  # (each group's store is about `megabytes` MB)
    with Cluster.connect(dc.hosts, timeout_s=30) as client:
        filled = fill(client, megabytes)
        os.sync()  # no writeback of the fill or the files inside the timed phases
        writer = Writer(client.depot(MODULE, "*events")).start()
        time.sleep(1.0)
        steady_from = time.monotonic()
        time.sleep(steady_s)
        steady_to = time.monotonic()
        plain_from, plain_to = beside_plain_copy(files, work / "plain", receivers=2, rate=rate)
        time.sleep(PLAIN_SETTLE_S)
        plan_from = time.monotonic()
        with Metastore(dc.hosts) as ms:
            ms.plans.create(MODULE, scale_plan(ms, MODULE, replication_factor=3))
            while ms.plans.get(MODULE) is not None:
                time.sleep(0.05)
            done = time.monotonic()
        time.sleep(steady_s)  # the writer at RF 3 (context: the append path itself now waits for followers)
        after_to = time.monotonic()
        writer.stop()
    steady = sorted(writer.gaps_ms(steady_from, steady_to))
    plain = sorted(writer.gaps_ms(plain_from, plain_to))
    during = sorted(writer.gaps_ms(plan_from, done))
    after = sorted(writer.gaps_ms(done + 0.5, after_to))
    wall = time.time() - time.monotonic()  # the logs' clock minus the writer's
    _copied, (first, last) = copies(dc.root / "logs")
    copying = sorted(writer.gaps_ms(first - wall, last - wall))
    n_rf1 = len(writer.gaps_ms(plan_from, first_isr_join(dc.root / "logs") - wall))
    floor = mixed_p99(steady, after, n_rf1, len(during) - n_rf1) / mixed_p99(steady, after, len(during), 0)
    box_floor = mixed_p99(plain, after, n_rf1, len(during) - n_rf1) / mixed_p99(steady, after, len(during), 0)
    p99_steady, p99_during, p99_after = percentile(steady, 99), percentile(during, 99), percentile(after, 99)
    # once the plan is deleted the conductor rebalances leaders: a hand-off the writer sees as one long gap
    handoff = writer.gaps_ms(done, done + HANDOFF_WINDOW_S)
    window = writer.gap_times(plan_from, done)
    top = slowest(window)
    phases = [("before the copies", plan_from), ("copying", first - wall), ("after the installs", last - wall)]
    return {"filler_records": filled, "rf1_to_rf3_s": round(done - plan_from, 2),
            "max_gap_after_plan_ms": round(max(handoff), 1) if handoff else float("nan"),
            "steady_p99_ms": round(p99_steady, 2), "reassign_p99_ms": round(p99_during, 2),
            "rf3_after_p99_ms": round(p99_after, 2), "reassign_appends": len(during),
            "copying_p99_ms": round(percentile(copying, 99), 2) if copying else float("nan"),
            "failed_appends": len(writer.errors),
            "writer_p99_during_reassign_vs_steady": round(p99_during / p99_steady, 3),
            "writer_p99_during_vs_rf3_after": round(p99_during / p99_after, 3),
            "rf3_floor_during_vs_steady": round(floor, 3), "rf3_share_of_window": round(1 - n_rf1 / len(during), 3),
            "plain_copy_s": round(plain_to - plain_from, 2), "plain_copy_p99_ms": round(percentile(plain, 99), 2),
            "writer_p99_beside_plain_copy_vs_steady": round(percentile(plain, 99) / p99_steady, 3),
            "box_floor_during_vs_steady": round(box_floor, 3),
            "slowest_by_phase": slowest_by_phase(window, top, phases, done, 2 * p99_steady),
            #: the window's slowest 1%: (seconds from the plan's start, ms), in time order
            "slowest_at": sorted((round(at - plan_from, 3), round(ms, 1)) for at, ms in top)}


def slowest(gaps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The slowest 1% of the gaps ``(end, ms)`` (at least one): the figure's p99 is about the last of them."""
    return sorted(gaps, key=lambda g: g[1], reverse=True)[:max(1, len(gaps) // 100)]


def slowest_by_phase(gaps: list[tuple[float, float]], top: list[tuple[float, float]], phases: list[tuple[str, float]],
                     end: float, over_ms: float) -> dict[str, dict[str, Any]]:
    """Where the window's slowest appends fell: of the gaps ``(end, ms)`` in the window's slowest 1% (``top``,
    :func:`slowest`) and of those over ``over_ms`` (twice the steady p99: the goal's bound), how many ended in each phase (``phases``: a name
    and the time it starts, in order; the last one lasts until ``end``), with the phase's seconds and its
    slowest gap. The figure's p99 is about the window's ``len // 100``-th slowest gap, so these say which of the
    plan's steps set it."""
    bounds = [start for _name, start in phases[1:]] + [end]
    out: dict[str, dict[str, Any]] = {}
    for (name, start), stop in zip(phases, bounds, strict=True):
        in_phase = [ms for at, ms in gaps if start <= at < stop]
        out[name] = {"s": round(stop - start, 2), "appends": len(in_phase),
                     "in_top_1pct": sum(1 for at, _ in top if start <= at < stop),
                     "over_bound": sum(1 for ms in in_phase if ms > over_ms),
                     "max_ms": round(max(in_phase), 1) if in_phase else None}
    return out


def probe_copy(ms: Metastore, work: Path) -> tuple[float, Manifest, Path]:
    """One unthrottled far-horizon copy of group 0 from its leader worker into ``work``: seconds (start to
    installed), the checkpoint's manifest, and the installed directory."""
    st, _version = ms.groups.all(MODULE)[0]
    assert st.leader is not None, st
    info = ms.nodes.get(st.leader)
    assert info is not None, st.leader
    got: dict[str, Any] = {}

    def install_fn(staging: Path, m: Manifest, pairs: list[tuple[int, int]], checked: Checked) -> str | None:
        got["manifest"], got["dir"] = m, Path(install(staging, m, work / "store", checked))
        got["end"] = time.perf_counter()
        return None

    c = Catchup(PROBE, MODULE, 0, PROBE, st.leader, info.address, st.epoch, work / "staging", NEAR_LAG, install_fn,
                channel_options=GRPC_OPTIONS)
    t0 = time.perf_counter()
    c.start()
    c.thread.join(300)
    if c.outcome != "installed":
        raise RuntimeError(f"the probe's far-horizon copy ended {c.outcome!r}")
    return got["end"] - t0, got["manifest"], got["dir"]


def copy_path_vs_plain(dc: DevCluster, work: Path, rounds: int) -> dict[str, Any]:
    """``rounds`` times: the production copy path (unthrottled), then the plain stream of the same files."""
    logging.getLogger("millrace.far_horizon").setLevel(logging.ERROR)  # (its start/end lines, per round)
    probe_s: list[float] = []
    plain_s: list[float] = []
    mb = 0.0
    with Metastore(dc.hosts) as ms:
        for r in range(rounds):
            os.sync()  # no writeback left over from the previous copy inside this one
            seconds, manifest, installed = probe_copy(ms, work / f"probe-{r}")
            probe_s.append(seconds)
            flat = work / f"flat-{r}"  # exactly the checkpoint's files, nothing else
            flat.mkdir()
            for f in manifest.files:
                os.link(installed / f.name, flat / f.name)
            mb = manifest.total_bytes() / 1e6
            server = ServerProcess("raw", flat, work / f"shelf-{r}")
            try:
                os.sync()
                plain_s.append(grpc_copy(server.address, work / f"plain-{r}"))
            finally:
                server.stop()
            shutil.rmtree(work / f"probe-{r}")
            shutil.rmtree(work / f"plain-{r}")
            shutil.rmtree(flat)
    return {"probe_mb": round(mb, 1),
            "copy_path_mb_per_s": round(mb / statistics.median(probe_s), 1),
            "plain_grpc_mb_per_s": round(mb / statistics.median(plain_s), 1),
            "ratio_copy_vs_plain_grpc": round(statistics.median(p / c for c, p in zip(probe_s, plain_s, strict=True)),
                                              3),
            "probe_rounds": rounds}


def measure(root: Path, quick: bool, copy_rate: int | None = None, rounds: int | None = None) -> dict[str, Any]:
    steady_s, megabytes = (4.0, 24) if quick else (15.0, 96)
    dc = DevCluster(root / "cluster", nodes=3, session_timeout=6.0, balance_interval=0)
    dc.start()
    try:
        deploy_rf1(dc.hosts, copy_rate)
        out = scale_under_writer(dc, megabytes, steady_s, copy_rate or DEFAULT_REASSIGN_COPY_BYTES_PER_S,
                                 root / "plain-copy")
        copied, (first, last) = copies(dc.root / "logs")
        out |= copy_path_vs_plain(dc, root / "probe", rounds or (5 if quick else 7))
    finally:
        dc.stop()
    copy_mb, copy_s = sum(m for m, _ in copied), sum(s for _, s in copied)
    span = last - first
    rate = copy_mb / span if span > 0 else float("nan")
    out |= {
        "copy_rate_option": copy_rate or DEFAULT_REASSIGN_COPY_BYTES_PER_S, "far_horizon_copies": len(copied),
        "reassign_copy_mb": round(copy_mb, 1), "reassign_copy_s": round(span, 3),
        "reassign_copy_mb_per_s": round(rate, 1),
        "reassign_copy_per_copy_mb_per_s": round(copy_mb / copy_s, 1) if copy_s else float("nan"),
        "ratio_reassign_copy_vs_plain_grpc": round(rate / out["plain_grpc_mb_per_s"], 3),
    }
    out["goal_met"] = (out["writer_p99_during_reassign_vs_steady"] <= GOAL_P99_RATIO
                       and out["ratio_copy_vs_plain_grpc"] >= GOAL_COPY_RATIO and out["failed_appends"] == 0)
    return out


def table(r: dict[str, Any]) -> Table:
    t = Table(title=f"RF 1 -> 3 under an ack=applied writer: {r['rf1_to_rf3_s']} s, {r['failed_appends']} failed "
                    f"appends", title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("goal")
    t.add_row("writer p99 steady (RF 1) / during / after (RF 3), ms",
              f"{r['steady_p99_ms']} / {r['reassign_p99_ms']} / {r['rf3_after_p99_ms']}", "")
    t.add_row("writer p99 during / steady", str(r["writer_p99_during_reassign_vs_steady"]), f"<= {GOAL_P99_RATIO}")
    t.add_row(f"  floors: beside a plain paced copy of the same bytes ({r['plain_copy_s']} s, p99 "
              f"{r['plain_copy_p99_ms']} ms) / RF 3 alone / both",
              f"{r['writer_p99_beside_plain_copy_vs_steady']} / {r['rf3_floor_during_vs_steady']} / "
              f"{r['box_floor_during_vs_steady']}", "")
    t.add_row("writer p99 while copying, ms; during / after (RF 3's own cost)",
              f"{r['copying_p99_ms']}; {r['writer_p99_during_vs_rf3_after']}", "")
    t.add_row(f"reassignment's {r['far_horizon_copies']} copies at the throttle "
              f"({r['copy_rate_option'] / 2**20:g} MiB/s per worker), MB/s",
              f"{r['reassign_copy_mb_per_s']} ({r['reassign_copy_mb']} MB in {r['reassign_copy_s']} s)", "")
    t.add_row(f"copy path unthrottled / plain gRPC, MB/s ({r['probe_mb']} MB, median of {r['probe_rounds']})",
              f"{r['copy_path_mb_per_s']} / {r['plain_grpc_mb_per_s']}", "")
    t.add_row("copy path / plain gRPC", str(r["ratio_copy_vs_plain_grpc"]), f">= {GOAL_COPY_RATIO}")
    for name, p in r["slowest_by_phase"].items():
        t.add_row(f"  {name}: {p['s']} s, {p['appends']} appends; of the slowest 1% / over 2x steady p99 / max ms",
                  f"{p['in_top_1pct']} / {p['over_bound']} / {p['max_ms']}", "")
    return t


def main() -> None:
    unwind_on()  # a kill stops the processes this starts (bench.unwind)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 24 MB store and a short steady phase")
    ap.add_argument("--dir", type=Path, default=None, help="where the cluster lives (default: a temp dir)")
    ap.add_argument("--copy-rate", type=int, default=None,
                    help=f"the module's {REASSIGN_COPY_BYTES_PER_S} (default: the option's default)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="copy path / plain gRPC rounds (5 quick, else 7; the ratio is their median)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-reassign-"))
    try:
        r = measure(root, args.quick, args.copy_rate, args.rounds)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    Console().print(table(r))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
