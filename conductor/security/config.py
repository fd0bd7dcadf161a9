"""A process's TLS settings: where its PEM files are, or ``--insecure``; and the rule that keeps a cluster safe
by default.

Every process that opens or serves a link (a worker, a conductor, the CLI, an app)
takes the same settings, with the precedence of :mod:`conductor.settings` (flag,
``MILLRACE_*`` variable, TOML, default):

* ``--tls-dir DIR``: the layout ``conductor certs issue`` writes (``ca.pem``,
  ``<role>-<name>.pem`` and ``.key``); the process knows its role and, for a worker
  or a conductor, its name; a process without a name (the CLI) takes the one
  certificate of its role in the folder;
* ``--tls-ca/--tls-cert/--tls-key``: explicit paths (a CA's own layout; they win
  over ``--tls-dir``, whose ``ca.pem`` is the default CA);
* ``--insecure``: plaintext on purpose.

**Safe by default** (:func:`check_bind`): a server that binds an address other
machines can reach refuses to start without TLS unless ``--insecure`` says the
operator means it; loopback needs neither (one machine, as in `conductor dev`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conductor.security.identity import ROLES, Identity
from conductor.security.tls import TlsError, TlsFiles, TlsSource
from conductor.settings import Setting, SettingsError, is_loopback, parse_bool

#: the TLS settings of every process (names are the TOML keys; flags and variables derive from them)
TLS_SETTINGS = [
    Setting("tls_dir", None, Path, help="folder of `conductor certs issue` files: ca.pem, <role>-<name>.pem/.key"),
    Setting("tls_ca", None, Path, help="CA bundle (PEM) that peers' certificates must chain to (default: "
                                       "--tls-dir's ca.pem)"),
    Setting("tls_cert", None, Path, help="this process's certificate (PEM; wins over --tls-dir)"),
    Setting("tls_key", None, Path, help="this process's private key (PEM, unencrypted, 0600)"),
    Setting("insecure", False, parse_bool, help="serve and connect in plaintext on purpose (without TLS, a "
                                                "non-loopback bind is refused unless this is given)"),
]


def tls_files(values: Mapping[str, Any], role: str, name: str | None = None) -> TlsFiles | None:
    """The files the settings name for a process of ``role`` (and ``name``, if it has one); None: no TLS."""
    assert role in ROLES, role
    tls_dir, ca, cert, key = (values.get(k) for k in ("tls_dir", "tls_ca", "tls_cert", "tls_key"))
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise SettingsError("give both --tls-cert and --tls-key (or --tls-dir)")
        if ca is None:
            if tls_dir is None:
                raise SettingsError("give --tls-ca (the CA bundle peers' certificates chain to) with --tls-cert")
            ca = Path(tls_dir) / "ca.pem"
        return TlsFiles(Path(ca), Path(cert), Path(key))
    if tls_dir is None:
        if ca is not None:
            raise SettingsError("--tls-ca alone is not enough: give --tls-cert and --tls-key, or --tls-dir")
        return None
    directory = Path(tls_dir)
    if name is None:
        found = sorted(directory.glob(f"{role}-*.pem"))
        if len(found) != 1:
            raise SettingsError(f"--tls-dir {directory} holds {len(found)} {role} certificates "
                                f"({', '.join(p.name for p in found) or 'none'}); make one with `conductor certs "
                                f"issue --role {role} --name NAME {directory}` or name yours with --tls-cert/--tls-key")
        name = found[0].stem[len(role) + 1:]
    files = TlsFiles.in_dir(directory, Identity(role, name))
    if ca is not None:
        files = TlsFiles(Path(ca), files.cert, files.key)
    return files


def tls_source(values: Mapping[str, Any], role: str, name: str | None = None) -> TlsSource | None:
    """:func:`tls_files`, loaded and checked (the error names the file and what to do); None: no TLS."""
    files = tls_files(values, role, name)
    if files is None:
        return None
    try:
        source = TlsSource(files)
    except TlsError as e:
        raise SettingsError(str(e)) from None
    if source.identity.role != role or (name is not None and source.identity.name != name):
        expected = f"{role}/{name}" if name is not None else f"a {role}"
        raise SettingsError(f"the certificate {files.cert} is {source.identity}, not {expected}: issue one with "
                            f"`conductor certs issue --role {role} --name {name or 'NAME'} DIR`")
    return source


def check_bind(what: str, host: str, tls: TlsSource | None, insecure: bool) -> str:
    """Refuse a reachable plaintext bind unless ``--insecure``; the security words of the start line."""
    if tls is not None:
        return f"mutual TLS as {tls.identity}"
    if insecure:
        return "INSECURE: plaintext, no authentication (--insecure)"
    if not is_loopback(host):
        raise SettingsError(f"{what} binds {host}, which other machines can reach, without TLS: give --tls-dir "
                            "(or --tls-cert/--tls-key/--tls-ca; make them with `conductor certs init|issue`), or "
                            "--insecure to serve plaintext on purpose")
    return "plaintext on loopback"
