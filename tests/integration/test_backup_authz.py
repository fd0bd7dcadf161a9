"""Backups through the authorization interceptor on a real worker with mutual TLS: a backup copy takes admin on the
module, a restore push deploy on the module it creates, and a restore never writes into a module that exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from conductor.metastore import Metastore
from conductor.security import certs
from conductor.security.identity import Identity
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.worker.far_horizon import decode_chunk
from tests.integration.cluster_helpers import wait_for
from tests.integration.test_security_authz import (
    _serves,
    append,
    channel,
    deploy_here,
    refused,
    start_worker,
    tls_of,
    unique,
)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certs.init_ca_dir(tmp_path / "ca")
    return tmp_path / "ca"


def _backup(ch: grpc.Channel, module: str) -> tuple[str, dict[str, bytes]]:
    """One BackupCheckpoint round of group 0 from scratch: the store manifest's JSON and every file's bytes."""
    manifest = ""
    files: dict[str, bytearray] = {}
    stub = pbg.ReplicationStub(ch)
    for chunk in stub.BackupCheckpoint(pb.FetchCheckpointRequest(module=module, group=0, follower="backup-t",
                                                                epoch=1), timeout=30):
        raw = decode_chunk(chunk.SerializeToString())
        if isinstance(raw, pb.CheckpointChunk):
            manifest = raw.info.manifest_json
        else:
            name, _offset, data = raw
            files.setdefault(name, bytearray()).extend(data)
    return manifest, {n: bytes(b) for n, b in files.items()}


def _push(ch: grpc.Channel, module: str, manifest: str, files: dict[str, bytes]) -> pb.RestoreReply:
    msgs = [pb.RestoreChunk(module=module, group=0, manifest_json=manifest)]
    msgs += [pb.RestoreChunk(module=module, group=0, file=n, file_offset=0, data=d) for n, d in files.items()]
    reply: pb.RestoreReply = pbg.ReplicationStub(ch).RestoreCheckpoint(iter(msgs), timeout=30)
    return reply


def test_backup_takes_admin_and_restore_deploy_on_the_new_module(zk_hosts: str, tmp_path: Path, pki: Path) -> None:
    worker_tls = tls_of(pki, Identity("worker", unique("w")))
    app, admin = Identity("app", unique("reader")), Identity("admin", unique("alice"))
    app_tls, admin_tls = tls_of(pki, app), tls_of(pki, admin)
    node = start_worker(zk_hosts, tmp_path, worker_tls)
    ms = Metastore(zk_hosts, session_timeout=4.0)
    ms.start()
    try:
        module = deploy_here(zk_hosts, worker_tls.identity.name, tmp_path / "src")
        ms.acls.grant(app, module, ["query", "append"])
        copy = unique("Copy")
        address = node.worker.address
        with channel(address, app_tls) as app_ch, channel(address, admin_tls) as admin_ch:
            wait_for(lambda: _serves(admin_ch, module), 30, f"module {module} to be served")
            for i in range(20):
                append(admin_ch, module, f"u{i}")
            e = refused(lambda: _backup(app_ch, module))  # an app that reads the module does not copy it out
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'admin'" in e.details(), e
            manifest, files = _backup(admin_ch, module)
            assert manifest and files

            _backup_to_folder(app_ch, admin_ch, module, tmp_path / "backups")

            e = refused(lambda: _push(app_ch, copy, manifest, files))
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'deploy'" in e.details(), e
            assert not (tmp_path / worker_tls.identity.name / copy).exists()
            ms.acls.grant(app, copy, ["deploy"])
            ms.acls.grant(app, module, ["deploy"])
            wait_for(lambda: _granted(app_ch, copy, manifest, files), 20, "the grant to reach the worker")
            assert (tmp_path / worker_tls.identity.name / copy / "0" / "state").exists()
            # a restore only creates: the source module (hosted and deployed) is refused, whoever asks
            e = refused(lambda: _push(app_ch, module, manifest, files))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "exists" in e.details(), e
    finally:
        ms.close()
        node.stop()


def _granted(ch: grpc.Channel, module: str, manifest: str, files: dict[str, bytes]) -> bool:
    try:
        _push(ch, module, manifest, files)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.PERMISSION_DENIED:
            return False
        raise
    return True


def _backup_to_folder(app_ch: grpc.Channel, admin_ch: grpc.Channel, module: str, root: Path) -> None:
    """BackupToFolder takes admin; the worker writes only into a folder holding the request's probe token."""
    (root / "files" / "0").mkdir(parents=True)
    (root / "millrace-backups.json").write_text(json.dumps({"format": 1, "module": module}))
    probe, token = ".probe-" + "0f" * 16, os.urandom(16)
    (root / probe).write_bytes(token)

    def copy(ch: grpc.Channel, token: bytes) -> list[pb.BackupToFolderProgress]:
        req = pb.BackupToFolderRequest(module=module, group=0, backup="t", epoch=1, folder=str(root), probe=probe,
                                       token=token)
        return list(pbg.ReplicationStub(ch).BackupToFolder(req, timeout=30))

    e = refused(lambda: copy(app_ch, token))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "'admin'" in e.details(), e
    e = refused(lambda: copy(admin_ch, b"x" * 16))  # not the folder the admin's CLI wrote: the CLI streams
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED and "another token" in e.details(), e
    assert list((root / "files" / "0").iterdir()) == []
    replies = copy(admin_ch, token)
    assert replies[-1].done and replies[0].info.manifest_json
    assert len(list((root / "files" / "0").iterdir())) == len(json.loads(replies[0].info.manifest_json)["files"])
