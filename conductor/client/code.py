"""Module code on this machine: artifacts fetched over gRPC, checked against their hash, one import root each.

Every process that runs module code keeps a :class:`CodeCache`: a worker in
``<data>/code`` (it also serves its artifacts to others), an app or a Spark
driver in ``~/.cache/millrace/code`` (``MILLRACE_CODE_CACHE``). A version is a
folder named by the artifact's sha256 holding ``artifact.zip`` and its
unpacked import root ``root/``; it appears by one rename once both are
complete and the bytes matched the hash, so a crash never leaves a version
that looks whole but is not, and two processes fetching the same version do
not disturb each other.

No shared filesystem and no ``PYTHONPATH``: a process that lacks a version
fetches it from the workers that hold it (the version's znode names them)
and imports it in isolation (:mod:`topology.code_loader`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc

from conductor.client.router import dial_address
from conductor.metastore import Metastore, ModuleSpec
from conductor.wire import code_pb2
from conductor.wire import code_pb2_grpc as codeg
from conductor.wire.channels import Credentials, open_channel
from conductor.wire.errors import error_from_rpc
from conductor.wire.options import GRPC_OPTIONS
from topology.artifact import CHUNK_BYTES, ArtifactError, extract
from topology.code_loader import load_class, unload
from topology.module import Module, ModuleDefinitionError, load_module

log = logging.getLogger("millrace.code")

CACHE_ENV = "MILLRACE_CODE_CACHE"
#: one artifact fetch from one holder
FETCH_TIMEOUT_S = 60.0


class CodeUnavailable(ModuleDefinitionError):
    """No holder of a code version could deliver it intact; the message lists whom we asked and what failed."""


class CodeCache:
    """Code versions on this machine's disk (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def artifact_path(self, sha256: str) -> Path:
        return self.root / sha256 / "artifact.zip"

    def import_root(self, sha256: str) -> Path:
        return self.root / sha256 / "root"

    def has(self, sha256: str) -> bool:
        return self.import_root(sha256).is_dir()

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def put(self, sha256: str, chunks: Iterable[bytes]) -> bool:
        """Store a version from its bytes: checked against `sha256`, unpacked, then renamed into place.
        False if it was there already (the bytes are then read and dropped)."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-", dir=self.root))
        try:
            digest = hashlib.sha256()
            with open(staging / "artifact.zip", "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            if digest.hexdigest() != sha256:
                raise ArtifactError(f"artifact bytes hash to {digest.hexdigest()}, not the version {sha256} they "
                                    "were sent as (damaged in transit, or a wrong holder)")
            extract(staging / "artifact.zip", staging / "root")
            if self.has(sha256):
                return False
            try:
                os.rename(staging, self.root / sha256)
            except OSError:
                if self.has(sha256):  # another process or thread finished first
                    return False
                raise
            return True
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def chunks(self, sha256: str, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        with open(self.artifact_path(sha256), "rb") as f:
            while chunk := f.read(size):
                yield chunk

    def fetch(self, sha256: str, sources: Iterable[str], credentials: Credentials | None = None) -> None:
        """Fetch a version from the first of `sources` (gRPC addresses) that delivers it intact (over TLS with
        `credentials`, or the process's: conductor.wire.channels)."""
        tried = []
        refused: list[Exception] = []  # every worker applies the same tokens and ACLs
        for address in sources:
            try:
                with open_channel(address, GRPC_OPTIONS, credentials) as channel:
                    stream = codeg.CodeStub(channel).FetchArtifact(code_pb2.FetchArtifactRequest(sha256=sha256),
                                                                   timeout=FETCH_TIMEOUT_S)
                    self.put(sha256, (c.data for c in stream))
                log.info("fetched code version %s from %s", sha256[:12], address)
                return
            except grpc.RpcError as e:
                tried.append(f"{address}: {e.code().name} {e.details()}")
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    refused.append(error_from_rpc(e))
            except ArtifactError as e:
                tried.append(f"{address}: {e}")
        # refused by every worker for who we are: that refusal is the cause (the client raises it, typed)
        cause = refused[-1] if refused and len(refused) == len(tried) else None
        raise CodeUnavailable(f"cannot fetch code version {sha256} from any holder "
                              f"({'; '.join(tried) or 'no worker holds it'}); is a worker that has it running?"
                              ) from cause

    def load(self, sha256: str, module_ref: str) -> type[Module]:
        return load_class(self.import_root(sha256), sha256, module_ref)

    def discard(self, sha256: str) -> bool:
        """Forget a version: its modules in this process and its folder. False if it was not here."""
        unload(sha256)
        folder = self.root / sha256
        if not folder.exists():
            return False
        shutil.rmtree(folder)
        return True

    def sweep(self, keep: set[str], older_than_s: float) -> list[str]:
        """Delete versions not in `keep` whose folder is older than `older_than_s` (a deploy in flight stores
        its version before the metastore names it), and staging folders a crash left behind."""
        removed: list[str] = []
        now = time.time()
        if not self.root.is_dir():
            return removed
        for p in self.root.iterdir():
            if p.name in keep or now - p.stat().st_mtime <= older_than_s:
                continue
            if p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)
            else:
                self.discard(p.name)
            removed.append(p.name)
        return removed


def default_cache() -> CodeCache:
    """An app's or a Spark driver's cache: ``$MILLRACE_CODE_CACHE``, else ``~/.cache/millrace/code``."""
    if os.environ.get(CACHE_ENV):
        return CodeCache(Path(os.environ[CACHE_ENV]))
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return CodeCache(base / "millrace" / "code")


def code_sources(ms: Metastore, module: str, sha256: str, exclude: str | None = None,
                 token_port: bool = False) -> list[str]:
    """gRPC addresses to fetch a version from: the workers that held it at deploy first, then every other live
    worker (one that fetched it since has it too); ``token_port``: their token ports (an app with a token)."""
    version = ms.versions.get(module, sha256)
    holders = list(version.holders) if version else []
    nodes = [n for n in [*holders, *(n for n in ms.nodes.live() if n not in holders)] if n != exclude]
    infos = (ms.nodes.get(n) for n in nodes)
    return [a for a in (dial_address(i, token_port) for i in infos if i is not None) if a]


def load_deployed(ms: Metastore, spec: ModuleSpec, cache: CodeCache, exclude: str | None = None,
                  credentials: Credentials | None = None, token_port: bool = False) -> type[Module]:
    """The Module class a deployed module runs: its code version (fetched if this machine lacks it), or, for a
    module deployed without shipped code, the class on this interpreter's path."""
    if spec.code is None:
        return load_module(spec.module_ref)
    if not cache.has(spec.code):
        cache.fetch(spec.code, code_sources(ms, spec.name, spec.code, exclude, token_port), credentials)
    return cache.load(spec.code, spec.module_ref)
