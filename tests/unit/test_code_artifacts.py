"""Code artifacts: packaging is deterministic and checked, a cache accepts only bytes that match their hash, and
two versions of one package load side by side in one process, each importing its own modules."""

from __future__ import annotations

import io
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.client.code import CodeCache
from topology.artifact import Artifact, ArtifactError, extract, package_code
from topology.code_loader import ALIAS_PREFIX, load_class, unload
from topology.module import ModuleDefinitionError

MODULE = """
from pstate import Map
from topology import Module
import {pkg}.util
from {pkg}.util import VERSION
from . import util as relative


def later():
    import {pkg}.util as again
    from {pkg} import util
    return again.VERSION, util.VERSION


class Counter(Module):
    def define(self, m):
        m.depot("*events")
        m.pstate("$$seen", Map(str, int))
        Counter.seen = ({pkg}.util.VERSION, VERSION, relative.VERSION, later())
"""


def make_package(root: Path, pkg: str, version: int, extra: str = "") -> Path:
    (root / pkg).mkdir(parents=True)
    (root / pkg / "__init__.py").write_text("")
    (root / pkg / "util.py").write_text(f"VERSION = {version}\n{extra}")
    (root / pkg / "mod.py").write_text(textwrap.dedent(MODULE.format(pkg=pkg)))
    (root / pkg / "__pycache__").mkdir()
    (root / pkg / "__pycache__" / "junk.pyc").write_bytes(b"not shipped")
    return root


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    src = tmp_path / "src"
    src.mkdir()
    sys.path.insert(0, str(src))
    try:
        yield src
    finally:
        sys.path.remove(str(src))


def test_packaging_ships_the_top_level_package_deterministically(on_path: Path, tmp_path: Path) -> None:
    make_package(on_path, "mr_pkg_a", 1)
    a = package_code("mr_pkg_a.mod:Counter")
    assert a.kind == "package" and a.top_level() == {"mr_pkg_a"}
    with zipfile.ZipFile(io.BytesIO(a.data)) as zf:
        assert sorted(zf.namelist()) == ["mr_pkg_a/__init__.py", "mr_pkg_a/mod.py", "mr_pkg_a/util.py"]
    assert package_code("mr_pkg_a.mod:Counter").sha256 == a.sha256, "the same files make the same version"
    (on_path / "mr_pkg_a" / "util.py").write_text("VERSION = 2\n")
    assert package_code("mr_pkg_a.mod:Counter").sha256 != a.sha256


def test_packaging_refuses_what_cannot_provide_the_module(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="'mr_absent' is not importable here"):
        package_code("mr_absent.mod:X")
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other/__init__.py", "")
        zf.writestr("other-1.0.dist-info/METADATA", "")
    with pytest.raises(ArtifactError, match=r"does not contain 'mine' \(it holds \['other'\]\)"):
        package_code("mine.mod:X", wheel)
    (tmp_path / "not.whl").write_bytes(b"plain bytes")
    with pytest.raises(ArtifactError, match="is not a wheel"):
        package_code("mine.mod:X", tmp_path / "not.whl")
    assert package_code("other:X", wheel).kind == "wheel"


def test_extraction_refuses_entries_outside_the_root(tmp_path: Path) -> None:
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("../escaped.py", "")
    with pytest.raises(ArtifactError, match="entry outside its root"):
        extract(evil, tmp_path / "root")
    assert not (tmp_path / "escaped.py").exists()


def test_a_cache_keeps_only_bytes_that_match_their_version(on_path: Path, tmp_path: Path) -> None:
    make_package(on_path, "mr_pkg_b", 1)
    a = package_code("mr_pkg_b.mod:Counter")
    cache = CodeCache(tmp_path / "cache")
    with pytest.raises(ArtifactError, match="not the version"):
        cache.put("0" * 64, a.chunks(100))
    assert cache.versions() == [], "a failed put leaves nothing behind"
    assert cache.put(a.sha256, a.chunks(100)) is True
    assert cache.put(a.sha256, a.chunks()) is False, "a second put of a version is a no-op"
    assert b"".join(cache.chunks(a.sha256)) == a.data
    assert cache.load(a.sha256, "mr_pkg_b.mod:Counter").build().name == "Counter"
    assert cache.sweep({a.sha256}, older_than_s=0) == []
    assert cache.sweep(set(), older_than_s=0) == [a.sha256] and not cache.has(a.sha256)


def test_two_versions_of_one_package_load_side_by_side(tmp_path: Path) -> None:
    roots = [make_package(tmp_path / f"v{v}", "mr_pkg_c", v) for v in (1, 2)]
    classes = [load_class(root, f"v{v}", "mr_pkg_c.mod:Counter") for v, root in zip((1, 2), roots, strict=True)]
    try:
        for v, cls in zip((1, 2), classes, strict=True):
            cls.build()
            # absolute, from-, relative and function-time imports all reach this version's own modules
            assert cls.seen == (v, v, v, (v, v))  # type: ignore[attr-defined]
            assert cls.__module__ == f"{ALIAS_PREFIX}v{v}.mr_pkg_c.mod"
        assert "mr_pkg_c" not in sys.modules, "the artifact's package never enters the interpreter's namespace"
    finally:
        unload("v1")
        unload("v2")
    assert not any(n.startswith(ALIAS_PREFIX + "v") for n in sys.modules)


def test_a_failed_import_names_the_error_and_can_be_tried_again(tmp_path: Path) -> None:
    root = make_package(tmp_path / "v", "mr_pkg_d", 1, extra="import mr_not_installed_anywhere\n")
    with pytest.raises(ModuleDefinitionError, match="ModuleNotFoundError: No module named 'mr_not_installed_anywhere'"):
        load_class(root, "d1", "mr_pkg_d.mod:Counter")
    (root / "mr_pkg_d" / "util.py").write_text("VERSION = 1\n")  # the dependency problem is fixed
    try:
        assert load_class(root, "d1", "mr_pkg_d.mod:Counter").build().name == "Counter"
    finally:
        unload("d1")
    (root / "mr_pkg_d" / "mod.py").write_text("def broken(:\n")
    with pytest.raises(ModuleDefinitionError, match="SyntaxError"):
        load_class(root, "d2", "mr_pkg_d.mod:Counter")


def test_an_artifact_knows_its_hash_and_chunks() -> None:
    a = Artifact(b"x" * 2500, "package", "test")
    assert len(a.sha256) == 64 and a.size == 2500
    assert [len(c) for c in a.chunks(1000)] == [1000, 1000, 500]
