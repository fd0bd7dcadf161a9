"""A Spark standalone cluster (one master, N workers) started with the launcher the ``pyspark`` package ships.

    with StandaloneCluster(Path("/tmp/spark"), workers=2) as sc:
        spark = spark_session("job", master=sc.master_url)

Each daemon is ``pyspark/bin/spark-class org.apache.spark.deploy.master.Master``
(or ``...worker.Worker``) run in the foreground as our own child, so it is
stopped by its pid; the wheel has no ``sbin/start-master.sh``, and the daemons
those scripts fork would outlive a failed test. Every daemon binds the address
it is given (``SPARK_LOCAL_IP`` too, which the executors a worker launches
inherit), and may run behind a launch prefix (``ip netns exec NS``), so the
same class starts a cluster on loopback for the benchmark and one daemon per
machine for the multi-host test. On real machines, run the same two commands
by hand (README, "Running on several machines").

Nothing is installed on the workers beyond pyspark and Millrace itself: Delta's
jars travel with each job (``spark.jars``, served by the driver), module code
is fetched from Millrace workers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from conductor.devcluster import ChildProcess
from conductor.runtime_env import free_port, require_java17, venv_python
from conductor.settings import LOOPBACK

#: the standalone master's usual port (each test host is its own network stack, so it is free there)
MASTER_PORT = 7077
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: heap of the master and worker daemons themselves (they only schedule; executors get their own)
DAEMON_MEMORY = "256m"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> str:
    return str(spark_home() / "bin" / "spark-class")


class StandaloneCluster:
    """A master on `master_host` and one worker per entry of `worker_hosts` (each `cores` cores, `memory`).

    `launch_prefixes` (master first, then one per worker) run a daemon elsewhere, e.g. in a network namespace;
    without them every daemon runs here and ports are free loopback ports.
    """

    def __init__(self, root: Path, workers: int = 2, *, master_host: str = LOOPBACK,
                 worker_hosts: Sequence[str] | None = None, launch_prefixes: Sequence[Sequence[str]] | None = None,
                 cores: int = 1, memory: str = "1g") -> None:
        self.root = Path(root)
        self.master_host = master_host
        self.worker_hosts = list(worker_hosts) if worker_hosts is not None else [master_host] * workers
        prefixes = [tuple(p) for p in launch_prefixes] if launch_prefixes is not None else \
            [()] * (1 + len(self.worker_hosts))
        if len(prefixes) != 1 + len(self.worker_hosts):
            raise ValueError(f"give one launch prefix for the master and one per worker, got {len(prefixes)} "
                             f"for {len(self.worker_hosts)} worker(s)")
        self.prefixes = prefixes
        self.cores = cores
        self.memory = memory
        self.port = MASTER_PORT if prefixes[0] else free_port(master_host)
        self.master: ChildProcess | None = None
        self.workers: list[ChildProcess] = []

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host}:{self.port}"

    def _env(self, host: str, name: str) -> dict[str, str]:
        return {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host, "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                "SPARK_LOCAL_DIRS": str(self.root / name / "tmp"), "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": venv_python()}

    def _spawn(self, name: str, prefix: Sequence[str], args: list[str], host: str) -> ChildProcess:
        (self.root / name / "tmp").mkdir(parents=True, exist_ok=True)
        return ChildProcess(name, [*prefix, spark_class(), *args], self.root / f"{name}.log",
                            self._env(host, name)).start()

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        """Start the master, then the workers; wait until every worker registered. On failure stop all."""
        require_java17()
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._spawn("spark-master", self.prefixes[0],
                                      [MASTER_CLASS, "--host", self.master_host, "--port", str(self.port),
                                       "--webui-port", "0"], self.master_host)
            self._wait(self.master, re.compile(r"I have been elected leader|Starting Spark master"), 1, timeout_s)
            for i, (host, prefix) in enumerate(zip(self.worker_hosts, self.prefixes[1:], strict=True), start=1):
                self.workers.append(self._spawn(
                    f"spark-worker{i}", prefix,
                    [WORKER_CLASS, "--host", host, "--cores", str(self.cores), "--memory", self.memory,
                     "--webui-port", "0", "--work-dir", str(self.root / f"spark-worker{i}" / "work"),
                     self.master_url], host))
            self._wait(self.master, re.compile(r"Registering worker "), len(self.workers), timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, proc: ChildProcess, pattern: re.Pattern[str], count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(pattern.findall(_read(proc.log_path))) < count:
            for p in [proc, *self.workers]:
                if not p.alive():
                    raise RuntimeError(f"Spark {p.name} exited during start-up; log {p.log_path}:\n{p.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Spark {proc.name}: {count} x {pattern.pattern!r} not logged within "
                                   f"{timeout_s}s; log {proc.log_path}:\n{proc.tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Workers first (each kills its executors), then the master; by pid."""
        for p in [*self.workers, *([self.master] if self.master else [])]:
            p.stop(timeout_s=15)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""

