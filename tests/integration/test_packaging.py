"""The wheel: built from the tracked files alone, installed into a fresh virtualenv, it runs its CLI and client.

A wheel once installed fine and then failed on `conductor --help` (its gRPC code
was not in it). This builds one from what a clean clone holds (no generated
``*_pb2*.py``), installs it with ``--no-deps`` into a fresh virtualenv outside
the repository, and runs it from a directory outside the repository. The fresh
venv sees the dev venv's dependencies through one ``.pth`` line; a path added
that way does not process that directory's own ``.pth`` files, so the dev
venv's editable install of this repository stays invisible.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"replog", "pstate", "topology", "conductor"}


def _run(args: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_and_runs_its_cli_and_client_outside_the_repository(tmp_path: Path) -> None:
    # A clean clone: the tracked files only, so the build hook must generate the gRPC modules itself.
    src = tmp_path / "src"
    tracked = _run(["git", "ls-files", "-z"], cwd=REPO).split("\0")
    for name in filter(None, tracked):
        if name.startswith(("build/", "tests/")):
            continue
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest)
    assert not list((src / "conductor" / "wire").glob("*_pb2*.py"))

    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src],
         cwd=tmp_path)
    (wheel,) = dist.glob("millrace-*.whl")
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
