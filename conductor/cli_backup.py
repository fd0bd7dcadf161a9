"""`conductor backup` and `conductor restore`: the operator's side of backups (docs/backups.md).

    conductor backup MODULE --to DIR
    conductor restore --from DIR --as NAME [--backup ID] [--timeout 60]

The work is in :mod:`conductor.backups`; this file parses, shows progress bars
and prints the outcome. :mod:`conductor.cli` registers the commands with one
call (:meth:`BackupCommands.register`), handing over its ZooKeeper connection,
its way of printing operator errors and its wait for serving leaders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from conductor.backups.layout import BackupError, BackupFolder
from conductor.backups.restore import restore_backup
from conductor.backups.take import take_backup
from conductor.cli_views import DEV_DIR, ZK_ENV

console = Console()
ZK_HELP = f"ZooKeeper HOST:PORT[,...] (default: ${ZK_ENV}, else {DEV_DIR}/cluster.json)"


@contextmanager
def _bars() -> Iterator[Progress]:
    """A byte progress bar: done/total, rate and time left (plain and transient off a terminal)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        yield progress


class BackupCommands:
    """The backup commands, bound to the main CLI's plumbing (as :class:`conductor.cli_security.SecurityCommands`).

    ``connect(zk)`` yields a started, non-campaigning Conductor; ``operator_errors()`` turns expected errors
    (``cli_error(message)`` among them) into one red line; ``wait_serving(conductor, module, timeout)`` returns
    the module's status document once every group has a leader serving (or the timeout passed).
    """

    def __init__(self, connect: Callable[[str | None], AbstractContextManager[Any]],
                 operator_errors: Callable[[], AbstractContextManager[None]],
                 cli_error: Callable[[str], Exception],
                 wait_serving: Callable[[Any, str, float], dict[str, Any]]) -> None:
        self.connect = connect
        self.operator_errors = operator_errors
        self.cli_error = cli_error
        self.wait_serving = wait_serving

    def register(self, app: typer.Typer) -> None:
        app.command("backup")(self.backup)
        app.command("restore")(self.restore)

    def backup(self,
               module: str = typer.Argument(..., help="the module to back up"),
               to: Path = typer.Option(..., "--to", help="the backup folder (local or mounted; one per module: "
                                                         "later backups reuse the files it holds)"),
               zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
               stream: bool = typer.Option(False, "--stream", help="stream every file through this command even "
                                                                   "where a group's leader sees the folder and "
                                                                   "would copy its files in itself")) -> None:
        """Back up every task group of a running module: a checkpoint of each leader's applied state, its offset
        and epoch, the spec and the code; only files the folder lacks are copied (writers keep running). A leader
        that sees the folder (same machine or mount) copies its group's files in itself."""
        with self.operator_errors():
            try:
                with self.connect(zk) as conductor, _bars() as progress:
                    tasks: dict[int, Any] = {}
                    lock = threading.Lock()

                    def show(group: int, done: int, total: int) -> None:
                        with lock:
                            if group not in tasks:
                                tasks[group] = progress.add_task(f"group {group}", total=total)
                        progress.update(tasks[group], completed=done, total=total)

                    result = take_backup(conductor.ms, module, to, show,
                                         lambda m: console.print(f"[dim]{m}[/dim]"), leader_copies=not stream)
            except BackupError as e:
                raise self.cli_error(str(e)) from None
        m = result.manifest
        offsets = ", ".join(f"{g.group}: {g.applied_offset}@{g.leader_epoch}" for g in m.groups)
        console.print(f"[green]backed up {module}[/green] as [bold]{m.id}[/bold] in {to}: {len(m.groups)} task "
                      f"group(s) (group: applied offset@epoch {offsets}); copied {result.copied_bytes / 1e6:.1f} "
                      f"of {m.total_bytes() / 1e6:.1f} MB in {result.seconds:.1f}s, the rest was there already; "
                      f"{len(result.leader_copied)} group(s) copied in by their leaders, "
                      f"{len(m.groups) - len(result.leader_copied)} streamed here")

    def restore(self,
                source: Path = typer.Option(..., "--from", help="a backup folder written by `conductor backup`"),
                name: str = typer.Option(..., "--as", help="the new module's name (it must not exist)"),
                backup_id: str | None = typer.Option(None, "--backup", help="which backup (default: the latest)"),
                zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
                timeout: float = typer.Option(60.0, "--timeout", help="seconds to wait for every group's leader")
                ) -> None:
        """Create module NAME from a backup, in this cluster or another: every file is verified first, then
        placed by the usual rules; each group's replicas open from its checkpoint."""
        with self.operator_errors():
            started = time.monotonic()
            try:
                folder = BackupFolder(source)
                manifest = folder.open(backup_id)
                with _bars() as progress:
                    task = progress.add_task(f"verifying {manifest.id}", total=manifest.total_bytes())
                    folder.verify(manifest, lambda n: progress.advance(task, n))
                console.print(f"[dim]verified backup {manifest.id} of {manifest.module} "
                              f"({manifest.total_bytes() / 1e6:.1f} MB, every file's CRC32C)[/dim]")
                with self.connect(zk) as conductor:
                    with _bars() as progress:
                        push = progress.add_task("restoring", total=None)
                        restore_backup(conductor, folder, manifest, name,
                                       lambda m: console.print(f"[dim]{m}[/dim]"),
                                       lambda done, total: progress.update(push, completed=done, total=total))
                    st = self.wait_serving(conductor, name, timeout)
            except BackupError as e:
                raise self.cli_error(str(e)) from None
            if st["serving"] < len(st["groups"]):
                raise self.cli_error(f"{name} is restored but not every group serves after {timeout:.0f}s; "
                                     f"follow it with `conductor status {name} --watch`")
        offsets = ", ".join(f"{g.group}: {g.applied_offset}" for g in manifest.groups)
        console.print(f"[green]restored {manifest.module}[/green] (backup {manifest.id}) as [bold]{name}[/bold] "
                      f"in {time.monotonic() - started:.1f}s; groups serve from applied offsets {offsets}")
