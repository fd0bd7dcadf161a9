"""A module's code as a content-addressed artifact: one zip file named by the sha256 of its bytes.

``conductor deploy --module pkg.mod:Class`` packages the module's top-level
package (``pkg``: every file under it but caches and hidden files), or takes a
wheel given with ``--code FILE`` as it is. Workers store the artifact under
its hash, so the hash is the code version: two deploys of the same code are
one version, and a worker that fetched bytes from anywhere checks them against
the name they were asked for.

Why a zip: a wheel already is one, Python's standard library reads and writes
it, and unpacked it is an import root as is (packages at the top). Entries are
written in sorted order with fixed timestamps and modes, so packaging the same
files twice gives the same bytes and the same hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath

from topology.module import ModuleDefinitionError, split_module_ref

#: Refused above this size: module code, not data; a bigger artifact is almost surely a wrong folder.
MAX_ARTIFACT_BYTES = 256 << 20
#: Chunks of an artifact on the wire.
CHUNK_BYTES = 1 << 20
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
#: What a wheel holds beside importable code (packaging metadata), never an import name.
_METADATA_SUFFIXES = (".dist-info", ".data")


class ArtifactError(ModuleDefinitionError):
    """The code cannot be packaged, or an artifact's bytes are not a usable one; the message says which."""


@dataclass(frozen=True)
class Artifact:
    """The bytes of a code artifact, what kind it is (``package`` or ``wheel``) and what it was made from."""

    data: bytes
    kind: str
    origin: str

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def size(self) -> int:
        return len(self.data)

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        for i in range(0, len(self.data), size):
            yield self.data[i:i + size]

    def top_level(self) -> set[str]:
        with zipfile.ZipFile(io.BytesIO(self.data)) as zf:
            return top_level_names(zf.namelist())


def import_from_first(folder: Path) -> None:
    """Put the user's folder first on the import path, as `python -m` does with the current directory.

    A console script's ``sys.path[0]`` is its bin folder, so without this the CLI would find an app package
    beside the user "not importable here" unless they set PYTHONPATH (`conductor deploy --app-dir`).
    """
    resolved = Path(folder).resolve()
    if not resolved.is_dir():
        raise ArtifactError(f"--app-dir {folder} is not a folder")
    if str(resolved) in sys.path:
        sys.path.remove(str(resolved))
    sys.path.insert(0, str(resolved))
    importlib.invalidate_caches()


def package_code(module_ref: str, wheel: Path | None = None) -> Artifact:
    """The artifact to deploy for `module_ref`: the given wheel, or its top-level package from this
    interpreter's path. Either must contain the module the reference names."""
    module, _cls = split_module_ref(module_ref)
    top = module.split(".")[0]
    if wheel is not None:
        try:
            data = Path(wheel).read_bytes()
        except OSError as e:
            raise ArtifactError(f"cannot read --code {wheel}: {e.strerror}") from None
        artifact = Artifact(data, "wheel", str(wheel))
    else:
        artifact = Artifact(_zip_files(_package_files(top)), "package", f"package {top!r}")
    if artifact.size > MAX_ARTIFACT_BYTES:
        raise ArtifactError(f"{artifact.origin} is {artifact.size / 2**20:.0f} MiB; module code above "
                            f"{MAX_ARTIFACT_BYTES >> 20} MiB is refused (does the package hold data files?)")
    try:
        tops = artifact.top_level()
    except zipfile.BadZipFile:
        raise ArtifactError(f"{artifact.origin} is not a wheel (zip file)") from None
    if top not in tops:
        raise ArtifactError(f"{artifact.origin} does not contain {top!r} (it holds {sorted(tops)}), so it cannot "
                            f"provide {module_ref!r}")
    return artifact


def _package_files(top: str) -> list[tuple[str, Path]]:
    """(name in the archive, file) for every file of top-level package or module `top`."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as e:
        raise ArtifactError(f"cannot find package {top!r} to ship: {e}") from None
    if spec is None:
        raise ArtifactError(f"package {top!r} is not importable here; run the deploy in the folder that holds it, "
                            "point at that folder with --app-dir DIR, or give a wheel with --code FILE")
    if spec.submodule_search_locations is None:  # a single-file module
        if spec.origin is None or not spec.origin.endswith(".py"):
            raise ArtifactError(f"{top!r} is not Python source ({spec.origin}); give a wheel with --code FILE")
        return [(f"{top}.py", Path(spec.origin))]
    files: dict[str, Path] = {}
    for location in spec.submodule_search_locations:
        base = Path(location)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for f in filenames:
                if f.startswith(".") or f.endswith(_SKIP_SUFFIXES):
                    continue
                path = Path(dirpath) / f
                files.setdefault(str(PurePosixPath(top, *path.relative_to(base).parts)), path)
    if not files:
        raise ArtifactError(f"package {top!r} has no files to ship")
    return sorted(files.items())


def _zip_files(files: Iterable[tuple[str, Path]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, path in files:
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


def top_level_names(names: Iterable[str]) -> set[str]:
    """The import names at the top of an archive: folders and ``.py`` files, not packaging metadata."""
    tops = set()
    for name in names:
        first, sep, _rest = name.partition("/")
        if sep and not first.endswith(_METADATA_SUFFIXES) and first.isidentifier():
            tops.add(first)
        elif not sep and first.endswith(".py") and first[:-3].isidentifier():
            tops.add(first[:-3])
    return tops


def extract(archive: Path, dest: Path) -> None:
    """Unpack `archive` into `dest`, refusing any entry that would land outside it."""
    root = dest.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.infolist():
            target = (root / member.filename).resolve()
            if target != root and root not in target.parents:
                raise ArtifactError(f"artifact {archive.name} has an entry outside its root: {member.filename!r}")
        zf.extractall(root)
