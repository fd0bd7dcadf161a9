"""Backups and restores on a real cluster (ZooKeeper, a conductor, three workers, RF=3): docs/backups.md."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conductor.backups.layout import BackupDamaged, BackupError, BackupFolder
from conductor.backups.restore import open_verified, restore_backup
from conductor.backups.take import take_backup
from conductor.client import Cluster
from conductor.controller import Conductor
from conductor.devcluster import DevCluster
from conductor.metastore import Metastore
from conductor.status import wait_serving
from tests.integration.cluster_helpers import Appender, converged, deploy, group_status, groups_of, wait_for

TASKS, THREADS = 4, 2
DEPOTS = ("*clicks", "*raw")


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path / "cluster", nodes=3, conductors=1, session_timeout=4.0, log_level="INFO")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _partitions(cluster: Cluster, module: str) -> dict[tuple[str, int], list[Any]]:
    """Every record of every depot partition of ``module``, read from its leaders."""
    out: dict[tuple[str, int], list[Any]] = {}
    for name in DEPOTS:
        depot = cluster.depot(module, name)
        for task in range(TASKS):
            rows: list[Any] = []
            start = 0
            while True:
                batch = depot.read_batch(task, start, None, 1 << 22)
                rows.extend(batch.records)
                if batch.next == start:
                    break
                start = batch.next
            out[(name, task)] = rows
    return out


def _pool(root: Path) -> dict[str, int]:
    """Stored checkpoint files, by path, with their inode (a rewritten file gets a new one)."""
    return {str(p.relative_to(root)): p.stat().st_ino for p in (root / "files").rglob("*") if p.is_file()}


def test_backup_while_writing_restores_under_a_new_name(dc: DevCluster, tmp_path: Path) -> None:
    deploy(dc, "Clicks", tasks=TASKS, threads=THREADS)
    backups = tmp_path / "backups"
    with Cluster.connect(dc.hosts) as cluster:
        raw = cluster.depot("Clicks", "*raw")
        raw.append_many([{"n": i} for i in range(500)])
        writer = Appender(cluster.depot("Clicks", "*clicks")).start()
        try:
            wait_for(lambda: writer.count() > 1500, 60, "the writer to get 1,500 appends acknowledged")
            c = Conductor(dc.hosts, "test-backup")
            c.ms.start()
            try:
                first = take_backup(c.ms, "Clicks", backups)
                before = _pool(backups)
                n0 = writer.count()
                wait_for(lambda: writer.count() > n0 + 1500, 60, "more appends between the backups")
                raw.append_many([{"n": i} for i in range(500, 900)])
                # streamed through this process this time: both ways fill the same pool of files
                second = take_backup(c.ms, "Clicks", backups, leader_copies=False)
            finally:
                c.ms.close()
        finally:
            writer.stop()
        assert not writer.errors, writer.errors[:3]
        source = _partitions(cluster, "Clicks")

    m1, m2 = first.manifest, second.manifest
    # the leaders run on this machine: each copied its group into the folder itself (BackupToFolder)
    assert first.leader_copied == tuple(range(THREADS)) and second.leader_copied == ()
    assert not list(backups.glob(".probe-*")), "the probe outlives the backup"
    assert first.copied_bytes == m1.total_bytes() - (m1.code.size if m1.code else 0)
    # the second backup copied only files the folder lacked; those it shares with the first are not rewritten
    after = _pool(backups)
    new = {p for p in after if p not in before}
    assert second.copied_bytes == sum((backups / p).stat().st_size for p in new)
    shared = {f.path for g in m1.groups for f in g.files} & {f.path for g in m2.groups for f in g.files}
    assert shared, "the second backup reused no file of the first"
    assert all(after[p] == before[p] for p in shared)
    assert second.copied_bytes < m2.total_bytes()
    assert all(g2.applied_offset > g1.applied_offset for g1, g2 in zip(m1.groups, m2.groups, strict=True))

    folder, manifest = open_verified(backups)
    assert manifest.id == m2.id
    c = Conductor(dc.hosts, "test-restore")
    c.ms.start()
    try:
        restore_backup(c, folder, manifest, "ClicksCopy")
        st = wait_serving(c.ms, "ClicksCopy", 60)
        assert st["serving"] == THREADS, st
        with pytest.raises(BackupError, match="module ClicksCopy exists: a restore only creates"):
            restore_backup(c, folder, manifest, "ClicksCopy")
    finally:
        c.ms.close()
    groups = groups_of(dc, "ClicksCopy")
    for g in manifest.groups:
        state = groups[g.group]
        assert len(state.replicas) == 3
        lead = group_status(dc, state.leader or "", "ClicksCopy", g.group)
        assert lead.log_start == g.applied_offset + 1, "the restored replog starts after the checkpoint"
        assert lead.applied_offset == g.applied_offset
    with Cluster.connect(dc.hosts) as cluster:
        restored = _partitions(cluster, "ClicksCopy")
        # group by group, the restored depots are the source's as of the backup's offset: a prefix of the source
        # (the writer went on after the backup), never a record the source does not have at that position
        grew = 0
        for key, rows in restored.items():
            assert rows == source[key][:len(rows)], f"{key}: the restored partition is not the source's prefix"
            grew += len(source[key]) - len(rows)
        assert grew > 0, "the source did not grow after the backup: writes did not run during it"
        assert sum(len(restored[("*raw", t)]) for t in range(TASKS)) == 900
        # the restored module is an ordinary one: it takes writes, and its three replicas converge
        cluster.depot("ClicksCopy", "*clicks").append_many([{"user": "u1", "id": f"new{i}"} for i in range(50)])
    wait_for(lambda: converged(dc, "ClicksCopy"), 60, "the restored module's replicas to converge")


def _cli(dc: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MILLRACE_ZK": dc.hosts, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "conductor.cli", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def test_cli_backup_then_a_flipped_byte_is_refused_at_restore_then_another_cluster_restores_it(
        dc: DevCluster, tmp_path: Path) -> None:
    deploy(dc, "Clicks", tasks=TASKS, threads=THREADS)
    with Cluster.connect(dc.hosts) as cluster:
        cluster.depot("Clicks", "*clicks").append_many([{"user": f"u{i % 7}", "id": f"r{i}"} for i in range(3000)])
    backups = tmp_path / "b"
    done = _cli(dc, "backup", "Clicks", "--to", str(backups))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backed up Clicks" in done.stdout
    manifest = BackupFolder(backups).open()
    victim = max((f for g in manifest.groups for f in g.files), key=lambda f: f.size)
    path = backups / victim.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BackupDamaged, match=victim.path.rsplit("/", 1)[-1]):
        open_verified(backups)
    refused = _cli(dc, "restore", "--from", str(backups), "--as", "Broken")
    assert refused.returncode == 1
    assert victim.path.rsplit("/", 1)[-1] in refused.stderr and "nothing was restored" in refused.stderr, \
        refused.stderr
    with Metastore(dc.hosts) as ms:
        assert "Broken" not in ms.modules.names()
    data[len(data) // 2] ^= 0x01  # repaired: another cluster, which never ran the module's code, restores it
    path.write_bytes(bytes(data))
    with Cluster.connect(dc.hosts) as cluster:
        source = _partitions(cluster, "Clicks")
    dc.stop()  # (two clusters at once are too much for a small machine; the backup needs neither)
    other = DevCluster(tmp_path / "other", nodes=3, conductors=1, session_timeout=4.0, log_level="INFO")
    other.start()
    try:
        ok = _cli(other, "restore", "--from", str(backups), "--as", "Clicks")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "restored Clicks" in ok.stdout
        with Cluster.connect(other.hosts) as cluster:
            assert _partitions(cluster, "Clicks") == source
    finally:
        other.stop()
