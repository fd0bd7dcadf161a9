"""Import a code artifact's modules in isolation, so several versions of the same package live in one process.

An unpacked artifact is an *import root*: a folder with packages at its top.
Python keeps one module per name in ``sys.modules``, so two versions of
``examples.word_count`` cannot both be ``examples.word_count``. Each root is
therefore imported under an alias package named after its version,
``_millrace_code_<version>``: ``examples.word_count`` of that root is
``_millrace_code_<version>.examples.word_count`` in ``sys.modules``.

The code itself does not know: every module loaded from a root gets its own
``__builtins__`` whose ``__import__`` maps the root's top-level names to the
alias (``import examples.util`` and ``from examples import util`` inside the
artifact load the artifact's ``examples``), at import time and in functions
called later alike. Relative imports work unchanged. What is not redirected:
``importlib.import_module("examples...")`` called by the code (it bypasses
``__import__``); such code sees the interpreter's path, as any library would.

The alias is the same on every process that loads the same version, so a
reference to module code (a function's ``__module__`` and ``__qualname__``)
means the same code on every worker.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topology.artifact import top_level_names
from topology.module import Module, ModuleDefinitionError, module_class, split_module_ref

ALIAS_PREFIX = "_millrace_code_"
_real_import = builtins.__import__


class ImportRoot:
    """One version's folder of code, imported under its alias package."""

    def __init__(self, root: Path, version: str) -> None:
        if not version.isalnum():
            raise ValueError(f"a code version is letters and digits (a hash), got {version!r}")
        self.root = Path(root)
        self.version = version
        self.alias = ALIAS_PREFIX + version
        self.tops = frozenset(top_level_names(p.name + ("/" if p.is_dir() else "") for p in self.root.iterdir()))
        self.builtins: dict[str, Any] = {**builtins.__dict__, "__import__": self._import}

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Sequence[str] | None = (),
                level: int = 0) -> types.ModuleType:
        if level == 0 and name.partition(".")[0] in self.tops:
            module = _real_import(f"{self.alias}.{name}", globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[f"{self.alias}.{name.partition('.')[0]}"]
        return _real_import(name, globals, locals, fromlist, level)

    def find_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """The spec of `fullname` (under this root's alias) if the root holds it."""
        parts = fullname.split(".")[1:]
        if not parts or parts[0] not in self.tops:
            return None
        base = self.root.joinpath(*parts)
        init = base / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(fullname, init, loader=_Loader(fullname, str(init), self),
                                                          submodule_search_locations=[str(base)])
        source = base.with_suffix(".py")
        if source.is_file():
            return importlib.util.spec_from_file_location(fullname, source, loader=_Loader(fullname, str(source), self))
        if base.is_dir():  # a namespace package
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        return None


class _Loader(importlib.machinery.SourceFileLoader):
    """Loads a source file of an import root with the root's ``__builtins__`` (its import redirection)."""

    def __init__(self, fullname: str, path: str, root: ImportRoot) -> None:
        super().__init__(fullname, path)
        self.import_root = root

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self.import_root.builtins
        super().exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """The one meta-path finder for every registered import root (found by the alias a name starts with)."""

    def __init__(self) -> None:
        self.roots: dict[str, ImportRoot] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ALIAS_PREFIX):
            return None
        root = self.roots.get(fullname.split(".", 1)[0])
        return root.find_spec(fullname) if root is not None else None


_finder = _Finder()
_lock = threading.Lock()


def register(root: Path, version: str) -> ImportRoot:
    """Make `root` importable under its version's alias (idempotent)."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        alias = ALIAS_PREFIX + version
        found = _finder.roots.get(alias)
        if found is not None:
            return found
        ir = _finder.roots[alias] = ImportRoot(root, version)
        package = types.ModuleType(alias, f"code version {version}")
        package.__path__ = []
        package.__spec__ = importlib.machinery.ModuleSpec(alias, None, is_package=True)
        sys.modules[alias] = package
        return ir


def unload(version: str) -> None:
    """Forget a version's modules (after a failed import, or when its artifact is discarded)."""
    alias = ALIAS_PREFIX + version
    with _lock:
        _finder.roots.pop(alias, None)
        for name in [n for n in sys.modules if n == alias or n.startswith(alias + ".")]:
            del sys.modules[name]


def load_class(root: Path, version: str, module_ref: str) -> type[Module]:
    """The Module class `module_ref` names in the code of `version` unpacked at `root`.

    Any error of the code (a missing dependency, a syntax error, an exception at import) becomes a
    ModuleDefinitionError naming the reference and the error, and the version's half-imported modules are
    forgotten, so a later attempt (say, once the dependency is installed) imports afresh.
    """
    module, _cls = split_module_ref(module_ref)
    ir = register(root, version)
    if module.split(".")[0] not in ir.tops:
        raise ModuleDefinitionError(f"code version {version[:12]} does not contain {module!r} (it holds "
                                    f"{sorted(ir.tops)})")
    try:
        return module_class(importlib.import_module(f"{ir.alias}.{module}"), module_ref)
    except ModuleDefinitionError:
        unload(version)
        raise
    except Exception as e:
        unload(version)
        why = str(e).replace(f"{ir.alias}.", "")  # the code knows its modules by their own names
        raise ModuleDefinitionError(f"cannot import {module!r} for module {module_ref!r}: {type(e).__name__}: "
                                    f"{why}") from e
