"""Delta's jars on first use: where they are looked for, the download's checksum, and the pinned list's match
with what `make jars` resolves.

The downloads here come from a Maven-layout folder in a temporary directory
(``file://`` URLs go through the same urllib code as Maven Central's https).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conductor import runtime_env
from conductor.runtime_env import DELTA_JARS, EnvironmentBroken, MavenJar, delta_jars, fetch_jar, jars_dir

REPO = Path(__file__).resolve().parents[2]


def _repository_with(tmp_path: Path, jar: MavenJar, content: bytes) -> str:
    repo = tmp_path / "maven"
    path = Path(jar.url(str(repo)))
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    return repo.as_uri()


def test_a_download_whose_sha1_matches_gets_the_jars_name(tmp_path: Path) -> None:
    content = b"PK fake jar" * 1000
    jar = MavenJar("org.example", "thing", "1.0", hashlib.sha1(content).hexdigest(), len(content))
    seen: list[int] = []
    target = fetch_jar(jar, tmp_path / "cache", _repository_with(tmp_path, jar, content),
                       on_progress=lambda _j, got: seen.append(got))
    assert target == tmp_path / "cache" / "thing-1.0.jar"
    assert target.read_bytes() == content
    assert seen[-1] == len(content)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["thing-1.0.jar"]


def test_a_download_whose_sha1_differs_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    jar = MavenJar("org.example", "thing", "1.0", "0" * 40, 3)
    with pytest.raises(EnvironmentBroken, match="not the published"):
        fetch_jar(jar, tmp_path / "cache", _repository_with(tmp_path, jar, b"bad"))
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unreachable_repository_says_where_to_put_the_jars(tmp_path: Path) -> None:
    jar = MavenJar("org.example", "thing", "1.0", "0" * 40, 3)
    with pytest.raises(EnvironmentBroken, match="MILLRACE_JARS"):
        fetch_jar(jar, tmp_path / "cache", (tmp_path / "nowhere").as_uri())


def test_millrace_jars_names_the_folder_and_a_missing_jar_says_how_to_get_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILLRACE_JARS", str(tmp_path / "mine"))
    assert jars_dir() == tmp_path / "mine"
    with pytest.raises(EnvironmentBroken, match="downloads them from Maven Central"):
        delta_jars(fetch=False)
    (tmp_path / "mine").mkdir()
    for jar in DELTA_JARS:
        (tmp_path / "mine" / jar.file_name).write_bytes(b"")
    assert delta_jars(fetch=False) == [tmp_path / "mine" / j.file_name for j in DELTA_JARS]


def test_outside_a_checkout_the_jars_go_to_the_users_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MILLRACE_JARS", raising=False)
    monkeypatch.delenv("MILLRACE_BUILD_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(runtime_env, "REPO_ROOT", tmp_path / "site-packages")
    assert jars_dir() == tmp_path / "xdg" / "millrace" / "jars"


def test_the_pinned_jars_are_the_pom_artifact_and_what_make_jars_selects() -> None:
    group, artifact, version = runtime_env.DELTA_MAVEN_ARTIFACT.split(":")
    assert MavenJar(group, artifact, version, "", 0).file_name in {j.file_name for j in DELTA_JARS}
    pom = (REPO / "tools" / "delta-jars.pom.xml").read_text()
    assert f"<artifactId>{artifact}</artifactId>" in pom and f"<version>{version}</version>" in pom
    made = REPO / "build" / "jars"
    assert made.is_dir(), "`make jars` has not run here (make test runs it first)"
    assert sorted(p.name for p in made.glob("*.jar")) == sorted(j.file_name for j in DELTA_JARS)
    for jar in DELTA_JARS:
        assert (made / jar.file_name).stat().st_size == jar.size, jar.file_name
