"""A process keeps the memory it freed for its next megabyte-sized buffers (glibc's ``mallopt``).

A batched append moves each ~1 MB entry through several fresh buffers in every process: the gRPC request's
bytes, the stored batch's value, the log frame, the replication message, a follower's receive buffer and the
frames it parses out. glibc's malloc serves a block that large from a fresh ``mmap`` or from the top of its
heap, and with its default, self-adjusting thresholds it hands the freed megabytes straight back to the
kernel (``munmap``, or a trim of the heap once a few MB sit free at its top). The next buffer then
page-faults every 4 KiB page in again and the kernel zeroes each one: a 1 MB copy on the bench box took
0.7-0.9 ms that way against 0.05 ms into memory malloc kept (session 17, docs/performance.md). Fixing the
two thresholds turns the self-adjustment off: blocks below ``MMAP_THRESHOLD_BYTES`` come from the heap, and
the heap gives memory back only past ``TRIM_THRESHOLD_BYTES`` free at its top, so a worker's steady traffic
reuses the same pages. The cost is that much RSS kept after a burst, per malloc arena (a few, one per busy
thread at most).

Process-wide, so it is the process's owner's choice, made once: the worker's entry point makes it (as it
sets the GIL switch interval); the client library never does on its own, an app that sends batches of
megabytes calls :func:`keep_freed_memory` itself (exported by ``conductor.client``; the client of
``bench.cluster_append`` does: 750 page faults per ``append_many`` of 10,000 records without it, 15 with it).
Elsewhere than glibc (no ``mallopt``) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("millrace.node")

#: glibc's ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD`` (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: blocks below this come from the heap (glibc's own ceiling for the threshold on 64-bit: 32 MiB): a
#: batched append's entries (about 1 MB) and the messages carrying them are far below it
MMAP_THRESHOLD_BYTES = 32 << 20
#: the heap keeps up to this much free at its top rather than give it back (a few entries' buffers)
TRIM_THRESHOLD_BYTES = 64 << 20


def keep_freed_memory() -> bool:
    """Fix glibc's thresholds (module docstring); False where this is not glibc or it refused."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not ok:
        log.warning("mallopt refused the heap thresholds; megabyte buffers page-fault in anew each time")
    return ok
