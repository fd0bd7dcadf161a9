"""`conductor trim`: delete a depot's records below an offset, on every replica (one replog entry per group).

    conductor trim MODULE DEPOT --before N [--task T]     (no --task: every partition of the depot)

Each partition's trim goes to its group's leader, which clamps it to the applied end (records not yet
applied are never trimmed: pstate/retention.py, the promise rule) and answers once the trim is applied.
Registered by :mod:`conductor.cli` with one call (:func:`register`), which hands over its ZooKeeper
connection and error plumbing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import grpc
import typer
from rich.console import Console
from rich.table import Table

from conductor.cli_views import ZK_ENV
from conductor.client.router import LeaderRouter
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.channels import open_channel
from conductor.wire.errors import error_from_rpc

console = Console()
TIMEOUT_S = 30.0


def register(app: typer.Typer, connect: Callable[[str | None], AbstractContextManager[Any]],
             operator_errors: Callable[[], AbstractContextManager[None]], cli_error: Callable[[str], Exception],
             zk_help: str) -> None:
    """Add ``trim`` to ``app``."""

    @app.command("trim")
    def trim(module: str = typer.Argument(..., help="the module"),
             depot: str = typer.Argument(..., help="the depot, e.g. '*clicks'"),
             before: int = typer.Option(..., "--before", min=0, help="delete records below this offset"),
             task: int | None = typer.Option(None, "--task", min=0, help="only this partition (default: all)"),
             zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=zk_help)) -> None:
        """Delete DEPOT's records below --before (clamped to each partition's applied end), on every replica.

        Retention by age and size (`depot.retention.ms`, `depot.retention.bytes`) trims on its own; this is
        the manual form. Readers asking for a trimmed offset then get OffsetOutOfRange.
        """
        with operator_errors(), connect(zk) as conductor:
            spec, _ = conductor.ms.modules.get(module)
            tasks = [task] if task is not None else list(range(spec.tasks))
            if task is not None and task >= spec.tasks:
                raise cli_error(f"task {task} is outside [0, {spec.tasks}) for module {module}")
            router = LeaderRouter(conductor.ms)
            table = Table("task", "group", "start after the trim")
            for t in tasks:
                group = spec.group_of(t)
                address, _epoch = router.leader(module, group)
                with open_channel(address) as channel:
                    try:
                        reply = pbg.ClientStub(channel).DepotTrim(
                            pb.DepotTrimRequest(module=module, depot=depot, task=t, before=before), timeout=TIMEOUT_S)
                    except grpc.RpcError as e:
                        raise cli_error(f"trim of {module}/{depot} task {t} at leader {address}: "
                                        f"{error_from_rpc(e)}") from None
                table.add_row(str(t), str(group), str(reply.start))
            console.print(table)
