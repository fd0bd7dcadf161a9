"""The `conductor` command line: the operator's way into a Millrace cluster.

Commands (every one that talks to a cluster takes ``--zk HOST:PORT[,HOST:PORT...]``; without
it the address comes from ``MILLRACE_ZK``, else from ``.millrace-dev/cluster.json``
written by ``conductor dev`` in the current directory):

    conductor dev [--dir .millrace-dev] [--nodes 3] [--zk-servers 1] [--host H --advertise A] [--stop]
    conductor deploy --module pkg.mod:Class [--code WHEEL] [--app-dir DIR] --tasks N --threads N --workers N --replicationFactor N
                     [--option k=v]
    conductor status [MODULE] [--watch] [--json]
    conductor set-option MODULE KEY VALUE
    conductor balance MODULE [--timeout 60]
    conductor disallow-leaders NODE [--timeout 60]
    conductor allow-leaders NODE
    conductor destroy MODULE [--yes]
    conductor backup MODULE --to DIR, conductor restore --from DIR --as NAME (conductor.cli_backup)
    conductor doctor
    conductor certs init|issue, conductor acl grant|revoke|list, conductor token create|revoke|list
                     (conductor.cli_security)

Expected failures (a bad spec, a module that already exists, too few nodes,
ZooKeeper unreachable) print one red line that says what to do and exit 1;
a traceback means a bug. The data behind ``status`` comes from
``conductor.status`` as plain dicts, so scripts can use ``--json`` instead of
scraping tables.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from conductor import __version__, cli_trim
from conductor import cli_credentials as credentials
from conductor import status as cluster_status
from conductor.cli_backup import BackupCommands
from conductor.cli_scale import ScaleCommands
from conductor.cli_security import SecurityCommands
from conductor.cli_views import (
    DEV_DIR,
    ZK_ENV,
    deploy_summary,
    dev_panel,
    dev_processes,
    module_view,
    node_list,
    overview_view,
    pid_running,
    short_path,
)
from conductor.controller import Conductor, Switch
from conductor.devcluster import DevCluster, stop_from_state
from conductor.metastore import MetastoreError, MetastoreUnavailable, ModuleExists
from conductor.metastore.module_spec import (
    KNOWN_OPTIONS,
    SEGMENT_BYTES,
    ModuleSpec,
    SpecError,
    UnknownOption,
    option_def,
)
from conductor.metastore.zk_auth import ZkAuthError
from conductor.runtime_env import EnvironmentBroken
from conductor.settings import (
    CONFIG_ENV,
    LOOPBACK,
    Listen,
    SettingsError,
    address_settings,
    is_loopback,
    resolve,
)
from conductor.shipping import CodeRefused, check_locally, deploy_code
from conductor.updating import update_code
from topology.artifact import import_from_first, package_code
from topology.module import ModuleDefinitionError

app = typer.Typer(
    help="Millrace conductor: run a dev cluster, deploy modules, inspect task groups, check this machine.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

#: What a DevCluster stores under its root besides logs and cluster.json (glob patterns); only these are
#: ever deleted.
_DEV_DATA_DIRS = ("zookeeper/zk*/data", "nodes")
#: A CLI should fail fast on a wrong address rather than sit in kazoo's reconnect loop.
CONNECT_TIMEOUT_S = 5.0

#: `conductor dev`'s bind and advertised address (ZooKeeper and every node)
ADDRESS_SETTINGS = address_settings("ZooKeeper and the nodes")

ZK_OPTION_HELP = (f"ZooKeeper HOST:PORT, or several comma-separated (default: ${ZK_ENV}, else the address in "
                  f"{DEV_DIR}/cluster.json)")


class CliError(Exception):
    """An expected operator error: printed as one red line, exit code 1, no traceback."""


# Errors whose messages are written for operators (they say what to do); anything else is a bug and keeps
# its traceback.
EXPECTED_ERRORS = (CliError, SpecError, MetastoreError, ModuleDefinitionError, EnvironmentBroken, SettingsError,
                   CodeRefused, credentials.CredentialsError)




def _print_version(value: bool) -> None:
    if value:
        console.print(f"millrace {__version__}")
        raise typer.Exit()


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log debug detail to stderr"),
         show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                           help="print Millrace's version and exit"),
         zk_auth: Path | None = typer.Option(
             None, "--zk-auth", envvar="MILLRACE_ZK_AUTH",
             help="file holding the ZooKeeper digest credentials USER:PASSWORD (mode 0600), for a protected "
                  "ensemble (docs/security.md)"),
         tls_dir: Path | None = typer.Option(None, "--tls-dir", help="folder with ca.pem and one admin-<name>.pem/.key "
                                             "(`conductor certs issue --role admin`): talk to workers over mutual "
                                             "TLS ($MILLRACE_TLS_DIR; a secure `conductor dev` cluster's is used "
                                             "by itself)"),
         tls_ca: Path | None = typer.Option(None, "--tls-ca", help="CA bundle ($MILLRACE_TLS_CA)"),
         tls_cert: Path | None = typer.Option(None, "--tls-cert", help="the operator's certificate "
                                              "($MILLRACE_TLS_CERT)"),
         tls_key: Path | None = typer.Option(None, "--tls-key", help="its key ($MILLRACE_TLS_KEY)")) -> None:
    try:
        credentials.remember(zk_auth, dict(tls_dir=tls_dir, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key))
    except ZkAuthError as e:
        _fail(str(e))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        # kazoo logs every failed connection attempt; the CLI reports the outcome in one line instead.
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)


# ---- shared plumbing ---------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    err_console.print(Text.assemble(("error: ", "bold red"), (message, "red")), soft_wrap=True)
    raise typer.Exit(1)


@contextlib.contextmanager
def _operator_errors() -> Iterator[None]:
    """Turn the errors written for operators into one red line and exit code 1."""
    try:
        yield
    except EXPECTED_ERRORS as e:
        _fail(str(e))


def _resolve_zk(zk: str | None) -> tuple[str, str]:
    """The ZooKeeper address and where it came from (named in the error if it turns out unreachable)."""
    if zk:
        return zk, f"${ZK_ENV}" if os.environ.get(ZK_ENV) == zk else "--zk"
    state_file = DEV_DIR / "cluster.json"
    if state_file.exists():
        try:
            return str(json.loads(state_file.read_text())["zk"]), f"{state_file} (written by `conductor dev`)"
        except (ValueError, KeyError, OSError) as e:
            raise CliError(f"cannot read the ZooKeeper address from {state_file} ({e}); pass --zk HOST:PORT") from None
    raise CliError(f"no ZooKeeper address: pass --zk HOST:PORT, set {ZK_ENV}, "
                   "or start a local cluster here with `conductor dev`")


@contextlib.contextmanager
def _connect(zk: str | None) -> Iterator[Conductor]:
    """A connected, non-campaigning Conductor: deploy/destroy/balance are plain CAS-guarded metastore writes."""
    hosts, source = _resolve_zk(zk)
    credentials.use_tls(hosts)
    conductor = Conductor(hosts, name=f"cli-{socket.gethostname()}-{os.getpid()}", zk_auth=credentials.zk_principal(hosts))
    conductor.ms.connect_timeout = CONNECT_TIMEOUT_S
    try:
        conductor.ms.start()
    except MetastoreUnavailable as e:
        with contextlib.suppress(Exception):
            conductor.ms.close()
        raise CliError(f"{e} (address from {source})") from None
    try:
        yield conductor
    finally:
        conductor.ms.close()


APP_DIR_HELP = ("the folder to import the module's package from (default: the current directory, searched "
                "before the installed packages, as `python -m` does)")


def _parse_options(raw: list[str] | None) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in raw or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--option expects KEY=VALUE, got {item!r}; known options: {', '.join(sorted(KNOWN_OPTIONS))}")
        options[key.strip()] = value.strip()
    return options


# ---- conductor dev -------------------------------------------------------------------------------------


def _record_logs(dc: DevCluster) -> dict[str, Any]:
    """Add each process's log path to cluster.json, so a later `conductor dev` can show them again."""
    path = dc.root / "cluster.json"
    state: dict[str, Any] = json.loads(path.read_text())
    logs = {f"zookeeper {n}": str(s.log_path) for n, s in dc.zk.named().items()}
    logs.update({f"conductor {n}": str(p.log_path) for n, p in dc.conductors.items()})
    logs.update({f"node {n}": str(p.log_path) for n, p in dc.nodes.items()})
    state["logs"] = logs
    state["started"] = time.time()
    path.write_text(json.dumps(state, indent=2))
    return state


@app.command()
def dev(
    directory: Path = typer.Option(DEV_DIR, "--dir", help="where the cluster keeps data, logs and cluster.json"),
    nodes: int = typer.Option(3, "--nodes", min=1, help="number of worker nodes"),
    zk_servers: int = typer.Option(1, "--zk-servers", min=1, max=7,
                                   help="ZooKeeper servers; 3 form an ensemble that survives losing one"),
    host: str | None = typer.Option(None, "--host", help="address ZooKeeper and the nodes bind "
                                    f"(${ADDRESS_SETTINGS[0].env}, [dev] host in the config file; default {LOOPBACK})"),
    advertise: str | None = typer.Option(None, "--advertise", help="address other machines reach them at "
                                         f"(${ADDRESS_SETTINGS[1].env}; default: --host)"),
    config: Path | None = typer.Option(None, "--config", help=f"TOML config file (also ${CONFIG_ENV})"),
    stop: bool = typer.Option(False, "--stop", help="stop the cluster a previous `conductor dev` started"),
    ui_port: int = typer.Option(8888, "--ui-port", min=0, max=65535,
                                help="the conductor's web UI port (0: none)"),
    secure: bool = typer.Option(False, "--secure", help="make a CA and certificates in DIR/pki and run every "
                                "process with mutual TLS, ACLs and ZooKeeper digest auth (DIR/zk-auth; prints how "
                                "an app connects)"),
) -> None:
    """Start local ZooKeeper server(s), a conductor and N worker nodes in the background (or --stop them).

    The processes outlive this command (each runs in its own session) so the
    shell is free for `deploy` and `status`; they are stopped by the pids
    recorded in DIR/cluster.json. Every start is a clean slate: the data of a
    stopped dev cluster (DIR/zookeeper, DIR/nodes) is removed first, because
    ZooKeeper would restore the old worker sessions and refuse the restarted
    workers' registrations until those sessions expire. Logs are kept
    (appended to).
    """
    root = directory.resolve()
    state_file = root / "cluster.json"
    with _operator_errors():
        addresses = resolve({"host": host, "advertise": advertise}, ADDRESS_SETTINGS, "dev", config)
        listen = Listen.of(addresses["host"], addresses["advertise"])
        if stop:
            if not state_file.exists():
                console.print(f"[yellow]no dev cluster recorded in {root}[/yellow]; nothing to stop")
                return
            with console.status(f"stopping the dev cluster in {root}"):
                stopped = stop_from_state(root)
            if stopped:
                console.print(f"[green]stopped[/green] {', '.join(stopped)}")
            else:
                console.print(f"its processes had already exited; removed {state_file}")
            console.print(f"[dim]logs stay in {short_path(str(root / 'logs'))}; the next `conductor dev` "
                          "starts with empty data[/dim]")
            return
        if state_file.exists():
            try:
                state = json.loads(state_file.read_text())
                procs = dev_processes(state)
            except (ValueError, KeyError, TypeError) as e:
                raise CliError(f"{state_file} is unreadable ({e}); stop leftover processes by hand and delete it") \
                    from None
            running = [p for p in procs if pid_running(p[1])]
            if running:
                title = f"a dev cluster is already running ({len(running)}/{len(procs)} processes up)"
                console.print(dev_panel(state, title, root, style="yellow"))
                if len(running) < len(procs):
                    console.print("[yellow]some processes exited[/yellow]: check their logs, then "
                                  "`conductor dev --stop` and `conductor dev` to restart")
                return
            console.print(f"[dim]the dev cluster recorded in {root} is no longer running; starting a new one[/dim]")
            state_file.unlink()
        for pattern in _DEV_DATA_DIRS:
            for leftover in sorted(root.glob(pattern)):
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                    console.print(f"[dim]removed the previous dev cluster's data in {short_path(str(leftover))}"
                                  "[/dim]")
        if not secure and not is_loopback(listen.host):
            console.print(f"[bold red]INSECURE[/bold red]: the dev cluster binds {listen.host} in plaintext; "
                          "`conductor dev --secure` runs it with mutual TLS")
        dc = DevCluster(root, nodes=nodes, zk_servers=zk_servers, listen=listen, ui_port=ui_port or None,
                        secure=secure)
        try:
            with console.status(f"starting {zk_servers} ZooKeeper server(s), a conductor and {nodes} worker node(s) "
                                f"in {root}"):
                dc.start()  # on failure it stops whatever it had started
        except (RuntimeError, TimeoutError) as e:  # includes EnvironmentBroken; the message has the log tail
            raise CliError(f"the dev cluster did not start: {e}\n(`conductor doctor` checks the installation)") \
                from None
        state = _record_logs(dc)
        console.print(dev_panel(state, "Millrace dev cluster running", root))


# ---- conductor deploy ----------------------------------------------------------------------------------


def _wait_serving_with_spinner(conductor: Conductor, module: str, timeout: float) -> dict[str, Any]:
    """Wait for every group's leader to serve, with a spinner on a terminal (plain output otherwise)."""
    if not console.is_terminal:
        return cluster_status.wait_serving(conductor.ms, module, timeout)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"waiting for the leaders of {module}", total=None)

        def show(st: dict[str, Any]) -> None:
            progress.update(task, description=f"{module}: {st['serving']}/{len(st['groups'])} "
                                              "task groups have a leader serving")

        return cluster_status.wait_serving(conductor.ms, module, timeout, on_update=show)


@app.command()
def deploy(
    module_ref: str = typer.Option(..., "--module", "-m", help="the Module class, as package.module:ClassName"),
    code: Path | None = typer.Option(None, "--code", help="a wheel with the module's code (default: its top-level "
                                                          "package, zipped from this machine's import path)"),
    tasks: int = typer.Option(..., "--tasks", help="partitions of every depot and PState"),
    threads: int = typer.Option(..., "--threads", help="task groups (the unit of replication); task t is in group t % threads"),
    workers: int = typer.Option(..., "--workers", help="distinct worker nodes to spread the replicas over"),
    replication_factor: int = typer.Option(..., "--replicationFactor", "--replication-factor",
                                           help="replicas of each task group, on distinct nodes"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
    option: list[str] | None = typer.Option(None, "--option", "-o", help="a module option KEY=VALUE (repeatable)"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds to wait for every group's leader to serve"),
    app_dir: Path | None = typer.Option(None, "--app-dir", help=APP_DIR_HELP),
) -> None:
    """Ship a module's code to the workers, deploy it, and wait until every task group has a leader serving it.

    The code (the module's top-level package, or the wheel given with --code)
    becomes an artifact named by its sha256. Every worker chosen for the
    module fetches it, checks the hash and imports it from its own data folder;
    if one cannot (a missing dependency, a syntax error, define() raising),
    the deploy is refused with that worker's error and nothing is created.
    """
    with _operator_errors():
        # Everything that can be checked without the cluster is checked first: a refused command is
        # cheaper than a half-deployed module.
        options = _parse_options(option)
        import_from_first(app_dir or Path.cwd())
        artifact = package_code(module_ref, code)
        definition = check_locally(artifact, module_ref)  # a broken package or define() fails here
        spec = ModuleSpec(name=definition.name, module_ref=module_ref, tasks=tasks, threads=threads,
                          workers=workers, replication_factor=replication_factor, options=options)
        with _connect(zk) as conductor:
            started = time.monotonic()
            try:
                deploy_code(conductor, spec, artifact, on_step=lambda msg: console.print(f"[dim]{msg}[/dim]"))
            except ModuleExists:
                raise CliError(f"module {spec.name!r} is already deployed; `conductor update {spec.name} --module "
                               f"{module_ref}` switches it to this code, `conductor destroy {spec.name}` removes "
                               "it") from None
            try:
                st = _wait_serving_with_spinner(conductor, spec.name, timeout)
            except KeyboardInterrupt:
                raise CliError(f"stopped waiting; {spec.name} is deployed, follow it with "
                               f"`conductor status {spec.name} --watch`") from None
        if st["serving"] < len(st["groups"]):
            console.print(module_view(st))
            waiting = "; ".join(f"group {g['group']}: {g['problem']}" for g in st["groups"] if not g["serving"])
            raise CliError(f"{spec.name} is deployed but not every group serves after {timeout:.0f}s ({waiting}); "
                           "check the node logs, then `conductor status` (or `conductor destroy` to undo)")
        console.print(deploy_summary(st, time.monotonic() - started))


@app.command()
def update(
    module: str = typer.Argument(..., help="the deployed module to update"),
    module_ref: str = typer.Option(..., "--module", "-m", help="the new Module class, as package.module:ClassName"),
    code: Path | None = typer.Option(None, "--code", help="a wheel with the new code (default: its top-level "
                                                          "package, zipped from this machine's import path)"),
    allow_drop: bool = typer.Option(False, "--allow-drop", help="allow the new version to drop depots and "
                                                                "PStates, deleting their data"),
    tasks: int | None = typer.Option(None, "--tasks", help="must equal the deployed task count (it is fixed)"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds to wait for every group to switch"),
    app_dir: Path | None = typer.Option(None, "--app-dir", help=APP_DIR_HELP),
) -> None:
    """Switch a running module to new code with no processing pause (or back: a rollback is an update).

    Every worker loads the new version beside the running one; if one cannot, the update is refused with its
    error and nothing changes. Then each task group's leader switches at one replog entry: records before it
    were processed by the old code, records after it by the new. PStates whose schema changed migrate in
    place (reads see migrated values at once; `conductor status` shows the background rewrite).
    """
    with _operator_errors():
        import_from_first(app_dir or Path.cwd())
        artifact = package_code(module_ref, code)
        with _connect(zk) as conductor:
            result = update_code(conductor, module, artifact, module_ref, allow_drop=allow_drop, tasks=tasks,
                                 on_step=lambda msg: console.print(f"[dim]{msg}[/dim]"), switch_timeout_s=timeout)
        if not result.switched:
            raise CliError(f"{module} runs version {result.new_version[:12]} in ZooKeeper but not every group "
                           f"reported the switch within {timeout:.0f}s ({result.groups}); follow it with "
                           f"`conductor status {module} --watch`")
        console.print(f"[green]{module} switched from {result.old_version[:12]} to {result.new_version[:12]} "
                      f"in {result.switch_s:.2f}s[/green]")


# ---- conductor status ----------------------------------------------------------------------------------


def _render_status(ms: Any, module: str | None, channels: cluster_status.Channels | None = None) -> RenderableType:
    try:
        if module is None:
            return overview_view(cluster_status.cluster_overview(ms))
        return module_view(cluster_status.module_status(ms, module, channels=channels))
    except MetastoreError as e:  # while watching, a ZooKeeper hiccup or a destroy is shown, not fatal
        return Text(f"{e} (retrying every second; Ctrl-C to stop)", style="red")


@app.command()
def status(
    module: str | None = typer.Argument(None, help="a module name; without it, list the modules"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
    watch: bool = typer.Option(False, "--watch", "-w", help="refresh every second until Ctrl-C"),
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON (for scripts)"),
) -> None:
    """Show modules, or one module's task groups: leader, epoch, ISR/OSR, log end, apply offset, lag.

    Leadership comes from ZooKeeper; offsets and follower lag come from each
    leader's GroupStatus RPC (2 s timeout; a leader that does not answer is
    shown as unreachable). Lag is how many entries a follower lacks.
    """
    with _operator_errors():
        if watch and as_json:
            raise CliError("--watch and --json do not combine; run --json in a loop instead")
        with _connect(zk) as conductor:
            ms = conductor.ms
            if as_json:
                data = cluster_status.status_document(ms, module)
                typer.echo(json.dumps(data, indent=2, sort_keys=True))
                return
            if not watch:
                console.print(overview_view(cluster_status.cluster_overview(ms)) if module is None
                              else module_view(cluster_status.module_status(ms, module)))
                return
            # Ctrl-C is how --watch ends, not an error. It only sets a flag: raised as KeyboardInterrupt in the
            # middle of a ZooKeeper or gRPC call it could leave a lock held and the exit hanging.
            stop = threading.Event()
            previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
            channels = cluster_status.Channels()  # one per worker for every refresh
            try:
                if not console.is_terminal:  # piped to a file or a pager: append a snapshot per second
                    while not stop.is_set():
                        console.print(_render_status(ms, module, channels))
                        console.print()
                        stop.wait(1.0)
                    return
                with Live(_render_status(ms, module, channels), console=console, auto_refresh=False) as live:
                    while not stop.wait(1.0):
                        live.update(_render_status(ms, module, channels), refresh=True)
            finally:
                signal.signal(signal.SIGINT, previous)
                channels.close()


# ---- conductor destroy / set-option / balance --------------------------------------------------------


@app.command()
def destroy(
    module: str = typer.Argument(..., help="the module to remove"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
) -> None:
    """Remove a module: its metadata, and on every worker its replicas and their data."""
    with _operator_errors(), _connect(zk) as conductor:
        spec, _ = conductor.ms.modules.get(module)
        replicas = sorted({n for st, _ in conductor.ms.groups.all(module).values() for n in st.replicas})
        if not yes:
            question = (f"Destroy module {module} ({spec.tasks} tasks in {spec.threads} task groups on "
                        f"{node_list(replicas)})? Workers delete its depots and PStates")
            try:
                confirmed = typer.confirm(question, default=False)
            except typer.Abort:  # no answer (stdin closed): end the prompt line before saying so
                console.print()
                confirmed = False
            if not confirmed:
                raise CliError(f"not confirmed; {module} is untouched (pass --yes to skip the question)")
        conductor.destroy(module)
        console.print(f"[green]destroyed[/green] [bold]{module}[/bold]; workers {node_list(replicas)} "
                      "close its replicas and delete their data")


@app.command("set-option")
def set_option(
    module: str = typer.Argument(..., help="the module"),
    key: str = typer.Argument(..., help=f"one of: {', '.join(sorted(KNOWN_OPTIONS))}"),
    value: str = typer.Argument(..., help="the new value"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
) -> None:
    """Change a module option (validated first; an unknown key lists the known ones).

    The value is stored in the module's spec in ZooKeeper; worker nodes watch
    the spec and hand replication options to their replicas at once (a leader
    re-evaluates its ISR under a new min-ISR or lag). ``replog.segment.bytes``
    applies when a worker next opens the module.
    """
    with _operator_errors():
        definition = option_def(key)  # before connecting: a typo needs no cluster to be refused
        if definition is None:
            raise UnknownOption(key)
        with _connect(zk) as conductor:
            spec, _ = conductor.ms.modules.get(module)
            old = f"{spec.shown_option(key)}" + ("" if key in spec.options else " (default)")
            updated = conductor.ms.modules.set_option(module, key, value)
        new = str(updated.shown_option(key))  # as typed: replication.fsync's word, not its code
        console.print(Text.assemble((module, "bold"), f" {key}: {old} -> ", (new, "bold green")))
        when = ("workers apply it when they next open the module (restart)" if key == SEGMENT_BYTES
                else "running workers apply it now")
        console.print(Text(f"{definition.doc}. Stored in ZooKeeper; {when}.", style="dim"))


def _per_node(ms: Any, modules: list[str]) -> str:
    """Leaders per node over ``modules``, for the line under a balancing table."""
    groups = [st for m in modules for st, _ in ms.groups.all(m).values()]
    leaders = Counter(st.leader for st in groups if st.leader is not None)
    return ", ".join(f"{n} {leaders[n]}" for n in sorted({r for st in groups for r in st.replicas}))


def _run_switches(conductor: Conductor, modules: list[str], timeout: float, title: str) -> None:
    """Request the balancing switches as hand-offs, wait with a spinner until they land, print the table."""
    ms = conductor.ms
    # Module by module: each module's leaders are evened out over the nodes, as the periodic round does.
    switches = [sw for m in modules for sw in conductor.request_switches([m])]
    if not switches:
        console.print(f"[green]{title}: leadership is already balanced[/green] "
                      f"(leaders per node: {_per_node(ms, modules)})")
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task(f"{len(switches)} leader hand-off(s) requested", total=len(switches))

        def show(outcomes: dict[Switch, str]) -> None:
            done = sum(1 for o in outcomes.values() if o != "pending")
            progress.update(task, completed=done,
                            description=f"{done}/{len(switches)} leader hand-off(s) landed "
                                        "(each leader waits until its successor holds everything)")

        outcomes = conductor.await_switches(switches, timeout, on_update=show)
    table = Table(title=f"{title}: leader switches (coordinated hand-off)", title_justify="left")
    for col in ("module", "group", "from", "to", "epoch", "result"):
        table.add_column(col)
    results = {
        "switched": "[green]switched[/green]",
        "changed": "[yellow]skipped: the group changed meanwhile; run balance again[/yellow]",
        "pending": f"[yellow]not switched within {timeout:g}s (the leader kept it: a follower lagged or the "
                   "ISR stalled); request withdrawn, run balance again[/yellow]",
    }
    for sw in switches:
        now = ms.groups.get(sw.module, sw.group)[0]
        table.add_row(sw.module, str(sw.group), sw.source or "none", sw.to, str(now.epoch), results[outcomes[sw]])
    console.print(table)
    console.print(f"leaders per node: {_per_node(ms, modules)}")


@app.command()
def balance(
    module: str = typer.Argument(..., help="the module whose leaders to even out"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds to wait for the hand-offs to land"),
) -> None:
    """Even out a module's leaders over its live in-sync replicas, with as few switches as possible.

    Each switch is a coordinated hand-off: the leader stops taking appends
    (clients retry on NotLeader), waits until the chosen in-sync follower holds
    everything it appended, then makes it leader with a new epoch. No append
    that the client retries fails. Nodes drained with `disallow-leaders` lose
    their leaders first. The active conductor also balances periodically.
    """
    with _operator_errors(), _connect(zk) as conductor:
        conductor.ms.modules.get(module)  # ModuleNotFound here rather than a silent "nothing to do"
        _run_switches(conductor, [module], timeout, module)


@app.command("disallow-leaders")
def disallow_leaders(
    node: str = typer.Argument(..., help="the node to drain of leadership"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds to wait for the hand-offs to land"),
) -> None:
    """Drain a node of leadership: hand its leaders to in-sync replicas elsewhere (it keeps its replicas).

    Stored in ZooKeeper: balancing keeps leaders off the node and elections
    prefer other in-sync replicas, until `conductor allow-leaders NODE`.
    """
    with _operator_errors(), _connect(zk) as conductor:
        conductor.disallow_leaders(node)
        console.print(f"[yellow]{node}[/yellow] may no longer lead task groups; moving its leaders away")
        modules = conductor.ms.modules.names()
        _run_switches(conductor, modules, timeout, "all modules")
        stuck = [f"{m}/{g}" for m in modules for g, (st, _) in conductor.ms.groups.all(m).items()
                 if st.leader == node]
        if stuck:
            console.print(f"[yellow]{node} still leads {', '.join(stuck)}: no other in-sync replica is live "
                          "there yet; balancing moves them once one is[/yellow]")


@app.command("allow-leaders")
def allow_leaders(
    node: str = typer.Argument(..., help="the node that may lead again"),
    zk: str | None = typer.Option(None, "--zk", envvar=ZK_ENV, help=ZK_OPTION_HELP),
) -> None:
    """Undo `disallow-leaders`: the node may lead again (the next balancing round gives it leaders)."""
    with _operator_errors(), _connect(zk) as conductor:
        if conductor.allow_leaders(node):
            console.print(f"[green]{node}[/green] may lead task groups again; `conductor balance MODULE` moves "
                          "leaders to it now, the conductor's periodic balancing does later")
        else:
            console.print(f"{node} was not disallowed; nothing to do")


# ---- conductor doctor ----------------------------------------------------------------------------------


@app.command()
def doctor(fetch: bool = typer.Option(False, "--fetch", help="first download what is missing (Delta's jars, and "
                                                              "ZooKeeper's without Debian's package, from Maven "
                                                              "Central or $MILLRACE_MAVEN)")) -> None:
    """Check Java, ZooKeeper, RocksDB, gRPC, Delta's jars and Spark+Delta by doing real work with each."""
    from conductor.doctor import CheckResult, run_checks

    if fetch:
        from conductor.runtime_env import zookeeper_classpath
        from topology.spark.session import fetch_delta_jars

        with _operator_errors():
            zookeeper_classpath()
            fetch_delta_jars()

    console.print("[bold]Millrace doctor[/bold]: checking every component with a real round trip")

    def show(r: CheckResult) -> None:
        mark = "[green]✔[/green]" if r.ok else "[red]✘[/red]"
        console.print(f" {mark} [bold]{r.component:<12}[/bold] {r.detail} [dim]({r.seconds:.1f}s)[/dim]")

    results = run_checks(show)
    failed = [r for r in results if not r.ok]
    if failed:
        console.print(f"[red]{len(failed)} check(s) failed[/red]: each line says what to install; "
                      "`conductor doctor --fetch` downloads Delta's jars (in a checkout: `make setup`)")
        raise typer.Exit(1)
    console.print(f"[green]all {len(results)} checks passed[/green]")


SecurityCommands(_connect, _operator_errors, CliError).register(app)
ScaleCommands(_connect, _operator_errors, CliError).register(app)
BackupCommands(_connect, _operator_errors, CliError, _wait_serving_with_spinner).register(app)
cli_trim.register(app, _connect, _operator_errors, CliError, ZK_OPTION_HELP)


if __name__ == "__main__":
    app()
