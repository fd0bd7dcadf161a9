"""Smoke test of bench.marks_fsync: a few flushes per mode end to end, in seconds.

It checks the output contract (last stdout line is one JSON object with positive figures), not the ratio: the
box running tests is shared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_marks_fsync_bench_tiny_run_prints_its_figures(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.marks_fsync", "--procs", "2", "--rounds", "2", "--flushes", "20",
         "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["procs"] == 2 and out["flushes_per_mode"] == 80
    for key in ("serial_p50_ms", "serial_p99_ms", "beside_p50_ms", "beside_p99_ms", "ratio_p50_beside_vs_serial"):
        assert isinstance(out[key], float | int) and out[key] > 0, (key, out[key])
    assert list(tmp_path.iterdir()) == []  # the working directory is gone
