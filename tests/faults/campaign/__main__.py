"""``python -m tests.faults.campaign --runs N --seed S``: N runs (seeds S, S+1, ...), a table, a JSON line.

Needs root (network namespaces). Each run starts its own cluster on its own test hosts and removes it.
A failing run prints the command that replays it and keeps its folder (logs and replica files).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tests.faults.campaign.history import BATCHED_SHARE
from tests.faults.campaign.nemesis import EVERY_CLASS, POWER
from tests.faults.campaign.report import Campaign
from tests.faults.campaign.run import RunConfig, run_once
from tests.faults.campaign.selection import DEFAULT_FAULTS, parse_faults


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults.campaign", description=__doc__)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1, help="seed of the first run; run i uses seed + i")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults per run")
    p.add_argument("--clients", type=int, default=8, help="client threads appending")
    p.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                   help=f"fault classes, comma-separated, or 'all', or groups process/network/zookeeper/disk; "
                        f"known: {', '.join(EVERY_CLASS)}")
    p.add_argument("--no", default="", help="fault classes to leave out (same syntax)")
    p.add_argument("--workdir", type=Path, default=None, help="where run folders are made (default: /tmp)")
    p.add_argument("--keep", action="store_true", help="keep every run's folder, not only failing ones")
    p.add_argument("--secure", action="store_true",
                   help="run the cluster with mutual TLS, authorization and ZooKeeper digest auth (--zk-auth); the "
                        "clients append with an app certificate granted on the module")
    p.add_argument("--fsync", choices=("always", "interval"), default="always",
                   help="the module's replication.fsync; interval also injects power_loss (unless --no power_loss)")
    p.add_argument("--flush-ms", type=int, default=100, help="the module's replication.flush.ms (interval mode)")
    p.add_argument("--batched-share", type=float, default=BATCHED_SHARE,
                   help="share of client calls appending 2-4 values at once, stored as one batch (0: one a call)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kazoo", "millrace"):  # connection losses are what the nemesis causes: expected, not news
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    power = POWER if args.fsync == "interval" else ()
    faults = tuple(c for c in parse_faults(",".join([args.faults, *power])) if c not in parse_faults(args.no or "none"))
    if not faults:
        p.error("no fault class left to inject")
    campaign = Campaign()
    for i in range(args.runs):
        cfg = RunConfig(args.seed + i, args.duration, faults, args.clients, args.secure, args.fsync, args.flush_ms,
                        args.batched_share)
        try:
            result = run_once(cfg, args.workdir, args.keep)
        except Exception as e:
            campaign.crashed(cfg, e)
            continue
        campaign.add(result)
    campaign.print_table()
    print(campaign.json_line(), flush=True)
    return 0 if campaign.ok else 1


if __name__ == "__main__":
    sys.exit(main())
