"""ZooKeeper's server without Debian's package: the pinned jars match what `make jars` resolves, a missing set
says how to get it, and a fetched set (from a Maven-layout folder, through the same download code as Maven
Central) starts a real server that answers a client."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient

from conductor import runtime_env
from conductor.runtime_env import ZOOKEEPER_JARS, EnvironmentBroken, zookeeper_classpath
from conductor.zkserver import ZooKeeperServer

REPO = Path(__file__).resolve().parents[2]


def test_the_pinned_jars_are_the_pom_and_what_make_jars_resolves() -> None:
    pom = (REPO / "tools" / "zookeeper-jars.pom.xml").read_text()
    for jar in ZOOKEEPER_JARS:
        assert f"<artifactId>{jar.artifact}</artifactId><version>{jar.version}</version>" in pom, jar
    made = REPO / "build" / "jars" / "zookeeper"
    assert made.is_dir(), "`make jars` has not run here (make test runs it first)"
    assert sorted(p.name for p in made.glob("*.jar")) == sorted(j.file_name for j in ZOOKEEPER_JARS)
    for jar in ZOOKEEPER_JARS:
        assert (made / jar.file_name).stat().st_size == jar.size, jar.file_name


@pytest.fixture
def no_debian_zookeeper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine without Debian's package, whose jars folder is empty: returns that folder."""
    monkeypatch.setattr(runtime_env, "ZOOKEEPER_JAR", tmp_path / "absent" / "zookeeper.jar")
    monkeypatch.setenv("MILLRACE_JARS", str(tmp_path / "jars"))
    return tmp_path / "jars"


def test_without_debians_package_a_missing_server_says_how_to_get_it(no_debian_zookeeper: Path) -> None:
    with pytest.raises(EnvironmentBroken, match="conductor doctor --fetch"):
        zookeeper_classpath(fetch=False)
    assert not no_debian_zookeeper.exists(), "a check must not download"


def test_without_debians_package_the_server_is_fetched_checked_and_runs(
        no_debian_zookeeper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    mirror = REPO / "build" / "m2"  # `make jars` resolved the same artifacts into this Maven-layout folder
    assert all(Path(j.url(str(mirror))).is_file() for j in ZOOKEEPER_JARS), "`make jars` has not run here"
    monkeypatch.setenv("MILLRACE_MAVEN", mirror.as_uri())
    classpath = zookeeper_classpath()
    assert "downloading 6" in capfd.readouterr().err
    assert classpath.split(":") == [str(no_debian_zookeeper / "zookeeper" / j.file_name) for j in ZOOKEEPER_JARS]
    assert zookeeper_classpath(fetch=False) == classpath, "fetched once, then found"
    with ZooKeeperServer(tmp_path / "zk") as server:
        zk = KazooClient(hosts=server.hosts, timeout=10)
        zk.start(timeout=30)
        try:
            zk.create("/probe", b"from the fetched jars")
            assert zk.get("/probe")[0] == b"from the fetched jars"
        finally:
            zk.stop()
            zk.close()
