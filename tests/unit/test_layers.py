"""What importing the app client costs: none of the worker, RocksDB, the replog's disk code or Spark.

An app or a Spark executor imports ``conductor.client``; if that dragged in the
worker or RocksDB (as it once did through the gRPC options), every process would
pay for it. The import contracts in pyproject.toml forbid the imports; this
checks what a fresh interpreter actually loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("rocksdict", "replog.log", "pstate.store", "pyspark")


def test_importing_the_client_loads_no_worker_rocksdb_replog_log_or_spark() -> None:
    code = "import conductor.client, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    loaded = json.loads(out.splitlines()[-1])
    assert "conductor.client" in loaded and "conductor.client.router" in loaded
    bad = [m for m in loaded if m in FORBIDDEN or m.split(".")[0] in FORBIDDEN
           or m == "conductor.worker" or m.startswith("conductor.worker.")]
    assert bad == []
