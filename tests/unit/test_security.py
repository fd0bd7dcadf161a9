"""conductor/security without a network: certificates, identities, TLS file checks, tokens and ACL decisions."""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from conductor.security import acl, certs, identity, tokens
from conductor.security.acl import ALL_MODULES, Acls, Denied, UnknownPermission
from conductor.security.identity import BadIdentity, Identity, MissingCertificate, MissingSan
from conductor.security.tls import TlsError, TlsFiles, TlsSource, load_material

APP = Identity("app", "billing")
W1 = Identity("worker", "n1")


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    certs.init_ca_dir(tmp_path / "ca")
    return tmp_path / "ca"


# ---- certificates and identities -----------------------------------------------------------------------


def test_issue_and_parse_round_trip(ca_dir: Path) -> None:
    issued = certs.issue_to_dir(ca_dir, W1, hosts=["localhost", "10.0.0.11"], days=30)
    pem = issued.cert.read_bytes()
    assert identity.from_pem(pem) == W1
    cert = x509.load_pem_x509_certificate(pem)
    assert identity.from_der(cert.public_bytes(serialization.Encoding.DER)) == W1
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.11"]
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["millrace://worker/n1"]
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
    ca = x509.load_pem_x509_certificate((ca_dir / certs.CA_CERT).read_bytes())
    cert.verify_directly_issued_by(ca)


def test_keys_are_private_files(ca_dir: Path) -> None:
    issued = certs.issue_to_dir(ca_dir, APP)
    for key in (ca_dir / certs.CA_KEY, issued.key):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert not list(ca_dir.glob(".*tmp*")), "no temporary file is left behind"


def test_init_refuses_to_replace_a_ca(ca_dir: Path) -> None:
    with pytest.raises(certs.CertError, match="already exists"):
        certs.init_ca_dir(ca_dir)


def test_issue_without_a_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(certs.CertError, match=r"conductor certs init"):
        certs.issue_to_dir(tmp_path, APP)


def test_certificate_without_san_teaches(ca_dir: Path) -> None:
    issued = certs.issue_to_dir(ca_dir, None, hosts=["localhost"])
    with pytest.raises(MissingSan, match=r"missing SAN.*conductor certs issue --role"):
        identity.from_pem(issued.cert.read_bytes())


def test_identity_parse_and_validation() -> None:
    assert identity.parse("millrace://app/billing") == APP
    assert identity.parse("app/billing") == APP
    assert str(APP) == "app/billing" and APP.uri == "millrace://app/billing"
    with pytest.raises(BadIdentity, match="roles are worker, conductor, admin, app"):
        identity.parse("root/x")
    with pytest.raises(BadIdentity, match="ROLE/NAME"):
        identity.parse("billing")
    with pytest.raises(BadIdentity, match="bad name"):
        Identity("app", "../etc")


def test_peercert_dict_form() -> None:
    peercert = {"subject": ((("commonName", "app/billing"),),),
                "subjectAltName": (("DNS", "localhost"), ("URI", "millrace://app/billing"))}
    assert identity.from_peercert(peercert) == APP
    with pytest.raises(MissingSan):
        identity.from_peercert({"subject": ((("commonName", "x"),),), "subjectAltName": (("DNS", "x"),)})
    with pytest.raises(MissingCertificate, match="bearer token"):
        identity.from_peercert({})


def test_grpc_context_without_certificate_teaches() -> None:
    class NoTls:
        def auth_context(self) -> dict[str, list[bytes]]:
            return {}

    with pytest.raises(MissingCertificate, match="no client certificate"):
        identity.from_grpc_context(NoTls())


# ---- TLS files -----------------------------------------------------------------------------------------


def test_material_loads_and_hides_the_key(ca_dir: Path) -> None:
    certs.issue_to_dir(ca_dir, W1)
    material = load_material(TlsFiles.in_dir(ca_dir, W1))
    assert material.identity == W1
    assert b"PRIVATE KEY" in material.key
    assert "PRIVATE" not in repr(material)


def test_material_refuses_a_key_of_another_certificate(ca_dir: Path) -> None:
    certs.issue_to_dir(ca_dir, W1)
    other = certs.issue_to_dir(ca_dir, APP)
    files = TlsFiles.in_dir(ca_dir, W1)
    with pytest.raises(TlsError, match="does not belong to the certificate"):
        load_material(TlsFiles(files.ca, files.cert, other.key))


def test_material_refuses_a_certificate_of_another_ca(ca_dir: Path, tmp_path: Path) -> None:
    certs.init_ca_dir(tmp_path / "other")
    foreign = certs.issue_to_dir(tmp_path / "other", W1)
    with pytest.raises(TlsError, match=r"not issued by the CA.*another CA"):
        load_material(TlsFiles(ca_dir / certs.CA_CERT, foreign.cert, foreign.key))


def test_material_refuses_an_expired_certificate(ca_dir: Path) -> None:
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    certs.issue_to_dir(ca_dir, W1, days=2, not_before=past)
    with pytest.raises(TlsError, match=r"expired on .* issue a new one with `conductor certs issue"):
        TlsSource(TlsFiles.in_dir(ca_dir, W1))


def test_missing_file_names_it(ca_dir: Path) -> None:
    with pytest.raises(TlsError, match=r"worker-n1.pem is missing"):
        TlsSource(TlsFiles.in_dir(ca_dir, W1))


def test_source_reloads_on_change_and_keeps_the_old_on_a_bad_change(ca_dir: Path, tmp_path: Path) -> None:
    certs.issue_to_dir(ca_dir, W1)
    files = TlsFiles.in_dir(ca_dir, W1)
    source = TlsSource(files)
    first, gen = source.current()
    assert source.current() == (first, gen), "unchanged files: same material, same generation"
    certs.issue_to_dir(ca_dir, W1)  # a rotation
    second, gen2 = source.current()
    assert gen2 == gen + 1 and second.cert != first.cert
    files.key.write_bytes(b"not a key")  # a broken change: keep serving the last good material
    assert source.current() == (second, gen2)


# ---- tokens --------------------------------------------------------------------------------------------


def test_token_verifies_and_only_its_hash_is_stored() -> None:
    token, record = tokens.generate(APP)
    assert token.startswith(f"mrt.{record.token_id}.")
    assert token not in record.to_json().decode()
    assert tokens.TokenRecord.from_json(record.to_json()) == record
    assert tokens.verify(token, record) == APP


def test_token_refusals_never_repeat_the_token() -> None:
    token, record = tokens.generate(APP)
    wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for presented, rec in ((wrong, record), (token, None)):
        with pytest.raises(tokens.TokenRefused, match="unknown or revoked") as e:
            tokens.verify(presented, rec)
        assert presented.split(".")[2] not in str(e.value)
    with pytest.raises(tokens.TokenRefused, match="not a Millrace token"):
        tokens.verify("Bearer abc", record)
    _, other_record = tokens.generate(APP)
    with pytest.raises(tokens.TokenRefused):
        tokens.verify(token, other_record)  # a record stored under another id never vouches for this token


# ---- ACL decisions -------------------------------------------------------------------------------------


def test_roles_imply_their_permissions() -> None:
    none = Acls()
    admin, conductor = Identity("admin", "ops"), Identity("conductor", "c1")
    assert all(acl.allowed(none, admin, "m", p) for p in acl.PERMISSIONS)
    assert {p for p in acl.PERMISSIONS if acl.allowed(none, conductor, "m", p)} == {"query", "deploy", "admin", "view"}
    assert {p for p in acl.PERMISSIONS if acl.allowed(none, W1, "m", p)} == {"append", "query"}
    assert not any(acl.allowed(none, APP, "m", p) for p in acl.PERMISSIONS)


def test_grants_per_module_and_for_all_modules() -> None:
    acls = Acls().grant(APP, "billing", ["append"]).grant(APP, ALL_MODULES, ["query"])
    assert acl.allowed(acls, APP, "billing", "append")
    assert acl.allowed(acls, APP, "other", "query")
    assert not acl.allowed(acls, APP, "other", "append")
    assert not acl.allowed(acls, Identity("app", "else"), "billing", "append")
    assert not acl.allowed(acls, W1, "billing", "deploy"), "a grant to an app gives a worker nothing"
    revoked = acls.revoke(APP, "billing")
    assert not acl.allowed(revoked, APP, "billing", "append") and acl.allowed(revoked, APP, "billing", "query")
    assert "billing" not in revoked.grants
    assert Acls.from_json(acls.to_json()) == acls
    assert list(acls.rows()) == [("*", APP, frozenset({"query"})), ("billing", APP, frozenset({"append"}))]


def test_denied_names_who_what_and_the_fix() -> None:
    with pytest.raises(Denied) as e:
        acl.require(Acls(), APP, "billing", "deploy")
    msg = str(e.value)
    assert "app/billing" in msg and "'billing'" in msg and "'deploy'" in msg
    assert "conductor acl grant app/billing billing deploy" in msg
    with pytest.raises(UnknownPermission, match="permissions are append, query, deploy, admin"):
        Acls().grant(APP, "billing", ["write"])


def test_a_bad_change_is_logged_once_and_never_with_key_bytes(ca_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    certs.issue_to_dir(ca_dir, W1)
    files = TlsFiles.in_dir(ca_dir, W1)
    source = TlsSource(files)
    secret = files.key.read_bytes()
    other = certs.issue_to_dir(ca_dir, APP)
    files.key.write_bytes(other.key.read_bytes())  # the key of another certificate
    with caplog.at_level("WARNING", logger="millrace.security"):
        for _ in range(3):
            source.current()
        files.key.unlink()
        for _ in range(3):
            source.current()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "does not belong" in warnings[0] and "missing" in warnings[1]
    text = "\n".join(warnings)
    assert "PRIVATE KEY" not in text and secret.decode().splitlines()[1] not in text


def test_presented_token_from_grpc_metadata() -> None:
    assert tokens.presented_token([("x-other", "1"), ("authorization", "Bearer mrt.a.b")]) == "mrt.a.b"
    assert tokens.presented_token([("Authorization", b"bearer mrt.a.b ")]) == "mrt.a.b"
    assert tokens.presented_token([("authorization", "Basic abc")]) is None
    assert tokens.presented_token(None) is None


def test_zk_roles_give_workers_only_what_they_must_write() -> None:
    from kazoo.security import Permissions

    from conductor.metastore.layout import (
        ACLS_PATH,
        NODES_PATH,
        TOKENS_PATH,
        group_path,
        module_path,
        version_path,
    )
    from conductor.metastore.zk_auth import ROLES_PATH, ZkPrincipal, ZkRoles, cluster_acl, digest_id

    control, worker = ZkPrincipal("millrace", "c" * 32), ZkPrincipal("millrace-worker", "w" * 32)
    one = ZkRoles(digest_id(control))
    assert one.acl_for(group_path("M", 0)) == cluster_acl(control), "one user: the ACL of before"
    roles = ZkRoles(digest_id(control), digest_id(worker))

    def worker_perms(path: str) -> int:
        return sum(a.perms for a in roles.acl_for(path) if a.id.id == digest_id(worker))

    assert worker_perms(group_path("M", 3)) == Permissions.READ | Permissions.WRITE
    assert worker_perms(NODES_PATH) == Permissions.READ | Permissions.CREATE | Permissions.DELETE
    assert worker_perms(f"{NODES_PATH}/n1") == Permissions.ALL
    assert worker_perms(f"{module_path('M')}/resign") == Permissions.READ | Permissions.DELETE
    for path in (module_path("M"), version_path("M", "ab" * 32), ACLS_PATH, TOKENS_PATH, ROLES_PATH,
                 f"{module_path('M')}/groups", f"{module_path('M')}/resign/0"):
        assert worker_perms(path) == 0, path
        assert any(a.id.id == digest_id(control) and a.perms == Permissions.ALL for a in roles.acl_for(path))
    assert ZkRoles.from_json(roles.to_json()) == roles
