"""Who may open a worker-to-worker link: only workers, proven by their certificates.

With TLS on, a replication link's peer is read from the certificate TLS verified
(:mod:`conductor.security.identity`), never from what a frame says: ``PeerFrame.src`` is self-declared, so a link accepts only a
``worker`` identity, and each of its frames must name that same worker as its
sender. Which groups that worker may replicate is then ``Worker.deliver``'s check
against the group's replicas, on the authenticated name. (Who may copy a replica,
``FetchCheckpoint``, is the gRPC interceptor's rule: ``conductor.worker.authorization``.)
"""

from __future__ import annotations

from typing import Any

from conductor.security.identity import Identity
from conductor.security.tls import PeerRefused, check_link_peer


def is_worker(peer: Identity) -> bool:
    return peer.role == "worker"


def link_peer(transport: Any) -> Identity:
    """The worker on the other end of a TLS link; PeerRefused or IdentityError (the message says why)."""
    return check_link_peer(transport, is_worker)


def expect_worker(transport: Any, node_id: str) -> Identity:
    """The dialling side: the peer must be the worker ``node_id`` we meant to reach (not any cluster member)."""
    return check_link_peer(transport, {Identity("worker", node_id)})


__all__ = ["PeerRefused", "expect_worker", "is_worker", "link_peer"]
