"""The import contracts have no hole: an upward import anywhere fails `make lint`, and every module has a layer.

The contracts in pyproject.toml name layers by package or by wildcard (docs/layers.md), so a module
added later is in a layer without an edit there. These tests copy the product packages and
pyproject.toml to a temporary directory, plant one upward import at a time and run ``lint-imports``
on the copy, expecting the contract that forbids it to be named BROKEN; the untouched copy must pass.
Which contract is which is read from pyproject.toml by its shape (its type and the modules it names),
not by its title, and so is the list of layers that every product module must fall in exactly once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("replog", "pstate", "topology", "conductor")
_SCRIPT = Path(sys.executable).with_name("lint-imports")
#: `make lint`'s command, from this interpreter's environment (its entry point when the script is elsewhere)
LINT_IMPORTS = [str(_SCRIPT)] if _SCRIPT.exists() else [
    sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"]


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _one(test: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    found = [c for c in _contracts() if test(c)]
    assert len(found) == 1, f"expected one contract that {what}, found {[c['name'] for c in found]}"
    return found[0]


def _layer_members(layer: str) -> list[str]:
    """The modules a layer names: ``a | b`` or ``a : b``, ``(a)`` when optional."""
    return [m.strip().strip("()") for m in re.split(r"[|:]", layer)]


def _roots() -> dict[str, Any]:
    return _one(lambda c: c["type"] == "layers" and any("replog" in _layer_members(x) for x in c["layers"]),
                "orders the root packages")


def _conductor_layers() -> dict[str, Any]:
    return _one(lambda c: c["type"] == "layers" and any("conductor.client" in _layer_members(x)
                                                        for x in c["layers"]),
                "orders the conductor's packages")


def _top() -> dict[str, Any]:
    return _one(lambda c: c["type"] == "forbidden" and "conductor.*" in c["forbidden_modules"],
                "keeps conductor/*.py on top")


def _core() -> dict[str, Any]:
    return _one(lambda c: c["type"] == "forbidden" and "topology.spark" in c["forbidden_modules"],
                "keeps topology's core below topology.spark")


def _pure() -> dict[str, Any]:
    return _one(lambda c: c["type"] == "forbidden" and c["source_modules"] == ["replog"],
                "keeps the replication rules pure")


def _product_modules() -> list[str]:
    modules = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "_pb2" in path.name or "__pycache__" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _member_of(layer: list[str]) -> Callable[[str], bool]:
    return lambda module: any(_within(module, m) for m in layer)


def _matches(module: str, expression: str) -> bool:
    """import-linter's module wildcards: ``*`` is one name, ``**`` one name or more."""
    pattern = re.escape(expression).replace(r"\*\*", r"[^.]+(\.[^.]+)*").replace(r"\*", r"[^.]+")
    return re.fullmatch(pattern, module) is not None


# --- every module in exactly one layer ------------------------------------------------------------


def _stack() -> list[tuple[str, Callable[[str], bool]]]:
    """The layers, top to bottom, each with a test of membership, derived from the contracts.

    The conductor's packages (and topology.spark beside the worker) are named by the second layers
    contract; the conductor's top-level modules are what the top contract's wildcard matches outside
    them (with the package's own ``__init__``, which imports only the client); topology's core is what
    the core contract covers outside topology.spark; then the roots that no contract subdivides.
    """
    fine = [_layer_members(layer) for layer in _conductor_layers()["layers"]]
    named = [m for layer in fine for m in layer]

    def in_fine(module: str) -> bool:
        return any(_within(module, m) for m in named)

    top = _top()
    core = _core()
    top_roots = {e.split(".")[0] for e in top["forbidden_modules"]}
    stack: list[tuple[str, Callable[[str], bool]]] = [
        ("conductor/*.py", lambda m: m in top_roots or (not in_fine(m) and any(
            _matches(".".join(m.split(".")[:2]), e) for e in top["forbidden_modules"]))),
    ]
    stack += [(" | ".join(layer), _member_of(layer)) for layer in fine]
    stack.append(("topology's core", lambda m: not in_fine(m) and any(
        _matches(m, e) for e in core["source_modules"]) and not any(
        _matches(m, e) for e in core["forbidden_modules"])))
    roots = [_layer_members(layer) for layer in _roots()["layers"]]
    subdivided = {m.split(".")[0] for m in named} | {e.split(".")[0] for e in core["source_modules"]}
    stack += [(" | ".join(layer), _member_of(layer)) for layer in roots if not set(layer) & subdivided]
    return stack


def test_every_product_module_is_in_exactly_one_layer() -> None:
    stack = _stack()
    modules = _product_modules()
    assert "topology.dataflow.poison" in modules and "conductor.settings" in modules
    misplaced = {}
    for module in modules:
        layers = [name for name, contains in stack if contains(module)]
        if len(layers) != 1:
            misplaced[module] = layers
    assert misplaced == {}


def test_the_top_contract_reads_from_exactly_the_conductor_packages() -> None:
    """The top layer is "conductor/*.py outside the packages below": both lists must name the same ones."""
    below = {m for layer in _conductor_layers()["layers"] for m in _layer_members(layer)}
    sources = {s.removesuffix(".**") for s in _top()["source_modules"]}
    assert sources == below


def test_each_root_package_is_in_exactly_one_root_layer() -> None:
    members = [m for layer in _roots()["layers"] for m in _layer_members(layer)]
    assert sorted(members) == sorted(PACKAGES)


# --- planted upward imports fail the linter -------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _copy(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(pristine, root)
    return root


def _lint(root: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([*LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    # The report wraps long contract names: compare with runs of white space made one space.
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _plant(root: Path, relative: str, line: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    before = path.read_text() if path.exists() else '"""Planted by test_import_contracts."""\n'
    path.write_text(before + f"\n{line}\n")


def _broken(output: str) -> list[str]:
    return [c["name"] for c in _contracts() if f"{c['name']} BROKEN" in output]


def test_the_untouched_copy_keeps_every_contract(pristine: Path) -> None:
    code, output = _lint(pristine)
    assert code == 0, output
    assert f"Contracts: {len(_contracts())} kept, 0 broken" in output


PLANTS: dict[str, tuple[list[tuple[str, str]], Callable[[], list[dict[str, Any]]]]] = {
    "pure dataflow rules import the worker": (
        [("topology/dataflow/poison.py", "import conductor.worker.worker")], lambda: [_roots()]),
    "a new topology module imports the client": (
        [("topology/planted.py", "import conductor.client")], lambda: [_roots()]),
    "replog imports pstate": (
        [("replog/messages.py", "import pstate.store")], lambda: [_roots(), _pure()]),
    "the worker imports a new top-level conductor module": (
        [("conductor/planted.py", "import conductor.status"),
         ("conductor/worker/worker.py", "import conductor.planted")], lambda: [_top()]),
    "the UI imports a top-level conductor module": (
        [("conductor/ui/pages.py", "import conductor.status")], lambda: [_top()]),
    "the UI imports the worker": (
        [("conductor/ui/pages.py", "import conductor.worker.metrics")], lambda: [_conductor_layers()]),
    "topology.spark imports a top-level conductor module": (
        [("topology/spark/fetch.py", "import conductor.status")], lambda: [_top()]),
    "the dataflow rules import Spark's package": (
        [("topology/dataflow/poison.py", "import topology.spark.session")], lambda: [_core()]),
    "topology's public API imports Spark's package": (
        [("topology/__init__.py", "import topology.spark.fetch")], lambda: [_core()]),
    "the wire imports the client": (
        [("conductor/wire/errors.py", "import conductor.client.cluster")], lambda: [_conductor_layers()]),
    "topology.spark imports the worker": (
        [("topology/spark/fetch.py", "import conductor.worker.metrics")], lambda: [_conductor_layers()]),
    "the security package, once it exists, imports the wire": (
        [("conductor/security/__init__.py", "import conductor.wire.errors")], lambda: [_conductor_layers()]),
}


@pytest.mark.parametrize("case", sorted(PLANTS))
def test_a_planted_upward_import_breaks_its_contract(pristine: Path, tmp_path: Path, case: str) -> None:
    plants, expected = PLANTS[case]
    root = _copy(pristine, tmp_path)
    for relative, line in plants:
        _plant(root, relative, line)
    code, output = _lint(root)
    assert code != 0, output
    # An upward import often breaks more than one rule (a cycle, the client's weight): the one named must be.
    missing = [c["name"] for c in expected() if c["name"] not in _broken(output)]
    assert missing == [], output


def test_the_security_package_has_its_layer_once_it_exists(pristine: Path, tmp_path: Path) -> None:
    """Below the metastore and the wire, above the settings: it may import those, they may import it."""
    root = _copy(pristine, tmp_path)
    _plant(root, "conductor/security/__init__.py", "import conductor.settings")
    _plant(root, "conductor/security/identity.py", "import conductor.security")
    _plant(root, "conductor/wire/errors.py", "import conductor.security.identity")
    code, output = _lint(root)
    assert code == 0, output
