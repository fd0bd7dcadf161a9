"""The worker's side of a backup into a folder it sees (conductor.worker.backup_folder): where it may write, and
what it writes; and the SST checksums a checkpoint reuses (pstate.checkpoint.SstChecksums)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import crc32c
import pytest

from conductor.wire.errors import InvalidRequest
from conductor.worker.backup_folder import FolderUnusable, copy_into, open_group_dir, pool_name
from pstate.checkpoint import ManifestFile, SstChecksums

PROBE = ".probe-" + "ab" * 16
TOKEN = b"t" * 16


def folder(tmp_path: Path, module: str = "Clicks") -> Path:
    root = tmp_path / "dir"
    (root / "files" / "0").mkdir(parents=True)
    (root / "millrace-backups.json").write_text(json.dumps({"format": 1, "module": module}))
    (root / PROBE).write_bytes(TOKEN)
    return root


def opened(root: Path | str, module: str = "Clicks", probe: str = PROBE, token: bytes = TOKEN) -> None:
    os.close(open_group_dir(str(root), module, 0, probe, token))


def test_a_folder_with_the_probe_and_the_marker_is_written(tmp_path: Path) -> None:
    opened(folder(tmp_path))


def test_a_relative_path_or_dotdot_is_refused(tmp_path: Path) -> None:
    root = folder(tmp_path)
    with pytest.raises(InvalidRequest):
        opened(os.path.relpath(root))
    with pytest.raises(InvalidRequest):
        opened(f"{root}/../dir")
    with pytest.raises(InvalidRequest):
        opened(root, probe="../../etc/passwd")


def test_a_folder_the_cli_did_not_write_is_not_written(tmp_path: Path) -> None:
    root = folder(tmp_path)
    with pytest.raises(FolderUnusable, match="another token"):
        opened(root, token=b"x" * 16)
    with pytest.raises(FolderUnusable, match="cannot read"):
        opened(root, probe=".probe-" + "cd" * 16)
    with pytest.raises(FolderUnusable, match="does not name module Billing"):
        opened(root, module="Billing")
    with pytest.raises(FolderUnusable, match="cannot open"):
        opened(tmp_path / "nowhere")


def test_no_symlink_below_the_folder_is_followed(tmp_path: Path) -> None:
    root = folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "0").mkdir(parents=True)
    (root / "files" / "0").rmdir()
    (root / "files" / "0").symlink_to(elsewhere / "0")
    with pytest.raises(FolderUnusable, match="a symlink"):
        opened(root)
    (root / "files" / "0").unlink()
    (root / "files").rmdir()
    (root / "files").symlink_to(elsewhere)
    with pytest.raises(FolderUnusable, match="a symlink"):
        opened(root)
    os.unlink(root / PROBE)
    (root / PROBE).symlink_to(tmp_path / "token")
    (tmp_path / "token").write_bytes(TOKEN)
    with pytest.raises(FolderUnusable, match="a symlink"):
        opened(root)


def _files(src: Path, blobs: dict[str, bytes]) -> list[ManifestFile]:
    src.mkdir()
    for n, b in blobs.items():
        (src / n).write_bytes(b)
    return [ManifestFile(n, len(b), crc32c.crc32c(b)) for n, b in blobs.items()]


def test_copied_files_are_checked_and_stored_under_their_pool_names(tmp_path: Path) -> None:
    root = folder(tmp_path)
    blobs = {"000012.sst": os.urandom(3_000_000), "MANIFEST-000005": b"m" * 100, "empty": b""}
    files = _files(tmp_path / "ck", blobs)
    # a planted link where a part file goes is replaced, never followed
    (root / "files" / "0" / ".000012.sst.part").symlink_to(tmp_path / "victim")
    seen: list[int] = []
    gdir = open_group_dir(str(root), "Clicks", 0, PROBE, TOKEN)
    try:
        copy_into(gdir, tmp_path / "ck", files, seen.append, threading.Event())
    finally:
        os.close(gdir)
    assert sum(seen) == sum(map(len, blobs.values()))
    assert not (tmp_path / "victim").exists()
    stored = sorted(p.name for p in (root / "files" / "0").iterdir())
    assert stored == sorted(pool_name(f) for f in files)
    for f in files:
        assert (root / "files" / "0" / pool_name(f)).read_bytes() == blobs[f.name]


def test_a_copy_that_does_not_match_the_checkpoint_is_not_stored(tmp_path: Path) -> None:
    root = folder(tmp_path)
    files = _files(tmp_path / "ck", {"000012.sst": b"x" * 1000})
    bad = [ManifestFile(files[0].name, files[0].size, files[0].crc32c ^ 1)]
    gdir = open_group_dir(str(root), "Clicks", 0, PROBE, TOKEN)
    try:
        with pytest.raises(ValueError, match="reads back with CRC32C"):
            copy_into(gdir, tmp_path / "ck", bad, lambda _n: None, threading.Event())
    finally:
        os.close(gdir)
    assert list((root / "files" / "0").iterdir()) == []


def test_sst_checksums_are_read_once_per_file_and_only_for_sst_files(tmp_path: Path) -> None:
    sums = SstChecksums(capacity=2)
    sst, other = tmp_path / "000001.sst", tmp_path / "OPTIONS-000007"
    sst.write_bytes(b"a" * 100)
    other.write_bytes(b"b" * 100)
    assert sums.describe(str(sst)) == (100, crc32c.crc32c(b"a" * 100))
    os.link(sst, tmp_path / "link.sst")  # a checkpoint's hard link: the same inode, no second read
    assert sums.describe(str(tmp_path / "link.sst")) == (100, crc32c.crc32c(b"a" * 100))
    assert len(sums._crcs) == 1
    assert sums.describe(str(other)) == (100, crc32c.crc32c(b"b" * 100))
    assert len(sums._crcs) == 1
    for i in range(3):
        p = tmp_path / f"{i}.sst"
        p.write_bytes(bytes([i]) * 10)
        sums.describe(str(p))
    assert len(sums._crcs) == 2  # bounded
