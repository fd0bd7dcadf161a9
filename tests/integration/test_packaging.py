"""The wheel: built from the tracked files alone, installed into a fresh virtualenv, it runs its CLI and client;
installed as the light client with its dependencies resolved, it brings no RocksDB, Spark or pandas; installed
with ``[server,spark]`` (slow: a few hundred MB), a user's folder outside the repository runs `conductor doctor`,
`conductor dev`, deploys its own package, appends and selects, and runs a Spark microbatch.

A wheel once installed fine and then failed on `conductor --help` (its gRPC code
was not in it). This builds one from what a clean clone holds (no generated
``*_pb2*.py``), installs it with ``--no-deps`` into a fresh virtualenv outside
the repository, and runs it from a directory outside the repository. The fresh
venv sees the dev venv's dependencies through one ``.pth`` line; a path added
that way does not process that directory's own ``.pth`` files, so the dev
venv's editable install of this repository stays invisible.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.integration.cluster_helpers import write_tally_app

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"replog", "pstate", "topology", "conductor"}


#: the installed wheel must be what runs, never the checkout a PYTHONPATH names
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_ENV)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


#: a microbatch topology added to the Tally app (inside ``define``): word lengths, counted on Spark
MICROBATCH = """        lengths = m.pstate("$$lengths", Map(int, int))

        @m.microbatch(words)
        def per_length(batch, ctx):
            from pyspark.sql import functions as F

            per = batch.groupBy(F.length("value").alias("len")).count()
            return per.select(F.lit(lengths.name).alias("target"), F.col("len").alias("key"),
                              F.lit("add").alias("op"), F.col("count").alias("value"))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a clean clone: the tracked files only, so the build hook must generate the gRPC
    modules itself (the working tree's tracked and new files, so an uncommitted change is in it)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src"
    tracked = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).split("\0")
    for name in filter(None, tracked):
        if name.startswith(("build/", "tests/")) or not (REPO / name).is_file():
            continue
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest)
    assert not list((src / "conductor" / "wire").glob("*_pb2*.py"))

    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src],
         cwd=tmp_path)
    (built,) = dist.glob("millrace-*.whl")
    return built


def test_the_wheel_installs_and_runs_its_cli_and_client_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n} == TOP_LEVEL
    assert "conductor/wire/millrace_pb2.py" in names and "conductor/wire/millrace_pb2_grpc.py" in names
    assert "conductor/ui/static/style.css" in names, "the UI's stylesheet ships in the package (no CDN)"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py = venv / "bin" / "python"
    fresh_site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           cwd=tmp_path).strip())
    dev_site = sysconfig.get_path("purelib")
    assert dev_site in site.getsitepackages() or dev_site in sys.path
    (fresh_site / "millrace-dev-deps.pth").write_text(dev_site + "\n")
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([py, "-c", "import conductor.client, conductor.wire.millrace_pb2 as pb; "
                            "print(conductor.client.__file__); print(pb.__file__)"], cwd=elsewhere)
    for line in where.split():
        assert Path(line).is_relative_to(fresh_site), f"imported {line}, not the installed wheel"
    help_text = _run([venv / "bin" / "conductor", "--help"], cwd=elsewhere)
    assert "deploy" in help_text and "status" in help_text
    assert _run([venv / "bin" / "conductor", "--version"], cwd=elsewhere).strip() == "millrace 0.1.0"


def test_the_light_client_installs_with_its_dependencies_and_without_rocksdb_spark_or_pandas(
        wheel: Path, tmp_path: Path) -> None:
    # Resolved from the index (the pip cache makes a second run fast): the declared ranges must be installable.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", wheel], cwd=tmp_path, timeout=600)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = ("import importlib.util, conductor, conductor.client; "
             "print(conductor.__version__); "
             "print(sorted(m for m in ('pyspark', 'rocksdict', 'pandas', 'pyarrow', 'typer') "
             "if importlib.util.find_spec(m) is not None))")
    version, present = _run([py, "-c", probe], cwd=elsewhere).split("\n")[:2]
    assert version == "0.1.0"
    assert present == "[]", f"the light client installed {present}"
    # The console script is there; without the server extra it says how to get it instead of a traceback.
    done = subprocess.run([venv / "bin" / "conductor", "status"], cwd=elsewhere, capture_output=True, text=True,
                          timeout=60, env=_ENV)
    assert done.returncode == 1 and "pip install 'millrace[server]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_server_wheel_runs_doctor_dev_deploy_append_and_select_outside_the_repository(
        wheel: Path, tmp_path: Path) -> None:
    # millrace[server,spark] with its dependencies resolved (the lock as constraints keeps the download cached).
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py, conductor = venv / "bin" / "python", venv / "bin" / "conductor"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "-c", REPO / "requirements.lock",
          f"{wheel}[server,spark]"], cwd=tmp_path, timeout=900)
    project = tmp_path / "myproject"
    write_tally_app(project, extra=MICROBATCH)
    _ENV["MILLRACE_JARS"] = str(REPO / "build" / "jars")  # offline: the checkout's jars stand in for the cache
    try:
        doctor = _run([conductor, "doctor"], cwd=project, timeout=300)
        assert "all 6 checks passed" in doctor
        _run([conductor, "dev", "--nodes", "3"], cwd=project, timeout=120)
        try:
            _run([conductor, "deploy", "--module", "tallyapp.counting:Tally", "--tasks", "2", "--threads", "1",
                  "--workers", "3", "--replicationFactor", "3"], cwd=project, timeout=120)
            zk = _run([py, "-c", "import json; print(json.load(open('.millrace-dev/cluster.json'))['zk'])"],
                      cwd=project).strip()
            got = _run([py, "-c", "from conductor import Cluster\n"
                                  f"with Cluster.connect({zk!r}) as c:\n"
                                  "    c.depot('Tally', '*words').append('mill')\n"
                                  "    c.depot('Tally', '*words').append('mill')\n"
                                  "    print(c.pstate('Tally', '$$counts').select_one('mill'))"], cwd=project)
            assert got.strip() == "2"
            # millrace[spark]: a microbatch topology on Spark from the user's folder, committed exactly once
            batch = _run([py, "-c", "import json, tempfile\n"
                                    "from conductor import Cluster\n"
                                    "from topology.spark.microbatch import run_microbatch\n"
                                    "from topology.spark.session import spark_session\n"
                                    "hosts = json.load(open('.millrace-dev/cluster.json'))['zk']\n"
                                    "work = tempfile.mkdtemp()\n"
                                    "spark = spark_session('wheel-test', warehouse=work + '/warehouse')\n"
                                    "q = run_microbatch(spark, hosts, 'Tally', 'per_length', work + '/checkpoint',\n"
                                    "                   trigger={'availableNow': True})\n"
                                    "q.await_termination()\n"
                                    "spark.stop()\n"
                                    f"with Cluster.connect({zk!r}) as c:\n"
                                    "    print(sum(n for t in range(2) for _, n in c.pstate('Tally', '$$lengths').scan(t)))"],
                         cwd=project, timeout=600)
            assert batch.strip().splitlines()[-1] == "2", batch  # both records counted, once
        finally:
            _run([conductor, "dev", "--stop"], cwd=project, timeout=120)
    finally:
        _ENV.pop("MILLRACE_JARS")
