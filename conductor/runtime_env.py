"""Where Millrace finds its JVM pieces (fetching Delta's jars on first use), and checks that say what fixes a
broken setup.

In a checkout everything the project installs lives under the repository's
ignored ``build/`` folder, so a fresh clone plus ``make test`` (or ``make demo``)
is the whole setup. An installed wheel has no ``build/``: Delta Lake's jars
(pinned below with their SHA-1) are downloaded from Maven Central into a user
cache the first time a Spark session needs them, or taken from the folder
``$MILLRACE_JARS`` names (a machine without the network gets them there).
ZooKeeper's server comes from Debian's package where it is installed, else
from pinned jars fetched the same way into that folder's ``zookeeper/``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conductor.settings import LOOPBACK

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("MILLRACE_BUILD_DIR", REPO_ROOT / "build"))
#: a folder holding (or to hold) Delta's jars, instead of the default cache
JARS_ENV = "MILLRACE_JARS"
#: a Maven repository to fetch them from instead of Maven Central (a mirror; file:// works)
MAVEN_ENV = "MILLRACE_MAVEN"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
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


def zookeeper_classpath(fetch: bool = True) -> str:
    """Classpath for the ZooKeeper server: Debian's jar where its package is installed (the jar names its
    dependencies in its manifest); else the pinned ZOOKEEPER_JARS from the jars folder, downloaded there on
    first use (with a progress bar) unless `fetch` is false (then EnvironmentBroken says how to get them)."""
    if ZOOKEEPER_JAR.exists():
        return str(ZOOKEEPER_JAR)
    folder = jars_dir() / "zookeeper"
    missing = missing_jars(folder, ZOOKEEPER_JARS)
    if missing and not fetch:
        raise EnvironmentBroken(f"no ZooKeeper server here: neither Debian's {ZOOKEEPER_JAR} (`apt-get install "
                                f"zookeeper`; `make setup` does it) nor the jars in {folder} ({len(missing)} "
                                "missing): `conductor doctor --fetch` or the first `conductor dev` downloads them "
                                f"from Maven Central (or ${MAVEN_ENV})")
    if missing:
        fetch_with_progress("ZooKeeper's jars", missing, folder)
    return os.pathsep.join(str(folder / j.file_name) for j in ZOOKEEPER_JARS)


@dataclass(frozen=True)
class MavenJar:
    """One jar of a Maven repository, with the SHA-1 Maven Central publishes beside it (checked on download)."""

    group: str
    artifact: str
    version: str
    sha1: str
    size: int

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    def url(self, repository: str) -> str:
        return f"{repository.rstrip('/')}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


#: What `make jars` resolves from tools/delta-jars.pom.xml ({DELTA_MAVEN_ARTIFACT} and its runtime dependencies)
#: less what PySpark already ships (tools/select_jars.sh). Change both together.
DELTA_JARS = (
    MavenJar("io.delta", "delta-spark_4.2_2.13", "4.4.0", "c2ab26421b8de44a2161b5e0b7da7954049f1ca1", 9515916),
    MavenJar("io.delta", "delta-storage", "4.4.0", "a068e489ce20d7f79bc4ca2d3392f12adbb69ddd", 113863),
    MavenJar("io.delta", "delta-kernel-api", "4.4.0", "58b895b7000ed3d67551c30f1c83a39be11f590e", 2838619),
    MavenJar("io.delta", "delta-kernel-defaults", "4.4.0", "13f676570d3c8f2650c3e9a3142530c24720327f", 227185),
    MavenJar("io.delta", "delta-kernel-unitycatalog", "4.4.0", "4f5d11adea096407d41eb7e127c7911b027fdebf", 43048),
    MavenJar("io.unitycatalog", "unitycatalog-client", "0.6.0", "ff00daaa50d591bbae9a94c200e2c0d23372b5f0", 564136),
    MavenJar("io.unitycatalog", "unitycatalog-hadoop", "0.6.0", "197bbc873cf0ad806b70896b607cc95e8c52e68b", 78389),
    MavenJar("com.fasterxml.jackson.datatype", "jackson-datatype-jdk8", "2.13.5",
             "1278f38160812811c56eb77f67213662ed1c7a2e", 34800),
    MavenJar("javax.annotation", "javax.annotation-api", "1.3.2", "934c04d3cfef185a8008e7bf34331b79730a9d43", 26586),
)

#: A standalone or quorum ZooKeeper server's runtime (checked by starting both from these jars): the server, its
#: wire format, logging (slf4j-simple writes to the server's log file) and the two libraries its startup loads
#: (dropwizard metrics for its summaries, snappy for snapshot streams). Used where Debian's package is absent;
#: tools/zookeeper-jars.pom.xml resolves the same set (`make jars`).
ZOOKEEPER_JARS = (
    MavenJar("org.apache.zookeeper", "zookeeper", "3.9.5", "4f091e2a604d7c6a818ac2a7169e3bad5a5441dc", 1367207),
    MavenJar("org.apache.zookeeper", "zookeeper-jute", "3.9.5", "20135d3521579fd7382fed744f6b74241ecb5b73", 260263),
    MavenJar("org.slf4j", "slf4j-api", "2.0.13", "80229737f704b121a318bba5d5deacbcf395bc77", 68605),
    MavenJar("org.slf4j", "slf4j-simple", "2.0.13", "be11a3f05f7cf546524b07ad252719d840f4daed", 15703),
    MavenJar("io.dropwizard.metrics", "metrics-core", "4.2.40", "1f8ad3364aea18b314f784d6551e20b8710d9c63", 131927),
    MavenJar("org.xerial.snappy", "snappy-java", "1.1.10.7", "3049f95640f4625a945cfab85715f603fa4c8f80", 2338496),
)

#: called with (jar, bytes of it received so far) while a jar downloads
FetchProgress = Callable[[MavenJar, int], None]


def jars_dir() -> Path:
    """Where Delta's jars are: ``$MILLRACE_JARS``; in a checkout ``build/jars`` (`make jars` fills it); else
    the user's cache (``$XDG_CACHE_HOME/millrace/jars``, by default ``~/.cache/millrace/jars``)."""
    if os.environ.get(JARS_ENV):
        return Path(os.environ[JARS_ENV]).expanduser()
    if (REPO_ROOT / "pyproject.toml").is_file() or "MILLRACE_BUILD_DIR" in os.environ:
        return BUILD_DIR / "jars"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "millrace" / "jars"


def missing_jars(folder: Path | None = None, jars: tuple[MavenJar, ...] = DELTA_JARS) -> list[MavenJar]:
    """The `jars` (default: Delta's) not yet in `folder` (default: jars_dir())."""
    where = folder or jars_dir()
    return [j for j in jars if not (where / j.file_name).is_file()]


def fetch_jar(jar: MavenJar, folder: Path, repository: str, on_progress: FetchProgress | None = None) -> Path:
    """Download `jar` into `folder` and check its SHA-1; only a verified file ever gets the jar's name (a
    temporary name, then an atomic rename, so a concurrent session never loads half a jar)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / jar.file_name
    partial = folder / f".{jar.file_name}.{os.getpid()}.part"
    digest = hashlib.sha1(usedforsecurity=False)
    received = 0
    url = jar.url(repository)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
                received += len(chunk)
                if on_progress is not None:
                    on_progress(jar, received)
        if digest.hexdigest() != jar.sha1:
            raise EnvironmentBroken(f"{url} has SHA-1 {digest.hexdigest()}, not the published {jar.sha1}: "
                                    f"refusing it (a broken mirror or download?); put the jar in {folder} yourself")
        os.replace(partial, target)
    except OSError as e:
        raise EnvironmentBroken(f"cannot download {url}: {e}; put the jars of {DELTA_MAVEN_ARTIFACT} into "
                                f"{folder} (or point ${JARS_ENV} at a folder holding them, ${MAVEN_ENV} at a "
                                "Maven mirror)") from None
    finally:
        partial.unlink(missing_ok=True)
    return target


def delta_jars(fetch: bool = True, on_progress: FetchProgress | None = None) -> list[Path]:
    """Delta Lake's jars (only those PySpark does not already ship), downloaded into jars_dir() first if any
    is missing and `fetch` (else EnvironmentBroken says what to do)."""
    folder = jars_dir()
    missing = missing_jars(folder)
    if missing and not fetch:
        raise EnvironmentBroken(f"Delta Lake jars are not in {folder} ({len(missing)} missing): `conductor "
                                "doctor --fetch` or the first Spark session downloads them from Maven Central, "
                                f"or set ${JARS_ENV} to a folder holding them (in a checkout, `make jars`)")
    repository = os.environ.get(MAVEN_ENV) or MAVEN_CENTRAL
    for jar in missing:
        fetch_jar(jar, folder, repository, on_progress)
    return [folder / j.file_name for j in DELTA_JARS]


def fetch_with_progress(label: str, missing: list[MavenJar], folder: Path) -> None:
    """Download `missing` into `folder` with a progress bar on stderr (rich's, when the server extra installed
    it; else one line per jar): the first use of a JVM piece says what it fetches, once."""
    total = sum(j.size for j in missing)
    print(f"{label} are not in {folder} yet: downloading {len(missing)} ({total / 2**20:.1f} MiB), once",
          file=sys.stderr)
    repository = os.environ.get(MAVEN_ENV) or MAVEN_CENTRAL
    try:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
    except ImportError:
        for jar in missing:
            fetch_jar(jar, folder, repository)
            print(f"  {jar.file_name}", file=sys.stderr)
        return
    received: dict[str, int] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True)) as progress:
        task = progress.add_task(label, total=total)

        def show(jar: MavenJar, got: int) -> None:
            received[jar.file_name] = got
            progress.update(task, completed=sum(received.values()))

        for jar in missing:
            fetch_jar(jar, folder, repository, show)


def venv_python() -> str:
    """The interpreter Spark's Python workers must use: the one running us (the project's venv)."""
    return sys.executable
