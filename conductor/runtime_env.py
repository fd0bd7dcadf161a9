"""Where Millrace finds its JVM pieces, and checks that say which `make` step fixes a broken setup.

Everything the project installs lives under the repository's ignored ``build/``
folder, so a fresh clone plus ``make test`` (or ``make demo``) is the whole setup.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from conductor.settings import LOOPBACK

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("MILLRACE_BUILD_DIR", REPO_ROOT / "build"))
DELTA_JARS_DIR = BUILD_DIR / "jars"
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# Maven Central publishes the JVM side of delta-spark 4.4.x for Spark 4.2 only as 4.4.0;
# the Python package 4.4.1 is a Python-only patch release that talks to the same JVM API.
DELTA_MAVEN_ARTIFACT = "io.delta:delta-spark_4.2_2.13:4.4.0"


class EnvironmentBroken(RuntimeError):
    """The machine lacks a piece Millrace needs; the message names the `make` step that installs it."""


def free_port(host: str = LOOPBACK) -> int:
    """A currently free TCP port on `host` (the OS picks it, so parallel runs do not collide)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def java_version() -> int:
    """Major version of the `java` on PATH; Spark 4.2 needs 17 or newer."""
    java = shutil.which("java")
    if java is None:
        raise EnvironmentBroken("no `java` on PATH: install OpenJDK 17 (`make setup` does it: apt-get install openjdk-17-jre-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    m = re.search(r'version "(\d+)', out)
    if not m:
        raise EnvironmentBroken(f"cannot read the Java version from: {out.strip()!r}")
    return int(m.group(1))


def require_java17() -> int:
    v = java_version()
    if v < 17:
        raise EnvironmentBroken(f"Java {v} found, Spark 4.2 needs Java 17+: run `make setup` (installs openjdk-17)")
    return v


def zookeeper_classpath() -> str:
    """Classpath for the ZooKeeper server: Debian's jar names its dependencies in its manifest."""
    if not ZOOKEEPER_JAR.exists():
        raise EnvironmentBroken(
            f"{ZOOKEEPER_JAR} is missing: run `make setup` (installs Debian's `zookeeper` package)"
        )
    return str(ZOOKEEPER_JAR)


def delta_jars() -> list[Path]:
    """The cached Delta Lake jars (only those PySpark does not already ship)."""
    jars = sorted(DELTA_JARS_DIR.glob("*.jar"))
    if not any(j.name.startswith("delta-spark_") for j in jars):
        raise EnvironmentBroken(
            f"Delta Lake jars are not cached in {DELTA_JARS_DIR}: run `make jars` (resolves "
            f"{DELTA_MAVEN_ARTIFACT} from Maven Central once)"
        )
    return jars


def venv_python() -> str:
    """The interpreter Spark's Python workers must use: the one running us (the project's venv)."""
    return sys.executable
