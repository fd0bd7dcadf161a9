"""A backup folder's layout and checksum manifest (conductor.backups.layout): what restore refuses, and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor.backups.layout import (
    BackupDamaged,
    BackupError,
    BackupFolder,
    BackupManifest,
    GroupBackup,
    StoredFile,
    new_backup_id,
)
from conductor.backups.restore import restored_spec
from pstate.checkpoint import file_crc

SPEC = {"name": "Clicks", "moduleRef": "examples.clicks:Clicks", "tasks": 2, "threads": 1, "workers": 1,
        "replicationFactor": 1, "options": {}}


def _backup(root: Path, files: dict[str, bytes]) -> BackupManifest:
    folder = BackupFolder(root)
    folder.claim("Clicks")
    gdir = folder.group_dir(0)
    stored = []
    for name, data in files.items():
        tmp = gdir / f".{name}.part"
        tmp.write_bytes(data)
        size, crc = file_crc(str(tmp))
        tmp.rename(gdir / folder.pool_name(name, crc))
        stored.append(folder.stored(0)[(name, size, crc)])
    m = BackupManifest(new_backup_id(), "Clicks", 1.0, "0", SPEC, None, "", "",
                       (GroupBackup(0, 41, 3, "n1", tuple(stored)),))
    folder.commit(m)
    return m


def test_a_backup_round_trips_and_verifies(tmp_path: Path) -> None:
    m = _backup(tmp_path, {"000012.sst": b"x" * 1000, "CURRENT": b"MANIFEST-000005\n"})
    folder = BackupFolder(tmp_path)
    again = folder.open()
    assert again == m and folder.ids() == [m.id]
    folder.verify(again)
    cp = again.groups[0].checkpoint_manifest()
    assert (cp.applied_offset, cp.leader_epoch, sorted(f.name for f in cp.files)) == (41, 3, ["000012.sst", "CURRENT"])
    assert all(f.path.startswith("files/0/") for f in again.groups[0].files)


def test_a_flipped_byte_is_refused_naming_the_file(tmp_path: Path) -> None:
    m = _backup(tmp_path, {"000012.sst": b"x" * 1000})
    path = tmp_path / m.groups[0].files[0].path
    data = bytearray(path.read_bytes())
    data[500] ^= 1
    path.write_bytes(bytes(data))
    folder = BackupFolder(tmp_path)
    with pytest.raises(BackupDamaged, match=r"000012\.sst does not match the manifest") as e:
        folder.verify(folder.open())
    assert e.value.path == str(path)
    path.unlink()
    with pytest.raises(BackupDamaged, match="is missing"):
        folder.verify(folder.open())


def test_an_edited_manifest_is_refused(tmp_path: Path) -> None:
    m = _backup(tmp_path, {"000012.sst": b"x" * 10})
    path = tmp_path / "backups" / m.id / "manifest.json"
    doc = json.loads(path.read_text())
    doc["groups"][0]["applied_offset"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(BackupDamaged, match="its own checksum"):
        BackupFolder(tmp_path).open()


def test_a_manifest_pointing_outside_the_folder_is_refused(tmp_path: Path) -> None:
    outside = StoredFile("x.sst", "../elsewhere/x.sst", 1, 0)
    m = BackupManifest(new_backup_id(), "Clicks", 1.0, "0", SPEC, None, "", "", (GroupBackup(0, 1, 1, "n1", (outside,)),))
    folder = BackupFolder(tmp_path)
    folder.claim("Clicks")
    folder.commit(m)
    with pytest.raises(BackupDamaged, match="outside the backup folder"):
        folder.open()


def test_one_module_per_folder_and_no_foreign_folder(tmp_path: Path) -> None:
    BackupFolder(tmp_path / "a").claim("Clicks")
    BackupFolder(tmp_path / "a").claim("Clicks")
    with pytest.raises(BackupError, match="holds backups of module Clicks, not Other"):
        BackupFolder(tmp_path / "a").claim("Other")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(BackupError, match="not empty"):
        BackupFolder(tmp_path / "b").claim("Clicks")
    with pytest.raises(BackupError, match="no complete backup"):
        BackupFolder(tmp_path / "a").open()


def test_a_restored_spec_keeps_the_name_its_code_declares(tmp_path: Path) -> None:
    m = _backup(tmp_path, {"CURRENT": b"x"})
    spec = restored_spec(m, "ClicksCopy")
    assert (spec.name, spec.defined_as, spec.initial_code) == ("ClicksCopy", "Clicks", None)
    assert restored_spec(m, "Clicks").defined_as is None
    assert json.loads(spec.to_json())["definedAs"] == "Clicks"
