"""Deploying a module with its code: every chosen worker proves it can run the code before the module exists.

    groups = deploy_code(conductor, spec, package_code("examples.word_count:WordCount"))

Steps (Rama ships a jar the same way, minus the proof):

1. place the module's task groups (nothing written yet);
2. put the artifact on the chosen workers: on all of them in parallel when it
   is small (up to :data:`DIRECT_PUT_BYTES`; a typical module's code is a few
   KB), else on one (the first that takes it);
3. ask every chosen worker, in parallel, to *prepare* it: a worker without it
   fetches it from that one over gRPC, checks its sha256, imports it in
   isolation and builds the module's definition;
4. if any worker refused or did not answer, discard the version on every
   chosen worker and raise :class:`CodeRefused`, naming each worker and its
   error: nothing of the module is in ZooKeeper, and no worker keeps its code;
5. otherwise create the module, its groups and its code version (with the
   workers that hold it) in one ZooKeeper transaction.

A crash between 2 and 5 leaves an unreferenced version on some workers; they
delete it after a grace period (``Worker._sweep_code``).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from conductor.client.code import CodeCache, default_cache
from conductor.controller import Conductor
from conductor.metastore import GroupState, ModuleSpec
from conductor.metastore.versions import CodeVersion
from conductor.wire import code_pb2
from conductor.wire import code_pb2_grpc as codeg
from conductor.wire.channels import open_channel
from conductor.wire.options import GRPC_OPTIONS
from topology.artifact import Artifact
from topology.code_loader import unload
from topology.module import ModuleDefinition

log = logging.getLogger("millrace.conductor")

#: one worker's PutArtifact or Discard
TRANSFER_TIMEOUT_S = 60.0
#: artifacts up to this size are put on every chosen worker directly; bigger ones on one, the others fetch it
DIRECT_PUT_BYTES = 4 * 1024 * 1024
#: one worker's Prepare: a fetch, an import and a define()
PREPARE_TIMEOUT_S = 120.0


class CodeRefused(Exception):
    """A worker chosen for the module cannot run its code; the deploy changed nothing (the message lists why)."""

    def __init__(self, module: str, refusals: dict[str, str], update: bool = False) -> None:
        self.module = module
        self.refusals = dict(refusals)
        reasons = "; ".join(f"worker {n}: {why}" for n, why in sorted(refusals.items()))
        outcome = ("the running version keeps running, unchanged" if update
                   else "nothing was left in ZooKeeper or on the workers")
        super().__init__(f"module {module} was not {'updated' if update else 'deployed'}: {len(refusals)} "
                         f"worker(s) cannot run its code. {reasons}. Install what the code needs on those workers "
                         f"(or ship it in a wheel with --code), then try again; {outcome}")


def check_locally(artifact: Artifact, module_ref: str) -> ModuleDefinition:
    """Import the artifact here, in isolation, exactly as a worker will, and build the module's definition:
    a broken package or define() is refused before the cluster is touched."""
    with tempfile.TemporaryDirectory(prefix="millrace-code-") as tmp:
        cache = CodeCache(Path(tmp))
        cache.put(artifact.sha256, artifact.chunks())
        try:
            return cache.load(artifact.sha256, module_ref).build()
        finally:
            unload(artifact.sha256)


#: called between steps 4 and 5 with the placement and a channel per chosen worker (``conductor restore`` pushes
#: each group's checkpoint there); returns the groups to create (with what it learnt); raising stops the deploy
#: as a refusal does
BeforeCreate = Callable[[dict[int, GroupState], dict[str, grpc.Channel]], dict[int, GroupState]]


def deploy_code(conductor: Conductor, spec: ModuleSpec, artifact: Artifact,
                on_step: Callable[[str], None] | None = None,
                before_create: BeforeCreate | None = None) -> dict[int, GroupState]:
    """Ship `artifact` to the workers chosen for `spec` and deploy it (see the module docstring)."""
    step = on_step or (lambda _msg: None)
    spec = dataclasses.replace(spec, code=artifact.sha256)
    groups = conductor.place_module(spec)
    nodes = sorted({n for st in groups.values() for n in st.replicas})
    addresses = {n: info.address for n in nodes if (info := conductor.ms.nodes.get(n)) is not None}
    channels = {n: open_channel(a, GRPC_OPTIONS) for n, a in addresses.items()}  # TLS: the process's certificate
    try:
        step(f"shipping code {artifact.sha256[:12]} ({artifact.size:,} bytes) to {', '.join(nodes)}")
        holder, refusals = put_artifact(channels, nodes, artifact)
        if holder is not None:
            step(f"each worker checks its hash and imports it (fetching it from {holder} if it lacks it)")
            refusals.update(prepare_code(channels, spec, [addresses[holder]]))
        refusals.update({n: "not registered in ZooKeeper any more (stopped?)" for n in nodes if n not in addresses})
        if refusals:
            raise CodeRefused(spec.name, refusals)
        if before_create is not None:
            groups = before_create(groups, channels)
        version = CodeVersion(artifact.sha256, artifact.size, artifact.kind, spec.module_ref, artifact.origin,
                              tuple(nodes))
        deployed = conductor.deploy(spec, groups, version)
    except BaseException:
        discard_code(channels, artifact.sha256)
        raise
    finally:
        for ch in channels.values():
            ch.close()
    keep_locally(artifact)
    return deployed


def keep_locally(artifact: Artifact) -> None:
    """The machine that shipped a version keeps it in its code cache (the one apps' clients load from): an update
    from here compares against it, and a client here loads it, without fetching it back from a worker."""
    try:
        default_cache().put(artifact.sha256, artifact.chunks())
    except OSError as e:  # a read-only or full home: it is fetched when needed, as on any other machine
        log.info("could not keep code version %s in the local cache: %s", artifact.sha256[:12], e)


def put_artifact(channels: dict[str, grpc.Channel], nodes: list[str],
                 artifact: Artifact) -> tuple[str | None, dict[str, str]]:
    """Put the artifact on the workers (see the module docstring); (the first that took it, or None, and why
    each did not when none did). A worker that did not take it fetches it when it prepares.

    Sending a small artifact to each worker costs the operator's machine nothing, and spares every other worker
    a connection and a transfer from the holder while it serves appends (``conductor update``).
    """
    targets = [n for n in nodes if n in channels]
    batches = [[n] for n in targets] if artifact.size > DIRECT_PUT_BYTES else [targets]  # big: until one takes it
    failed: dict[str, str] = {}
    for batch in batches:
        futures = {n: codeg.CodeStub(channels[n]).PutArtifact.future(_chunks(artifact), timeout=TRANSFER_TIMEOUT_S)
                   for n in batch}
        took = []
        for n, fut in futures.items():
            try:
                fut.result()
                took.append(n)
            except grpc.RpcError as e:
                failed[n] = f"could not receive the code: {e.code().name} {e.details()}"
        if took:
            return took[0], {}
    return None, failed


def _chunks(artifact: Artifact) -> Iterator[code_pb2.ArtifactChunk]:
    for i, c in enumerate(artifact.chunks()):
        yield code_pb2.ArtifactChunk(sha256=artifact.sha256 if i == 0 else "", size=artifact.size, data=c)


def prepare_code(channels: dict[str, grpc.Channel], spec: ModuleSpec, sources: list[str]) -> dict[str, str]:
    """Every worker's refusal (an import error, a define() that raised, no answer), by worker."""
    assert spec.code is not None
    req = code_pb2.PrepareRequest(module=spec.name, module_ref=spec.module_ref, sha256=spec.code, sources=sources,
                                  declared_module=spec.defined_as or "")
    futures = {n: codeg.CodeStub(ch).Prepare.future(req, timeout=PREPARE_TIMEOUT_S) for n, ch in channels.items()}
    refusals = {}
    for n, fut in futures.items():
        try:
            reply = fut.result()
        except grpc.RpcError as e:
            refusals[n] = f"did not answer whether it can run the code ({e.code().name} {e.details()})"
            continue
        if not reply.ok:
            refusals[n] = reply.error
    return refusals


def discard_code(channels: dict[str, grpc.Channel], sha256: str) -> None:
    """Remove the version from every chosen worker (each keeps it if a deployed module uses it)."""
    futures = {n: codeg.CodeStub(ch).Discard.future(code_pb2.DiscardRequest(sha256=sha256),
                                                     timeout=TRANSFER_TIMEOUT_S) for n, ch in channels.items()}
    for n, fut in futures.items():
        try:
            fut.result()
        except grpc.RpcError as e:
            log.warning("could not discard code version %s on worker %s (%s); it deletes it itself later",
                        sha256[:12], n, e.code().name)
