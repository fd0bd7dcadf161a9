"""`conductor scale`, `conductor replace-node` and `conductor decommission`: change the cluster's shape online.

    conductor scale MODULE [--workers N] [--replicationFactor R] [--threads T] [--cancel] [--no-wait]
    conductor replace-node DEAD [--with NEW ...] [--force]
    conductor decommission NODE [--with NEW ...]

Each stores reassignment plans in ZooKeeper (``conductor.plan_builder`` makes
them) that the active conductor executes (``conductor.reassigning``), and
shows their progress until they end. Leaving the command (Ctrl-C, or
``--no-wait``) leaves the plan running: the conductor owns it.
:mod:`conductor.cli` registers the commands with one call (:meth:`ScaleCommands.register`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from conductor.cli_views import ZK_ENV
from conductor.metastore import GroupState, Metastore
from conductor.metastore.plans import ReassignmentPlan
from conductor.plan_builder import DEFAULT_CONCURRENCY, PlanRefused, replace_plans, scale_plan
from conductor.reassigning import plan_progress
from conductor.status import Channels, query_group_status

console = Console()
ZK_HELP = f"ZooKeeper HOST:PORT[,...] (default: ${ZK_ENV})"
WAIT_HELP = "seconds to show progress before leaving the plan to the conductor (it keeps running)"


@dataclass(frozen=True)
class ScaleCommands:
    """The reassignment commands, bound to the main CLI's connection and error plumbing (as SecurityCommands):
    ``connect(zk)`` yields a connected Conductor, ``operator_errors()`` prints operator errors as one red line."""

    connect: Callable[[str | None], AbstractContextManager[Any]]
    operator_errors: Callable[[], AbstractContextManager[None]]
    cli_error: Callable[[str], Exception]

    def register(self, app: typer.Typer) -> None:
        app.command("scale")(self.scale)
        app.command("replace-node")(self.replace_node)
        app.command("decommission")(self.decommission)

    def scale(
        self,
        module: str = typer.Argument(..., help="the module to scale"),
        workers: int | None = typer.Option(None, "--workers", help="how many workers the module runs on"),
        replication_factor: int | None = typer.Option(None, "--replicationFactor", "--replication-factor",
                                                      help="replicas per task group (min-ISR follows it, "
                                                           "minus one, unless set)"),
        threads: int | None = typer.Option(None, "--threads", help="task groups: only the current count "
                                           "(changing it is a data migration, refused with the reason)"),
        cancel: bool = typer.Option(False, "--cancel", help="roll back the plan in progress (groups that "
                                    "completed keep their new replicas)"),
        concurrency: int = typer.Option(DEFAULT_CONCURRENCY, "--concurrency", min=1,
                                        help="task groups copying a replica at once"),
        wait: float = typer.Option(3600.0, "--wait", help=WAIT_HELP),
        no_wait: bool = typer.Option(False, "--no-wait", help="store the plan and return"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Move a module to N workers and R replicas per task group while it runs (Kafka's safe reassignment).

        Each new replica is added first (copied from the leader, then it joins
        the ISR), leadership moves off replicas that go, then they are removed
        and their data deleted; every step a compare-and-set of the group's
        znode, the whole plan in ZooKeeper (a standby conductor resumes it).
        Leaders are rebalanced at the end. Writers go on throughout.
        """
        with self.operator_errors(), self.connect(zk) as conductor:
            ms: Metastore = conductor.ms
            if cancel:
                if ms.plans.cancel(module) is None:
                    raise self.cli_error(f"module {module} has no reassignment in progress")
                console.print(f"[yellow]cancelling the reassignment of {module}[/yellow]: groups that have not "
                              "completed go back to their original replicas")
            else:
                try:
                    plan = scale_plan(ms, module, workers, replication_factor, threads, concurrency)
                except PlanRefused as e:
                    raise self.cli_error(str(e)) from None
                ms.plans.create(module, plan)
                console.print(f"[bold]{module}[/bold]: RF {plan.replication_factor} on {plan.workers} workers; "
                              f"{len(plan.targets)} task group(s) to move, {plan.concurrency} at a time")
            if not no_wait:
                self._follow(ms, [module], wait)

    def replace_node(
        self,
        node: str = typer.Argument(..., help="the worker that is gone for good"),
        to: list[str] | None = typer.Option(None, "--with", help="the worker(s) to take its replicas "
                                            "(default: the least-loaded live workers)"),
        force: bool = typer.Option(False, "--force", help="replace a worker that is still live"),
        wait: float = typer.Option(3600.0, "--wait", help=WAIT_HELP),
        no_wait: bool = typer.Option(False, "--no-wait", help="store the plans and return"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Re-place every replica of a dead worker on live ones, so every group gets its replication factor back.

        A new machine joins under a new node id (start it first, then pass `--with NEW`).
        """
        self._replace(node, "replace-node", to, force, wait, no_wait, zk)

    def decommission(
        self,
        node: str = typer.Argument(..., help="the live worker to empty"),
        to: list[str] | None = typer.Option(None, "--with", help="the worker(s) to take its replicas"),
        wait: float = typer.Option(3600.0, "--wait", help=WAIT_HELP),
        no_wait: bool = typer.Option(False, "--no-wait", help="store the plans and return"),
        zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_HELP),
    ) -> None:
        """Move a live worker's replicas (and leadership) to other workers; then it can be stopped."""
        self._replace(node, "decommission", to, False, wait, no_wait, zk)

    def _replace(self, node: str, kind: str, to: list[str] | None, force: bool, wait: float, no_wait: bool,
                 zk: str | None) -> None:
        with self.operator_errors(), self.connect(zk) as conductor:
            ms: Metastore = conductor.ms
            try:
                plans = replace_plans(ms, node, kind, force, candidates=to or None)
            except PlanRefused as e:
                raise self.cli_error(str(e)) from None
            for module, plan in plans.items():
                ms.plans.create(module, plan)
                news = Counter(t[-1] for t in plan.targets.values())
                console.print(f"[bold]{module}[/bold]: {len(plan.targets)} replica(s) of {node} move to "
                              + ", ".join(f"{n} ({c})" for n, c in sorted(news.items())))
            if not no_wait:
                self._follow(ms, sorted(plans), wait)
                if kind == "decommission":
                    console.print(f"[green]{node} holds no replica any more: it can be stopped[/green]")

    def _follow(self, ms: Metastore, modules: list[str], wait: float) -> None:
        """Show each plan's progress (groups done, what the others are doing) until it ends or ``wait`` passes."""
        with Channels() as channels:
            self._show(ms, modules, wait, channels)

    def _show(self, ms: Metastore, modules: list[str], wait: float, channels: Channels) -> None:
        deadline = time.monotonic() + wait
        with Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[module]}[/bold]"), BarColumn(),
                      MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=console) as progress:
            tasks = {m: progress.add_task("", module=m, total=None) for m in modules}
            remaining = set(modules)
            while remaining and time.monotonic() < deadline:
                live = ms.nodes.sessions()
                for m in sorted(remaining):
                    found = ms.plans.get(m)
                    if found is None:
                        remaining.discard(m)
                        progress.update(tasks[m], total=1, completed=1, description="[green]done[/green]")
                        continue
                    plan: ReassignmentPlan = found[0]
                    groups = ms.groups.all(m)
                    rows = plan_progress(plan, groups, live)
                    phases = Counter(r.phase for r in rows)
                    copying = [r.group for r in rows if r.phase == "copying"]
                    waits = [copy_progress(ms, channels, m, copying[0], groups[copying[0]][0])] if copying else []
                    waits += sorted({r.detail for r in rows if r.phase in ("waiting", "handing-off", "releasing")})
                    progress.update(tasks[m], total=len(rows), completed=phases["done"], description=(
                        ("[yellow]cancelling[/yellow] " if plan.cancel else "")
                        + " · ".join(f"{p} {c}" for p, c in sorted(phases.items()) if p != "done")
                        + (f" ({waits[0]})" if waits else "")))
                time.sleep(0.5)
        if remaining:
            console.print(f"[yellow]still running after {wait:g}s: {', '.join(sorted(remaining))}; the conductor "
                          "carries on (`conductor scale MODULE --cancel` rolls back)[/yellow]")
            return
        table = Table(title="task groups after the reassignment", title_justify="left")
        for col in ("module", "group", "leader", "replicas", "ISR"):
            table.add_column(col)
        for m in modules:
            for g, (st, _) in ms.groups.all(m).items():
                table.add_row(m, str(g), st.leader or "-", ",".join(st.replicas), ",".join(st.isr))
        console.print(table)


def copy_progress(ms: Metastore, channels: Channels, module: str, g: int, st: GroupState) -> str:
    """What group ``g``'s added replicas are doing, as they report it: a far-horizon copy (bytes, rate, ETA) or
    the entries they still replay."""
    parts = []
    for node in (r for r in st.target if r not in st.isr):
        info = ms.nodes.get(node)
        report: dict[str, Any] = (query_group_status(info.address, module, g, channels=channels)
                                  if info is not None else {"reachable": False})
        c: dict[str, Any] | None = report.get("catchup") if report.get("reachable") else None
        if c and c["state"] == "copying" and c["bytes_total"]:
            rate = c["bytes_per_s"] or 0.0
            eta = f", ETA {(c['bytes_total'] - c['bytes_done']) / rate:.0f} s" if rate else ""
            parts.append(f"{node} copying {c['bytes_done'] / 1e6:.1f}/{c['bytes_total'] / 1e6:.1f} MB at "
                         f"{rate / 1e6:.1f} MB/s{eta}")
        elif report.get("reachable"):
            parts.append(f"{node} replaying (log end {report['log_end']})")
        else:
            parts.append(f"{node} not answering")
    return "; ".join(parts)
