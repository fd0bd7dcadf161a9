"""A backup folder's layout and its checksum manifest: what ``conductor backup`` writes and ``restore`` verifies.

::

    DIR/
      millrace-backups.json            {"format": 1, "module": SOURCE}: one source module per folder
      latest                           the id of the newest complete backup
      files/<group>/<crc32c>-<name>    every checkpoint file, stored once across backups
      code/<sha256>/artifact.zip       the module's code artifact (conductor.client.code's layout), stored once
      backups/<id>/manifest.json       one backup: spec, code, per group its applied offset, epoch and files

A checkpoint file is stored under its RocksDB name *and* its CRC32C: SST files
are immutable, so a second backup of the same replica reuses every file it
already has, but two replicas of a group name different files alike
(``000012.sst`` of one is not the other's), and the leader may have changed
between backups. ``manifest.json`` is written last, by rename: a backup
without one is incomplete and never restored. It checksums itself
(``manifest_crc32c``) and lists every file it needs with its size and
CRC32C; :func:`verify` reads every byte and names the first file that does
not match. docs/backups.md documents the same.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from pstate.checkpoint import Manifest, ManifestFile, file_crc, fsync_dir

FORMAT = 1
MARKER = "millrace-backups.json"
LATEST = "latest"
MANIFEST = "manifest.json"
#: backup ids sort by time: 20261127T051500Z-3fa2
ID_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{4}$")
_POOL_RE = re.compile(r"^([0-9a-f]{8})-(.+)$")


class BackupError(Exception):
    """A backup folder that cannot be written or restored from; the message names the file and what to do."""


class BackupDamaged(BackupError):
    """A file of a backup does not match its manifest (size or CRC32C), or is missing: the restore is refused."""

    def __init__(self, path: Path | str, why: str) -> None:
        self.path = str(path)
        super().__init__(f"backup file {path} {why}; nothing was restored (restore an earlier backup with "
                         "--backup ID, or take a new one)")


@dataclass(frozen=True)
class StoredFile:
    """One file a backup needs: its path in the folder, and the name it has in the checkpoint."""

    name: str
    path: str  #: relative to the backup folder
    size: int
    crc32c: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "size": self.size, "crc32c": self.crc32c}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StoredFile:
        return StoredFile(str(d["name"]), str(d["path"]), int(d["size"]), int(d["crc32c"]))


@dataclass(frozen=True)
class GroupBackup:
    """One task group in a backup: a checkpoint of its leader's store at ``applied_offset`` in ``leader_epoch``."""

    group: int
    applied_offset: int
    leader_epoch: int
    leader: str
    files: tuple[StoredFile, ...]

    def checkpoint_manifest(self) -> Manifest:
        """The store's own manifest (pstate.checkpoint), as a worker installs it."""
        return Manifest(self.applied_offset, self.leader_epoch,
                        tuple(ManifestFile(f.name, f.size, f.crc32c) for f in self.files))

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "applied_offset": self.applied_offset, "leader_epoch": self.leader_epoch,
                "leader": self.leader, "files": [f.to_dict() for f in self.files]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> GroupBackup:
        return GroupBackup(int(d["group"]), int(d["applied_offset"]), int(d["leader_epoch"]), str(d["leader"]),
                           tuple(StoredFile.from_dict(f) for f in d["files"]))


@dataclass(frozen=True)
class BackupManifest:
    """One complete backup (``backups/<id>/manifest.json``)."""

    id: str
    module: str
    created: float
    millrace_version: str
    spec: dict[str, Any]  #: the module's spec as ZooKeeper held it (ModuleSpec JSON)
    code: StoredFile | None  #: the code artifact (None: the module runs code from the workers' import path)
    code_kind: str
    code_origin: str
    groups: tuple[GroupBackup, ...]

    def files(self) -> Iterator[StoredFile]:
        if self.code is not None:
            yield self.code
        for g in self.groups:
            yield from g.files

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files())

    def _body(self) -> dict[str, Any]:
        return {"format": FORMAT, "id": self.id, "module": self.module, "created": self.created,
                "millrace_version": self.millrace_version, "spec": self.spec,
                "code": None if self.code is None else {**self.code.to_dict(), "kind": self.code_kind,
                                                        "origin": self.code_origin},
                "groups": [g.to_dict() for g in self.groups]}

    def to_json(self) -> str:
        body = self._body()
        body["manifest_crc32c"] = crc32c.crc32c(_canonical(body))
        return json.dumps(body, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str, where: Path) -> BackupManifest:
        try:
            d = json.loads(text)
            stored = int(d.pop("manifest_crc32c"))
            if crc32c.crc32c(_canonical(d)) != stored:
                raise BackupDamaged(where, "does not match its own checksum (manifest_crc32c)")
            if int(d["format"]) != FORMAT:
                raise BackupError(f"{where}: backup format {d['format']}, this Millrace reads format {FORMAT}")
            code = d["code"]
            return BackupManifest(
                str(d["id"]), str(d["module"]), float(d["created"]), str(d["millrace_version"]), dict(d["spec"]),
                None if code is None else StoredFile.from_dict(code),
                "" if code is None else str(code["kind"]), "" if code is None else str(code["origin"]),
                tuple(GroupBackup.from_dict(g) for g in d["groups"]))
        except (ValueError, KeyError, TypeError) as e:
            raise BackupDamaged(where, f"is not a readable backup manifest ({e})") from None


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class BackupFolder:
    """``DIR``: where backups of one module accumulate (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ writing (conductor backup)

    def claim(self, module: str) -> None:
        """Make ``root`` a backup folder of ``module``, or check that it is one (a folder holds one module)."""
        marker = self.root / MARKER
        if marker.exists():
            try:
                owner = json.loads(marker.read_text())["module"]
            except (ValueError, KeyError, TypeError) as e:
                raise BackupError(f"{marker} is unreadable ({e}): is {self.root} a Millrace backup folder?") from None
            if owner != module:
                raise BackupError(f"{self.root} holds backups of module {owner}, not {module}: give each module "
                                  "its own folder")
            return
        if self.root.exists() and any(self.root.iterdir()):
            raise BackupError(f"{self.root} is not empty and holds no {MARKER}: give the backups an empty folder")
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(marker, json.dumps({"format": FORMAT, "module": module}))

    def group_dir(self, group: int) -> Path:
        d = self.root / "files" / str(group)
        d.mkdir(parents=True, exist_ok=True)
        return d

    @staticmethod
    def pool_name(name: str, crc: int) -> str:
        return f"{crc:08x}-{name}"

    def stored(self, group: int) -> dict[tuple[str, int, int], StoredFile]:
        """The group's files already in the folder, by (checkpoint name, size, CRC32C): what a backup need not copy.

        Read from the names and sizes, not the bytes (a restore verifies every byte).
        """
        d = self.group_dir(group)
        out = {}
        for entry in os.scandir(d):
            m = _POOL_RE.match(entry.name)
            if m is None or not entry.is_file():
                continue  # a partial copy (".part") of an interrupted backup is not stored
            size, crc = entry.stat().st_size, int(m.group(1), 16)
            out[(m.group(2), size, crc)] = StoredFile(m.group(2), f"files/{group}/{entry.name}", size, crc)
        return out

    def commit(self, manifest: BackupManifest) -> Path:
        """Write the backup's manifest (the backup exists from this rename on) and point ``latest`` at it."""
        d = self.root / "backups" / manifest.id
        d.mkdir(parents=True, exist_ok=False)
        _write_atomic(d / MANIFEST, manifest.to_json())
        _write_atomic(self.root / LATEST, manifest.id + "\n")
        return d / MANIFEST

    # ------------------------------------------------------------------ reading (conductor restore)

    def ids(self) -> list[str]:
        """Complete backups, oldest first."""
        d = self.root / "backups"
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if ID_RE.match(p.name) and (p / MANIFEST).is_file())

    def open(self, backup_id: str | None = None) -> BackupManifest:
        """A backup's manifest (default: ``latest``), its layout checked; its files are not read yet (``verify``)."""
        if not (self.root / MARKER).is_file():
            raise BackupError(f"{self.root} is not a Millrace backup folder (no {MARKER})")
        if backup_id is None:
            latest = self.root / LATEST
            backup_id = latest.read_text().strip() if latest.is_file() else (self.ids() or [""])[-1]
            if not backup_id:
                raise BackupError(f"{self.root} holds no complete backup")
        if not ID_RE.match(backup_id):
            raise BackupError(f"{backup_id!r} is not a backup id (complete ones here: {', '.join(self.ids())})")
        path = self.root / "backups" / backup_id / MANIFEST
        if not path.is_file():
            raise BackupError(f"no complete backup {backup_id} in {self.root} (complete ones: "
                              f"{', '.join(self.ids()) or 'none'})")
        manifest = BackupManifest.from_json(path.read_text(), path)
        if manifest.id != backup_id:
            raise BackupDamaged(path, f"names backup {manifest.id}, but it is in folder {backup_id}")
        threads = int(manifest.spec.get("threads", -1))
        if sorted(g.group for g in manifest.groups) != list(range(threads)):
            raise BackupDamaged(path, f"lists groups {[g.group for g in manifest.groups]} for {threads} task groups")
        for f in manifest.files():
            self._inside(f)
        return manifest

    def _inside(self, f: StoredFile) -> Path:
        """The file's absolute path; a manifest that points outside the folder is damaged."""
        full = (self.root / f.path).resolve()
        if not full.is_relative_to(self.root.resolve()) or os.sep in f.name or f.name in ("", ".", ".."):
            raise BackupDamaged(f.path, "lies outside the backup folder or has no plain name")
        return full

    def path(self, f: StoredFile) -> Path:
        return self._inside(f)

    def verify(self, manifest: BackupManifest, on_bytes: Callable[[int], None] | None = None) -> None:
        """Read every file the backup needs; BackupDamaged naming the first that is missing or differs."""
        for f in manifest.files():
            full = self._inside(f)
            try:
                size, crc = file_crc(str(full))
            except FileNotFoundError:
                raise BackupDamaged(full, "is missing") from None
            if (size, crc) != (f.size, f.crc32c):
                raise BackupDamaged(full, f"does not match the manifest: size/CRC32C {size}/{crc:#010x}, "
                                    f"manifest {f.size}/{f.crc32c:#010x}")
            if on_bytes is not None:
                on_bytes(size)


def new_backup_id(now: float | None = None) -> str:
    t = time.gmtime(time.time() if now is None else now)
    return time.strftime("%Y%m%dT%H%M%SZ", t) + "-" + os.urandom(2).hex()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
