"""``python -m conductor.worker``: run one worker process until SIGTERM or SIGINT.

Settings come from flags, ``MILLRACE_*`` environment variables or the ``[worker]`` section of a TOML config
file, in that order (:mod:`conductor.settings`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from pathlib import Path

from conductor.metastore.zk_auth import ZkAuthError, read_principal
from conductor.security.config import TLS_SETTINGS, check_bind, tls_source
from conductor.settings import (
    REQUIRED,
    Listen,
    Setting,
    SettingsError,
    add_arguments,
    address_settings,
    parse_bool,
    parse_port,
    parse_seconds,
    resolve,
)
from conductor.wire.channels import use_process_credentials
from conductor.worker import switch_interval
from conductor.worker.hooks import WorkerHooks
from conductor.worker.timings import configure as configure_timings
from conductor.worker.worker import Worker

log = logging.getLogger("millrace.node")

def parse_on_off(raw: str) -> bool:
    """A setting written on/off (or true/false): a value flag, unlike a switch that can only turn on."""
    return parse_bool(raw)


def parse_token_port(raw: str) -> int | None:
    """``off`` or a port (0: any free port)."""
    return TOKEN_PORT_OFF if raw.strip().lower() == "off" else parse_port(raw)


#: `--token-port off`: no token port even with TLS
TOKEN_PORT_OFF = -1


def token_port(setting: int | None, tls: bool, authorize: bool) -> int | None:
    """The token port to serve (None: none): on by default wherever it is safe (TLS and authorization)."""
    if setting == TOKEN_PORT_OFF or (setting is None and not (tls and authorize)):
        return None
    if not (tls and authorize):
        raise SettingsError("--token-port needs TLS (--tls-dir) and authorization: a port that asks for no "
                            "certificate is safe only when every call's bearer token is checked")
    return setting or 0


SETTINGS = [
    Setting("zk", REQUIRED, help="ZooKeeper connect string, HOST:PORT[,HOST:PORT...]"),
    Setting("node_id", REQUIRED, help="this worker's name, unique in the cluster"),
    Setting("data_dir", REQUIRED, Path, help="where this worker keeps its replicas and code artifacts"),
    *address_settings("gRPC (clients, Spark, far-horizon copies), plain-TCP replication links and metrics"),
    Setting("port", 0, parse_port, help="gRPC port (0: any free port)"),
    Setting("replication_port", 0, parse_port, help="port peers' replication links connect to, on --host "
            "(0: any free port; registered in ZooKeeper)"),
    Setting("token_port", None, parse_token_port, help="gRPC port for apps with a bearer token and no certificate "
            "(server-only TLS; default with TLS and authorization: any free port; off: none)"),
    Setting("metrics_host", None, help="address to bind the Prometheus endpoint on (default: --host)"),
    Setting("metrics_port", 0, parse_port, help="Prometheus /metrics port (0: any free port)"),
    Setting("metrics_detail", True, parse_on_off, help="on|off: latency histograms on the replicas' task threads "
            "(off: only the gauges and counters; the bench's --metrics off measures what they cost)"),
    Setting("session_timeout", 6.0, parse_seconds, help="ZooKeeper session timeout, seconds"),
    Setting("task_threads", 1, int, help="threads the replicas' loops share (0: one per replica; more than one "
            "overlaps fsyncs on a slow disk but costs CPU per message: see conductor.worker.task_thread)"),
    Setting("switch_interval", switch_interval.DEFAULT, switch_interval.parse_switch_interval,
            help="seconds a thread waiting for the GIL lets the running one go on before Python hands the GIL over "
            f"(sys.setswitchinterval; Python's own default is {switch_interval.PYTHON_DEFAULT}; "
            "conductor.worker.switch_interval)"),
    Setting("zk_auth", None, Path, help="file holding the ZooKeeper digest credentials USER:PASSWORD (mode 0600); "
            "the znodes this worker creates are then writable by that user only (docs/security.md)"),
    Setting("authorize", None, parse_bool, help="(default: on with TLS) check every gRPC call's identity (certificate or bearer token) "
            "against the module ACLs (docs/security.md)"),
    Setting("log_level", "WARNING"),
    *TLS_SETTINGS,
]


def main(argv: list[str] | None = None, hooks: WorkerHooks | None = None) -> None:
    """Run a worker with the settings of ``argv``; ``hooks`` are a test launcher's (none from the command line)."""
    p = argparse.ArgumentParser(prog="python -m conductor.worker", description="Run a Millrace worker.")
    add_arguments(p, SETTINGS)
    args = p.parse_args(argv)
    try:
        s = resolve(vars(args), SETTINGS, "worker", args.config)
        listen = Listen.of(s["host"], s["advertise"])
        metrics = Listen.of(s["metrics_host"] or listen.host, listen.advertise)
        zk_auth = read_principal(s["zk_auth"]) if s["zk_auth"] is not None else None
        tls = tls_source(s, "worker", s["node_id"])
        check_bind(f"worker {s['node_id']}", listen.host, tls, s["insecure"])
        # secure by default: with TLS every call is authorised unless --authorize false
        authorize = tls is not None if s["authorize"] is None else s["authorize"]
        tokens_on = token_port(s["token_port"], tls is not None, authorize)
    except (SettingsError, ZkAuthError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    node_id, data_dir = s["node_id"], s["data_dir"]
    configure_timings(s["metrics_detail"])
    switch_interval.apply_switch_interval(s["switch_interval"])
    logging.basicConfig(level=s["log_level"].upper(),
                        format=f"%(asctime)s {node_id} %(levelname)s %(name)s: %(message)s")

    # every channel this worker opens (far-horizon copies, code fetches) presents its certificate
    use_process_credentials(tls.grpc_channel_credentials if tls is not None else None)

    async def run() -> None:
        node = Worker(s["zk"], node_id, data_dir, s["port"], s["session_timeout"], s["metrics_port"],
                      listen=listen, metrics_listen=metrics, replication_port=s["replication_port"],
                      task_threads=s["task_threads"], hooks=hooks, tls=tls, zk_auth=zk_auth,
                      authorize=authorize, token_port=tokens_on)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await node.start()
        # Written last: tests and `conductor dev` wait for this file to know the node is serving.
        (data_dir / "node.address").write_text(node.address)
        await stop.wait()
        log.warning("node %s stopping", node_id)
        t0 = time.monotonic()
        await node.stop()
        log.warning("node %s stopped in %.1fs", node_id, time.monotonic() - t0)

    asyncio.run(run())


if __name__ == "__main__":
    main()
