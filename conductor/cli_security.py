"""`conductor certs`, `conductor acl` and `conductor token`: the operator's side of security.

    conductor certs init DIR [--days 3650]
    conductor certs issue --role worker|conductor|admin|app --name NAME [--host H ...] [--days 365] DIR
    conductor acl grant IDENTITY MODULE PERMISSION...      (IDENTITY is ROLE/NAME, MODULE a module or '*')
    conductor acl revoke IDENTITY MODULE [PERMISSION...]   (no permission: all of them)
    conductor acl list [MODULE] [--json]
    conductor token create --name APP                      (prints the token once; only its hash is stored)
    conductor token revoke TOKEN_ID
    conductor token list

The commands live here and :mod:`conductor.cli` registers them with one call
(:meth:`SecurityCommands.register`), handing over its ZooKeeper connection and its
way of printing operator errors, so both files report errors the same way and
neither imports the other's internals.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from conductor.cli_views import DEV_DIR, ZK_ENV
from conductor.security import certs
from conductor.security.acl import PERMISSIONS, ROLE_PERMISSIONS, UnknownPermission
from conductor.security.identity import ROLES, Identity, IdentityError, parse
from conductor.security.tls import TlsError
from conductor.security.tokens import generate

console = Console()

#: errors of this package written for operators; the CLI shows them as one red line
SECURITY_ERRORS = (certs.CertError, TlsError, IdentityError, UnknownPermission)
ZK_HELP = f"ZooKeeper HOST:PORT[,...] (default: ${ZK_ENV}, else {DEV_DIR}/cluster.json)"


class SecurityCommands:
    """The security sub-commands, bound to the main CLI's connection and error plumbing.

    ``connect(zk)`` is a context manager yielding an object whose ``.ms`` is a
    started :class:`~conductor.metastore.Metastore`; ``operator_errors()`` turns
    ``cli_error(message)`` (and the main CLI's other expected errors) into one red line.
    """

    def __init__(self, connect: Callable[[str | None], AbstractContextManager[Any]],
                 operator_errors: Callable[[], AbstractContextManager[None]],
                 cli_error: Callable[[str], Exception]) -> None:
        self.connect = connect
        self.operator_errors = operator_errors
        self.cli_error = cli_error

    def register(self, app: typer.Typer) -> None:
        certs_app = typer.Typer(help="Make a CA and certificates (development and tests; production brings "
                                     "its own CA).", no_args_is_help=True)
        certs_app.command("init")(self.certs_init)
        certs_app.command("issue")(self.certs_issue)
        acl_app = typer.Typer(help="Grant, revoke and list per-module permissions (append, query, deploy, "
                                   "admin).", no_args_is_help=True)
        acl_app.command("grant")(self.acl_grant)
        acl_app.command("revoke")(self.acl_revoke)
        acl_app.command("list")(self.acl_list)
        token_app = typer.Typer(help="Bearer tokens for apps that cannot hold a certificate.",
                                no_args_is_help=True)
        token_app.command("create")(self.token_create)
        token_app.command("revoke")(self.token_revoke)
        token_app.command("list")(self.token_list)
        app.add_typer(certs_app, name="certs")
        app.add_typer(acl_app, name="acl")
        app.add_typer(token_app, name="token")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """The main CLI's operator errors, plus this package's (raised again as the CLI's error type)."""
        with self.operator_errors():
            try:
                yield
            except SECURITY_ERRORS as e:
                raise self.cli_error(str(e)) from None

    # ---- certs -----------------------------------------------------------------------------------------

    def certs_init(
        self,
        directory: Path = typer.Argument(..., help="where to write ca.pem and ca.key (0600)"),
        name: str = typer.Option("Millrace dev CA", "--name", help="the CA's common name"),
        days: int = typer.Option(certs.CA_VALIDITY_DAYS, "--days", help="validity in days"),
    ) -> None:
        """Make a certificate authority for a development or test cluster."""
        with self._errors():
            ca = certs.init_ca_dir(directory, name=name, days=days)
            console.print(f"[green]made a CA[/green] in {directory}: {ca.name} (give it to every process) and "
                          f"{certs.CA_KEY} (0600, keep it private); next: `conductor certs issue --role worker "
                          f"--name n1 --host HOST {directory}`")

    def certs_issue(
        self,
        directory: Path = typer.Argument(..., help="the CA directory (`conductor certs init`)"),
        role: str = typer.Option(..., "--role", help=f"one of: {', '.join(ROLES)}"),
        name: str = typer.Option(..., "--name", help="the node id of a worker, or the app's / person's name"),
        host: list[str] = typer.Option([], "--host", help="a DNS name or IP the process is reached at (repeat)"),
        days: int = typer.Option(certs.DEFAULT_VALIDITY_DAYS, "--days", help="validity in days"),
        out: Path | None = typer.Option(None, "--out", help="write the files here instead of DIR"),
    ) -> None:
        """Issue a certificate whose SAN URI is millrace://ROLE/NAME (re-issuing rotates it in place)."""
        with self._errors():
            identity = Identity(role, name)
            issued = certs.issue_to_dir(directory, identity, hosts=host, days=days, out=out)
            console.print(f"[green]issued[/green] {identity.uri} ({', '.join(host) or 'no host names'}; "
                          f"{days} days): {issued.cert}, {issued.key} (0600), CA {issued.ca}")

    # ---- acl -------------------------------------------------------------------------------------------

    def acl_grant(
        self,
        identity: str = typer.Argument(..., help="ROLE/NAME, e.g. app/billing"),
        module: str = typer.Argument(..., help="a module name, or '*' for every module"),
        permission: list[str] = typer.Argument(..., help=f"one or more of: {', '.join(PERMISSIONS)}"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Give IDENTITY permissions on MODULE (workers see it as soon as their watch fires)."""
        with self._errors():
            who = parse(identity)
            with self.connect(zk) as c:
                acls = c.ms.acls.grant(who, module, permission)
            console.print(f"[green]granted[/green] {', '.join(sorted(permission))} on {module} to {who}; "
                          f"{who} now has: {', '.join(sorted(acls.granted(who, module))) or 'nothing'}")

    def acl_revoke(
        self,
        identity: str = typer.Argument(..., help="ROLE/NAME, e.g. app/billing"),
        module: str = typer.Argument(..., help="a module name, or '*'"),
        permission: list[str] | None = typer.Argument(None, help="what to take away (default: everything)"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Take permissions of IDENTITY on MODULE away (what its role implies stays)."""
        with self._errors():
            who = parse(identity)
            with self.connect(zk) as c:
                acls = c.ms.acls.revoke(who, module, permission or None)
            left = sorted(acls.granted(who, module))
            console.print(f"[green]revoked[/green] {', '.join(sorted(permission or PERMISSIONS))} on {module} "
                          f"from {who}; granted now: {', '.join(left) or 'nothing'}")

    def acl_list(
        self,
        module: str | None = typer.Argument(None, help="only this module's grants (and those on '*')"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    ) -> None:
        """Show the grants; every role's implied permissions are listed under the table."""
        with self._errors(), self.connect(zk) as c:
            acls, _ = c.ms.acls.get()
        rows = [(m, str(i), sorted(p)) for m, i, p in acls.rows() if module is None or m in (module, "*")]
        if as_json:
            print(json.dumps([{"module": m, "identity": i, "permissions": p} for m, i, p in rows], indent=2))
            return
        table = Table(title="Millrace ACLs" + (f" for {module}" if module else ""))
        table.add_column("module", style="bold")
        table.add_column("identity")
        table.add_column("permissions", style="green")
        for m, i, p in rows:
            table.add_row(m, i, ", ".join(p))
        if not rows:
            table.add_row("-", "-", "no grants: `conductor acl grant ROLE/NAME MODULE PERMISSION...`")
        console.print(table)
        implied = "; ".join(f"{r}: {', '.join(sorted(p)) or 'nothing'}" for r, p in ROLE_PERMISSIONS.items())
        console.print(f"[dim]without any grant, on every module: {implied}[/dim]")

    # ---- tokens ----------------------------------------------------------------------------------------

    def token_create(
        self,
        name: str = typer.Option(..., "--name", help="the app the token authenticates (identity app/NAME)"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Make a bearer token for app/NAME; it is printed once and only its hash is stored."""
        with self._errors():
            token, record = generate(Identity("app", name))
            with self.connect(zk) as c:
                c.ms.tokens.put(record)
            console.print(f"[green]token {record.token_id}[/green] for {record.identity} (shown once, store it "
                          f"as a secret; grant it permissions with `conductor acl grant {record.identity} ...`):")
            print(token)

    def token_revoke(
        self,
        token_id: str = typer.Argument(..., help="the id (the part after 'mrt.'), from `conductor token list`"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Revoke a token: workers refuse it as soon as their watch fires."""
        with self._errors(), self.connect(zk) as c:
            if not c.ms.tokens.revoke(token_id):
                raise self.cli_error(f"no token {token_id!r}; `conductor token list` shows the ids")
        console.print(f"[green]revoked[/green] token {token_id}")

    def token_list(
        self,
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """List tokens by id and identity (the tokens themselves are not stored)."""
        with self._errors(), self.connect(zk) as c:
            records = c.ms.tokens.all()
        table = Table(title="Millrace tokens")
        table.add_column("id", style="bold")
        table.add_column("identity")
        for r in records:
            table.add_row(r.token_id, str(r.identity))
        console.print(table)
