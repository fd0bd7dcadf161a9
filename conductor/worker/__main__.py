"""``python -m conductor.worker``: run one worker process until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time
from pathlib import Path

from conductor.worker.worker import Worker

log = logging.getLogger("millrace.node")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m conductor.worker", description="Run a Millrace worker.")
    p.add_argument("--zk", required=True, help="ZooKeeper connect string, e.g. 127.0.0.1:2181")
    p.add_argument("--node-id", required=True)
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--port", type=int, default=0, help="gRPC port on 127.0.0.1 (0 = any free port)")
    p.add_argument("--session-timeout", type=float, default=6.0, help="ZooKeeper session timeout, seconds")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port on 127.0.0.1 (0 = free)")
    p.add_argument("--log-level", default=os.environ.get("MILLRACE_LOG_LEVEL", "WARNING"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {args.node_id} %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        node = Worker(args.zk, args.node_id, args.data_dir, args.port, args.session_timeout, args.metrics_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await node.start()
        # Written last: tests and `conductor dev` wait for this file to know the node is serving.
        (args.data_dir / "node.address").write_text(node.address)
        await stop.wait()
        log.warning("node %s stopping", args.node_id)
        t0 = time.monotonic()
        await node.stop()
        log.warning("node %s stopped in %.1fs", args.node_id, time.monotonic() - t0)

    asyncio.run(run())


if __name__ == "__main__":
    main()
