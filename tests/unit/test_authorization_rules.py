"""The worker's method -> permission table covers every method it serves, and the checks follow the ACL model."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from conductor.security.acl import Acls, Denied
from conductor.security.identity import Identity
from conductor.wire import admin_pb2, code_pb2
from conductor.wire import millrace_pb2 as pb
from conductor.worker.authorization import RULES, Checker, NotAReplica

APP, WORKER, ADMIN = Identity("app", "billing"), Identity("worker", "n1"), Identity("admin", "alice")


def test_every_served_method_has_a_rule_and_every_rule_a_method() -> None:
    served = {f"/{service.full_name}/{method.name}"
              for module in (pb, code_pb2, admin_pb2) for service in module.DESCRIPTOR.services_by_name.values()
              for method in service.methods}
    assert served - set(RULES) == set(), "a method without a rule is refused: give it one"
    assert set(RULES) - served == set()


def checker(acls: Acls) -> Checker:
    return Checker(SimpleNamespace(acls=acls), SimpleNamespace())  # type: ignore[arg-type]


def check(c: Checker, who: Identity, method: str, request: Any) -> None:
    c.check(who, RULES[method], request)


def test_module_permissions_and_deploy_on_any_module() -> None:
    acls = Acls().grant(APP, "Billing", ["append", "deploy"])
    c = checker(acls)
    check(c, APP, "/millrace.Client/Append", pb.AppendRequest(module="Billing"))
    with pytest.raises(Denied, match=r"'append'.*conductor acl grant app/billing Other append"):
        check(c, APP, "/millrace.Client/Append", pb.AppendRequest(module="Other"))
    with pytest.raises(Denied, match="'query'"):
        check(c, APP, "/millrace.Client/Select", pb.SelectRequest(module="Billing"))
    check(c, APP, "/millrace.code.Code/PutArtifact", None)  # deploy on some module: may store an artifact
    check(c, APP, "/millrace.code.Code/Prepare", code_pb2.PrepareRequest(module="Billing"))
    with pytest.raises(Denied, match="'deploy'"):
        check(c, APP, "/millrace.code.Code/Prepare", code_pb2.PrepareRequest(module="Other"))
    with pytest.raises(Denied, match="on any module"):
        check(checker(Acls()), APP, "/millrace.code.Code/PutArtifact", None)
    with pytest.raises(Denied, match="'admin'"):
        check(c, APP, "/millrace.admin.Admin/Ping", admin_pb2.PingRequest())
    check(c, ADMIN, "/millrace.admin.Admin/Ping", admin_pb2.PingRequest())
    # an app that may query its module loads the module's code (its client routes with it): query on some module
    check(checker(Acls().grant(APP, "Billing", ["query"])), APP, "/millrace.code.Code/FetchArtifact",
          code_pb2.FetchArtifactRequest(sha256="ab"))
    with pytest.raises(Denied, match="'query'"):
        check(c, APP, "/millrace.code.Code/FetchArtifact", code_pb2.FetchArtifactRequest(sha256="ab"))
    with pytest.raises(Denied, match="'deploy'"):  # a worker never ships code
        check(c, WORKER, "/millrace.code.Code/Prepare", code_pb2.PrepareRequest(module="Billing"))


def test_checkpoints_go_only_to_the_groups_replicas_each_for_itself() -> None:
    groups = {("Billing", 0): ("n1", "n2", "n3")}
    c = Checker(SimpleNamespace(acls=Acls()), SimpleNamespace(),  # type: ignore[arg-type]
                lambda module, group: groups.get((module, group)))
    method = "/millrace.Replication/FetchCheckpoint"
    req = pb.FetchCheckpointRequest(module="Billing", group=0, follower="n1")
    check(c, WORKER, method, req)
    with pytest.raises(NotAReplica, match="for itself"):  # another replica, fetching in n1's name
        check(c, Identity("worker", "n2"), method, req)
    with pytest.raises(NotAReplica, match="only a replica"):
        check(c, ADMIN, method, req)
    with pytest.raises(NotAReplica, match=r"not a replica of Billing/0 \(its replicas: \['n1', 'n2', 'n3'\]\)"):
        check(c, Identity("worker", "n4"), method, pb.FetchCheckpointRequest(module="Billing", group=0,
                                                                            follower="n4"))
    with pytest.raises(NotAReplica, match="hosts no replica"):  # a group this worker does not host: nobody
        check(c, WORKER, method, pb.FetchCheckpointRequest(module="Billing", group=1, follower="n1"))
    with pytest.raises(NotAReplica):  # without the worker's view of its groups (fail closed)
        check(checker(Acls()), WORKER, method, req)


def test_answers_are_forgotten_when_the_watch_replaces_the_acls() -> None:
    cache = SimpleNamespace(acls=Acls())
    c = Checker(cache, SimpleNamespace())  # type: ignore[arg-type]
    assert not c.allowed(APP, "Billing", "append")
    cache.acls = cache.acls.grant(APP, "Billing", ["append"])
    assert c.allowed(APP, "Billing", "append")


def test_a_backup_takes_admin_on_the_module_and_a_restore_deploy_on_the_one_it_creates() -> None:
    acls = Acls().grant(APP, "Billing", ["query", "append"]).grant(Identity("app", "ops"), "Billing", ["admin"]) \
        .grant(Identity("app", "ci"), "Copy", ["deploy"])
    c = checker(acls)
    backup, restore = "/millrace.Replication/BackupCheckpoint", "/millrace.Replication/RestoreCheckpoint"
    req = pb.FetchCheckpointRequest(module="Billing", group=0, follower="backup-x")
    check(c, ADMIN, backup, req)
    check(c, Identity("app", "ops"), backup, req)
    with pytest.raises(Denied, match="'admin'"):  # an app that reads its module does not copy it out whole
        check(c, APP, backup, req)
    with pytest.raises(Denied, match="'admin'"):  # nor does a worker (a far-horizon copy is FetchCheckpoint's)
        check(c, WORKER, backup, req)
    check(c, Identity("app", "ci"), restore, pb.RestoreChunk(module="Copy"))
    with pytest.raises(Denied, match="'deploy'"):
        check(c, Identity("app", "ci"), restore, pb.RestoreChunk(module="Billing"))
    with pytest.raises(Denied, match="'deploy'"):
        check(c, APP, restore, pb.RestoreChunk(module="Copy"))
