"""Exactly-once microbatches: the Spark driver is SIGKILLed again and again, also between two group commits.

BankTransfer's ledger turns deposits and transfers into balance changes; after
every crash the driver restarts from its checkpoint. The final balances must
equal the exact expected ones (no double counting, nothing missing), so the
total equals the deposits: money is never created or destroyed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conductor.client import Cluster
from conductor.devcluster import DevCluster
from tests.integration.cluster_helpers import deploy, wait_for

ACCOUNTS = [f"acct{i:02d}" for i in range(16)]


def _driver(dc: DevCluster, checkpoint: Path, log_path: Path, crash_after_groups: int | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    driver = ["-m", "topology.spark.microbatch"] if crash_after_groups is None else \
        ["-m", "tests.faults.crashing_driver", "--crash-after-groups", str(crash_after_groups)]
    cmd = [sys.executable, *driver, "--zk", dc.hosts, "--module", "BankTransfer",
           "--topology", "ledger", "--checkpoint", str(checkpoint), "--available-now",
           "--max-records-per-trigger", "150"]
    with open(log_path, "ab") as logf:
        return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)  # the driver and its JVM and Python workers
    p.wait(timeout=30)


@pytest.mark.slow  # about 3 minutes of driver restarts (make test must stay under 25 minutes): `make test-all`
def test_driver_killed_repeatedly_still_commits_every_batch_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    with DevCluster(tmp_path / "cluster", nodes=3, session_timeout=4.0) as dc:
        deploy(dc, "BankTransfer", tasks=4, threads=2, module_ref="examples.bank_transfer:BankTransfer")
        expected: Counter[str] = Counter()
        with Cluster.connect(dc.hosts) as cluster:
            deposits = [{"account": a, "amount": 1000} for a in ACCOUNTS]
            transfers = []
            for _ in range(1500):
                src, dst = rng.sample(ACCOUNTS, 2)
                transfers.append({"from": src, "to": dst, "amount": rng.randint(1, 40)})
            cluster.depot("BankTransfer", "*deposits").append_many(deposits, ack="applied")
            cluster.depot("BankTransfer", "*transfers").append_many(transfers, ack="applied")
            for d in deposits:
                expected[d["account"]] += d["amount"]
            for t in transfers:
                expected[t["from"]] -= t["amount"]
                expected[t["to"]] += t["amount"]

            checkpoint = tmp_path / "checkpoint"
            log_path = tmp_path / "driver.log"
            kills = 0
            # Deterministic mid-commit crashes: the driver kills itself after the first group's commit.
            for _ in range(3):
                p = _driver(dc, checkpoint, log_path, crash_after_groups=1)
                p.wait(timeout=180)
                assert p.returncode == -signal.SIGKILL, log_path.read_text()[-3000:]
                kills += 1
            # Random kills: anywhere in start-up, reading, computing or committing.
            while kills < 11:
                p = _driver(dc, checkpoint, log_path)
                time.sleep(rng.uniform(4.0, 14.0))
                finished = p.poll() is not None
                _kill(p)
                if finished:
                    break  # it completed every batch before we could kill it
                kills += 1
            p = _driver(dc, checkpoint, log_path)
            try:
                assert p.wait(timeout=300) == 0, log_path.read_text()[-3000:]
            finally:
                _kill(p)
            assert kills >= 10

            balances = cluster.pstate("BankTransfer", "$$balances")

            def settled() -> dict[str, int]:
                return {k: v for t in range(4) for k, v in balances.scan(t)}

            got = wait_for(lambda: (b := settled()) and len(b) == len(ACCOUNTS) and b, 30, "all balances")
            assert got == dict(expected), "balances differ from the exact expected result"
            assert sum(got.values()) == 1000 * len(ACCOUNTS), "money was created or destroyed"
