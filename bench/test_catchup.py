"""Smoke test of bench.catchup: a ~20 MB run end to end (servers in child processes, real install), in seconds.

It checks the output contract (last stdout line is one JSON object with
positive figures), not the throughput goal: the box running tests is shared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_catchup_bench_tiny_run_prints_its_figures(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.catchup", "--quick", "--mb", "20", "--rounds", "2",
         "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("catchup_mb_per_s", "grpc_copy_mb_per_s", "ratio_vs_grpc_copy", "cp_mb_per_s", "ratio_vs_cp",
                "checkpoint_mb"):
        assert isinstance(out[key], float | int) and out[key] > 0, (key, out[key])
    assert 15 < out["checkpoint_mb"] < 30
    assert out["goal_ratio_vs_grpc_copy"] == 0.8
    assert isinstance(out["goal_met"], bool)
    assert list(tmp_path.iterdir()) == []  # the working directory is gone, servers stopped
