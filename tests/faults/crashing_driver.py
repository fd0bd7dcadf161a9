"""``python -m tests.faults.crashing_driver --crash-after-groups N DRIVER-ARGS``: a microbatch driver that dies.

The same process as ``python -m topology.spark.microbatch DRIVER-ARGS``, whose
driver SIGKILLs itself once the commits of the first N task groups of a batch
are answered: a crash in the middle of committing one batch, every time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import signal
import sys
from typing import Any

from topology.spark.microbatch import main as driver_main

log = logging.getLogger("millrace.microbatch")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults.crashing_driver", add_help=False)
    p.add_argument("--crash-after-groups", type=int, required=True)
    flags, rest = p.parse_known_args()

    def sent(group: int, reply: concurrent.futures.Future[Any]) -> None:
        if group + 1 >= flags.crash_after_groups:
            reply.result()
            log.warning("test hook: killing the driver after %d group commit(s) of a batch", group + 1)
            os.kill(os.getpid(), signal.SIGKILL)

    return driver_main(rest, sent=sent)


if __name__ == "__main__":
    sys.exit(main())
