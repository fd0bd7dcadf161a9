"""How the ``conductor`` CLI shows things: rich tables, panels and progress bars built from plain data.

The commands (:mod:`conductor.cli`) fetch cluster state as plain dicts
(:mod:`conductor.status`) and hand them here, so what an operator sees can
change without touching what the commands do.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rich import filesize
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from conductor import status as cluster_status
from conductor.devcluster import zookeeper_pids

#: Where `conductor dev` keeps its state, relative to the current directory; other commands look here for
#: the ZooKeeper address when neither --zk nor MILLRACE_ZK is given.
DEV_DIR = Path(".millrace-dev")
#: the environment variable that names the ZooKeeper of every command
ZK_ENV = "MILLRACE_ZK"


def node_list(names: list[str]) -> str:
    return ",".join(names) if names else "-"


def pid_running(pid: int | None) -> bool:
    """True if ``pid`` is a live process; a zombie (exited, not yet reaped by its parent) counts as gone."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # /proc/<pid>/stat is "pid (comm) STATE ..."; comm may contain spaces, so split after the last ')'.
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def dev_processes(state: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    """(name, pid, log path) of every process in a `conductor dev` state file."""
    logs: dict[str, str] = state.get("logs", {})
    procs = [(f"zookeeper {n}", pid, logs.get(f"zookeeper {n}")) for n, pid in zookeeper_pids(state).items()]
    procs += [(f"conductor {n}", int(pid), logs.get(f"conductor {n}")) for n, pid in state["conductors"].items()]
    procs += [(f"node {n}", int(pid), logs.get(f"node {n}")) for n, pid in state["nodes"].items()]
    return procs


def short_path(path: str) -> str:
    """A path relative to the current directory when it is under it: shorter to read and to paste."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def dev_panel(state: dict[str, Any], title: str, root: Path, style: str = "green") -> Panel:
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("process", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("log", overflow="fold")
    for name, pid, log_path in dev_processes(state):
        running = pid_running(pid)
        table.add_row(name, str(pid), "[green]running[/green]" if running else "[red]exited[/red]",
                      short_path(log_path) if log_path else "-")
    zk = state["zk"]
    stop = "conductor dev --stop" + ("" if root.resolve() == DEV_DIR.resolve() else f" --dir {root}")
    nxt = Text.assemble(
        ("next:\n", "bold"),
        "  conductor deploy --module examples.clicks:Clicks --tasks 4 --threads 2 \\\n",
        "      --workers 3 --replicationFactor 3\n",
        "  conductor status Clicks --watch\n",
        f"  {stop}\n",
        (f"from another directory: export {ZK_ENV}={zk}", "dim"),
    )
    if state.get("tls_dir"):
        pki = state["tls_dir"]
        nxt.append_text(Text.assemble(
            ("\nmutual TLS on every link", "bold green"), f"; certificates in {short_path(pki)}\n",
            "  an app connects with its certificate (app/dev here; more: conductor certs issue --role app):\n",
            f"  Cluster.connect(\"{zk}\", tls=TlsFiles.in_dir(Path(\"{pki}\"), Identity(\"app\", \"dev\")))\n",
            "  or with a token (conductor token create --name APP, then conductor acl grant app/APP MODULE append query):\n",
            f"  Cluster.connect(\"{zk}\", token=TOKEN, ca=Path(\"{pki}/ca.pem\"))\n",
            (f"  the CLI uses admin/dev by itself; from another directory: export MILLRACE_TLS_DIR={pki}", "dim")))
    if state.get("zk_auth"):
        nxt.append_text(Text.assemble(
            ("\nZooKeeper digest auth", "bold green"), f": only the control plane ({short_path(state['zk_auth'])}, "
            "mode 0600) changes the cluster's znodes, workers only their own and the groups' (zk-auth-worker); apps "
            "read routing without it\n",
            (f"  from another directory: export MILLRACE_ZK_AUTH={state['zk_auth']}", "dim")))
    head = Text.assemble(("ZooKeeper ", "bold"), zk, ("   state ", "bold"), short_path(str(root / "cluster.json")),
                         *((("   web UI ", "bold"), state["ui"]) if state.get("ui") else ()))
    return Panel(Group(head, Text(""), table, Text(""), nxt), title=title, border_style=style, expand=False)


def deploy_summary(st: dict[str, Any], seconds: float) -> RenderableType:
    table = Table(title=f"{st['module']}: {st['serving']}/{len(st['groups'])} task groups serving",
                  title_justify="left")
    for col in ("group", "leader", "address", "epoch", "replicas"):
        table.add_column(col)
    for g in st["groups"]:
        style = "" if g["serving"] else "red"
        table.add_row(str(g["group"]), g["leader"] or "none",
                      g["leader_address"] or "-", str(g["epoch"]), node_list(g["replicas"]), style=style)
    head = Text.assemble(
        ("deployed ", "green"), (st["module"], "bold"),
        f" ({st['module_ref']}): {st['tasks']} tasks in {st['group_count']} task groups "
        f"(task t in group t % {st['group_count']}), replication factor {st['replication_factor']}, "
        f"min ISR {st['min_isr']}, serving after {seconds:.1f}s")
    return Group(head, table, Text(f"next: conductor status {st['module']}", style="dim"))


def overview_view(ov: dict[str, Any]) -> RenderableType:
    head = Text.assemble(("ZooKeeper ", "bold"), ov["zk"], f", {len(ov['nodes'])} live worker node(s)")
    nodes = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("node", "address", "links", "pid", "leaders"):
        nodes.add_column(col, no_wrap=True)
    for n in ov["nodes"]:
        nodes.add_row(n["node"], n["address"], "TLS" if n.get("secure") else "[red]plaintext[/red]", str(n["pid"]),
                      "allowed" if n["leaders_allowed"] else "[yellow]disallowed[/yellow]")
    if not ov["modules"]:
        return Group(head, nodes, Text(""),
                     Text("no modules deployed; `conductor deploy --help` shows how", style="dim"))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col, just in (("module", "left"), ("code", "left"), ("tasks", "right"), ("groups", "right"),
                      ("RF", "right"), ("min ISR", "right"), ("workers", "right"), ("led", "right"),
                      ("state", "left"), ("options", "left")):
        table.add_column(col, justify=just, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=col in ("module", "code"))
    for m in ov["modules"]:
        led = f"{m['groups_led']}/{m['groups_total']}"
        opts = "\n".join(f"{k}={v}" for k, v in m["options"].items()) or "-"
        table.add_row(m["module"], m["module_ref"], str(m["tasks"]), str(m["group_count"]),
                      str(m["replication_factor"]), str(m["min_isr"]), str(m["workers"]),
                      led if m["groups_led"] == m["groups_total"] else f"[red]{led}[/red]",
                      state_cell(m["state"]), opts)
    return Group(head, nodes, Text(""), table,
                 Text("led: groups with a live leader; `conductor status MODULE` shows each task group", style="dim"))


def state_cell(state: str) -> str:
    return state if state == cluster_status.RUNNING else f"[yellow]{state}[/yellow]"


def lag_cell(g: dict[str, Any]) -> Text:
    cell = Text()
    for i, f in enumerate(g["followers"]):
        if i:
            cell.append("  ")
        # A follower's last reported offset says nothing once its node is gone: say it is down instead.
        lag = "down" if not f["live"] else ("?" if f["lag"] is None else str(f["lag"]))
        style = "red" if not f["live"] else ("yellow" if f["lag"] or not f["in_isr"] else "")
        cell.append(f"{f['node']} {lag}", style=style)
    return cell if g["followers"] else Text("-")


def catchup_bar(group: int, c: dict[str, Any]) -> RenderableType:
    """A far-horizon transfer as a progress bar: bytes of this round, rate and ETA."""
    done, total, rate = c["bytes_done"], c["bytes_total"], c["bytes_per_s"]
    eta = "-" if rate <= 0 else f"{max(0.0, (total - done) / rate):.0f}s"
    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        Text(f"group {group}: {c['node']} far-horizon from {c['leader']}, round {c['round']}", style="cyan"),
        ProgressBar(total=max(total, 1), completed=min(done, total), width=30),
        Text(f"{filesize.decimal(done)}/{filesize.decimal(total)}  {filesize.decimal(int(rate))}/s  "
             f"ETA {eta}  ({c['state']})"))
    return bar


def plan_bar(plan: dict[str, Any]) -> RenderableType:
    """A reassignment in progress (:func:`conductor.status.plan_overview`): groups done of the plan's, the
    others by phase, and the running copies' bytes, rate and ETA against the throttle."""
    goal = ", ".join(f"{k} {v}" for k, v in (("RF", plan["replication_factor"]), ("workers", plan["workers"]))
                     if v is not None)
    phases = " · ".join(f"{p} {n}" for p, n in plan["phases"].items())
    line = Text.assemble(("cancelling " if plan["cancel"] else "", "yellow"),
                         (f"reassignment ({plan['kind']}{': ' + goal if goal else ''})", "bold cyan"))
    done, total, rate = plan["bytes_done"], plan["bytes_total"], plan["bytes_per_s"]
    copying = Text()
    if plan["copies"]:
        eta = "-" if plan["eta_s"] is None else f"{max(0.0, plan['eta_s']):.0f}s"
        copying.append(f"{plan['copies']} cop{'y' if plan['copies'] == 1 else 'ies'}: {filesize.decimal(done)}/"
                       f"{filesize.decimal(total)}  {filesize.decimal(int(rate))}/s  ETA {eta}")
    limit = plan["copy_limit_bytes_per_s"]
    copying.append(f"  (throttle {filesize.decimal(limit)}/s per worker)" if limit else "", style="dim")
    bar = Table.grid(padding=(0, 1))
    bar.add_row(line, ProgressBar(total=max(plan["groups"], 1), completed=plan["done"], width=20),
                Text(f"{plan['done']}/{plan['groups']} groups done" + (f"; {phases}" if phases else "")), copying)
    waits = [Text(f"  waiting: {w}", style="yellow") for w in plan["waiting"]]
    return Group(bar, *waits) if waits else bar


def module_view(st: dict[str, Any]) -> RenderableType:
    opts = " ".join(f"{k}={v}" for k, v in st["options"].items())
    head = Text.assemble(
        (st["module"], "bold"), f"  {st['module_ref']}  {st['tasks']} tasks in {st['group_count']} task groups "
        f"(task t in group t % {st['group_count']}), RF {st['replication_factor']} on {st['workers']} workers, "
        f"min ISR {st['min_isr']}  ",
        Text.from_markup(state_cell(st["state"])),
        (f"  options {opts}" if opts else "", "dim"),
        (f"  leaders disallowed on {node_list(st['disallowed_leaders'])}" if st["disallowed_leaders"] else "", "yellow"))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col, just in (("group", "right"), ("leader", "left"), ("epoch", "right"),
                      ("ISR", "left"), ("OSR", "left"), ("log end", "right"), ("apply offset", "right"),
                      ("follower lag", "left")):
        table.add_column(col, justify=just, overflow="fold",  # type: ignore[arg-type]
                         min_width=len("unreachable") if col == "log end" else None)
    notes: list[RenderableType] = [plan_bar(st["plan"])] if st.get("plan") else []
    for g in st["groups"]:
        replica = g["replica"]
        if replica and replica["reachable"]:
            log_end, apply_offset = str(replica["log_end"]), str(replica["apply_offset"])
        elif g["leaderless_reason"] is None:
            log_end, apply_offset = "[yellow]unreachable[/yellow]", ""
        else:
            log_end, apply_offset = "-", "-"
        leader = g["leader"] if g["leaderless_reason"] is None else "[bold red]none[/bold red]"
        if g["handing_off_to"] and g["leaderless_reason"] is None:
            leader += f" [yellow]-> {g['handing_off_to']}[/yellow]"
        style = "red" if g["leaderless_reason"] else ("" if g["serving"] else "yellow")
        table.add_row(str(g["group"]), leader, str(g["epoch"]), node_list(g["isr"]),
                      node_list(g["osr"]) + (f" (ELR {node_list(g['elr'])})" if g.get("elr") else ""), log_end, apply_offset, lag_cell(g), style=style)
        if g["problem"]:
            notes.append(Text(f"group {g['group']}: {g['problem']}", style="red" if g["leaderless_reason"] else "yellow"))
        for c in g.get("catchups", []):
            notes.append(catchup_bar(g["group"], c))
        for f in g.get("faults", []):
            notes.append(Text(f"group {g['group']}: replica on {f['node']} failed: {f['fault']}", style="yellow"))
        dead = replica.get("dead_letters", 0) if replica and replica["reachable"] else 0
        if dead:
            notes.append(Text(f"group {g['group']}: {dead} record(s) or hop message(s) failed their retries and "
                              f"are in *dead_letters (read that depot for the errors)", style="yellow"))
    notes.extend(code_notes(st.get("code")))
    notes.extend(depot_table(st["groups"]))
    total = len(st["groups"])
    foot = Text(f"{st['serving']}/{total} task groups serving, live nodes {node_list(st['live_nodes'])}, "
                f"checked {time.strftime('%H:%M:%S', time.localtime(st['checked_at']))}",
                style="green" if st["serving"] == total else "red")
    return Group(head, table, *notes, foot)


def depot_table(groups: list[dict[str, Any]]) -> list[RenderableType]:
    """One row per depot over its partitions (from the leaders): start and end offsets, records, bytes."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        replica = g["replica"]
        for d in (replica.get("depots") or []) if replica and replica["reachable"] else []:
            rows.setdefault(d["depot"], []).append(d)
    if not rows:
        return []
    table = Table("depot", "partitions", "start offsets", "end offsets", "records", "bytes", box=None,
                  header_style="bold", pad_edge=False)

    def span(v: list[int]) -> str:
        return f"{min(v):,}" if min(v) == max(v) else f"{min(v):,}-{max(v):,}"

    for name, parts in sorted(rows.items()):
        starts, ends = [p["start"] for p in parts], [p["end"] for p in parts]
        table.add_row(name, str(len(parts)), span(starts), span(ends), f"{sum(p['records'] for p in parts):,}",
                      f"{sum(p['bytes'] for p in parts):,}")
    return [table]


def code_notes(code: dict[str, Any] | None) -> list[RenderableType]:
    """The running code version, a switch in progress, PState migrations in progress."""
    if not code:
        return []
    version = code["version"]
    out: list[RenderableType] = [Text(f"code version {version[:12] if ':' not in version else version}", style="dim")]
    if code["switching"]:
        out.append(Text(f"switching to it: groups {code['switching']} still run the previous version", style="yellow"))
    for p, m in sorted(code["migrations"].items()):
        out.append(Text(f"migrating {p} ({m['id']}): {m['groups_done']}/{m['groups']} group(s) done, "
                        f"{m['rewritten']:,} value(s) rewritten", style="yellow"))
    return out
