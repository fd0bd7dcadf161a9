"""A process's TLS settings (conductor.security.config): which files, and the safe-by-default bind rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.security import certs
from conductor.security.config import TLS_SETTINGS, check_bind, tls_files, tls_source
from conductor.security.identity import Identity
from conductor.settings import SettingsError, is_loopback, resolve

W1 = Identity("worker", "n1")


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certs.init_ca_dir(tmp_path / "pki")
    for who in (W1, Identity("admin", "alice")):
        certs.issue_to_dir(tmp_path / "pki", who, hosts=["127.0.0.1"])
    return tmp_path / "pki"


def test_tls_dir_names_the_files_of_the_process_role_and_name(pki: Path) -> None:
    files = tls_files({"tls_dir": pki}, "worker", "n1")
    assert files is not None and files.cert == pki / "worker-n1.pem" and files.ca == pki / "ca.pem"
    admin = tls_files({"tls_dir": pki}, "admin")  # the CLI: the one admin certificate in the folder
    assert admin is not None and admin.key == pki / "admin-alice.key"
    assert tls_files({}, "worker", "n1") is None


def test_explicit_paths_win_and_must_come_together(pki: Path) -> None:
    files = tls_files({"tls_dir": pki, "tls_cert": pki / "x.pem", "tls_key": pki / "x.key"}, "worker", "n1")
    assert files is not None and files.cert == pki / "x.pem" and files.ca == pki / "ca.pem"
    with pytest.raises(SettingsError, match="both --tls-cert and --tls-key"):
        tls_files({"tls_cert": pki / "x.pem"}, "worker", "n1")
    with pytest.raises(SettingsError, match="--tls-ca"):
        tls_files({"tls_cert": pki / "x.pem", "tls_key": pki / "x.key"}, "worker", "n1")


def test_a_missing_or_foreign_certificate_stops_the_process_with_a_teaching_error(pki: Path) -> None:
    with pytest.raises(SettingsError, match=r"worker-n2\.pem is missing.*conductor certs issue"):
        tls_source({"tls_dir": pki}, "worker", "n2")
    with pytest.raises(SettingsError, match="0 conductor certificates"):
        tls_source({"tls_dir": pki}, "conductor")
    # n1's files handed to node n2 by path: the certificate names another identity
    with pytest.raises(SettingsError, match="is worker/n1, not worker/n2"):
        tls_source({"tls_cert": pki / "worker-n1.pem", "tls_key": pki / "worker-n1.key", "tls_ca": pki / "ca.pem"},
                   "worker", "n2")
    source = tls_source({"tls_dir": pki}, "worker", "n1")
    assert source is not None and source.identity == W1


def test_a_reachable_plaintext_bind_needs_insecure(pki: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.11")
    assert check_bind("worker n1", "127.0.0.1", None, False) == "plaintext on loopback"
    with pytest.raises(SettingsError, match=r"without TLS.*--tls-dir.*--insecure"):
        check_bind("worker n1", "0.0.0.0", None, False)
    assert "INSECURE" in check_bind("worker n1", "0.0.0.0", None, True)
    source = tls_source({"tls_dir": pki}, "worker", "n1")
    assert check_bind("worker n1", "0.0.0.0", source, False) == "mutual TLS as worker/n1"


def test_insecure_is_a_switch_from_flag_environment_or_file() -> None:
    assert resolve({"insecure": True}, TLS_SETTINGS, "worker", environ={})["insecure"] is True
    assert resolve({}, TLS_SETTINGS, "worker", environ={"MILLRACE_INSECURE": "1"})["insecure"] is True
    assert resolve({}, TLS_SETTINGS, "worker", environ={})["insecure"] is False
    with pytest.raises(SettingsError):
        resolve({}, TLS_SETTINGS, "worker", environ={"MILLRACE_INSECURE": "maybe"})


def test_the_token_port_is_on_by_default_only_where_every_token_is_checked() -> None:
    from conductor.worker.__main__ import TOKEN_PORT_OFF, parse_token_port, token_port

    assert parse_token_port("off") == TOKEN_PORT_OFF and parse_token_port("7001") == 7001
    assert token_port(None, tls=True, authorize=True) == 0  # a free port
    assert token_port(7001, tls=True, authorize=True) == 7001
    assert token_port(TOKEN_PORT_OFF, tls=True, authorize=True) is None
    assert token_port(None, tls=False, authorize=True) is None and token_port(None, tls=True, authorize=False) is None
    for tls, authorize in ((False, True), (True, False)):
        with pytest.raises(SettingsError, match="needs TLS"):
            token_port(7001, tls=tls, authorize=authorize)


def test_an_app_gives_a_certificate_or_a_token_with_the_ca(pki: Path) -> None:
    from conductor.client.credentials import app_credentials
    from conductor.client.errors import ClientError

    plain = app_credentials(None, None, None)
    assert plain.credentials is None and not plain.token_port
    token = app_credentials(None, "mrt.abc.def", pki / "ca.pem")
    assert token.token_port and token.tls is None and token.credentials is not None
    with pytest.raises(ClientError, match="needs ca="):
        app_credentials(None, "mrt.abc.def", None)
    with pytest.raises(ClientError, match="give token="):
        app_credentials(None, None, pki / "ca.pem")
