"""The pytest plugin for apps: an app's own test, in a folder outside the repository, runs against a real
RF=3 cluster through the plugin's fixtures and survives killing a group's leader.

The example test below is the README's (keep them the same). The plugin is loaded with ``-p`` here because the
dev virtualenv's entry points may predate it; an installed wheel loads it through ``pytest11`` by itself.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.cluster_helpers import write_tally_app

REPO = Path(__file__).resolve().parents[2]

EXAMPLE_TEST = '''import pytest
from conductor.testing import kill_worker, restart_worker, wait_for_leader


@pytest.mark.millrace_module("tallyapp.counting:Tally", tasks=2, threads=1)
def test_counts_survive_losing_the_leader(millrace_app, millrace_cluster):
    millrace_app.depot("Tally", "*words").append("mill")
    leader = wait_for_leader(millrace_cluster, "Tally", group=0)
    kill_worker(millrace_cluster, leader)
    wait_for_leader(millrace_cluster, "Tally", group=0, not_on=leader)
    millrace_app.depot("Tally", "*words").append("mill")
    assert millrace_app.pstate("Tally", "$$counts").select_one("mill") == 2
    restart_worker(millrace_cluster, leader)
'''


def test_an_apps_test_runs_against_a_real_rf3_cluster_from_outside_the_repository(tmp_path: Path) -> None:
    project = tmp_path / "myproject"
    write_tally_app(project)
    (project / "tests").mkdir()
    (project / "tests" / "test_tally.py").write_text(EXAMPLE_TEST)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    installed = any(e.value == "conductor.pytest_plugin" for e in importlib.metadata.entry_points(group="pytest11"))
    load = [] if installed else ["-p", "conductor.pytest_plugin"]  # loading it twice is an error
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", *load, "-p", "no:cacheprovider",
                           "--rootdir", str(project), "tests"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
