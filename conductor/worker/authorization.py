"""Per-request authorization on the worker: who is calling, and may it do what this method does to this module.

One gRPC server interceptor (:class:`Authorizer`) in front of every service, so
the services hold no security code and no method can be added without a rule:
:data:`RULES` maps each method to the permission it needs (docs/security.md),
and a method missing from it is refused (fail closed; a unit test checks the
table against the services). The caller is found once per call:

* its certificate, verified by mutual TLS (``identity.from_grpc_context``), or
* a bearer token in the ``authorization`` metadata, checked against the
  :class:`~conductor.metastore.tokens.TokenCache` (only its hash is stored).

No identity: ``UNAUTHENTICATED``; an identity without the permission:
``PERMISSION_DENIED`` with :class:`~conductor.security.acl.Denied`'s message
(who, which module, which permission, the ``conductor acl grant`` that fixes it).
The check runs before the service sees the request: a refused ``PutArtifact``
stores no byte, a refused ``Prepare`` imports nothing, a refused append changes
no depot. A stream (``AppendStream``) is checked once per module it names, not
per record. A far-horizon copy (``FetchCheckpoint``) is a replica's whole state:
only a worker that the group's znode names as a replica, fetching for itself,
gets one (the worker tells the checker the replicas it last learnt). ``conductor backup`` takes the same copy
(``BackupCheckpoint``) with admin on the module; ``conductor restore`` pushes one (``RestoreCheckpoint``) with
deploy on the module it creates (docs/backups.md).

Checks read the :class:`~conductor.metastore.acls.AclCache` (kept current by a
ZooKeeper watch) and remember their answers until the watch replaces the ACLs,
so a grant or revoke takes effect on the next request without a restart, and
a request costs a dict lookup.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from conductor.metastore.acls import AclCache
from conductor.metastore.tokens import TokenCache
from conductor.security.acl import ADMIN, ALL_MODULES, APPEND, DEPLOY, QUERY, Acls, Denied, permissions
from conductor.security.identity import Identity, IdentityError, from_grpc_context
from conductor.security.tokens import TokenRefused, presented_token
from conductor.wire.checked import Undecodable

log = logging.getLogger("millrace.node")

#: answers remembered per ACL version (identity, module, permission); past this the memo starts again
MEMO_ENTRIES = 4096

# Where a rule finds the module it checks.
REQUEST = "request"  # the request's ``module`` field (every message of a stream)
ANY = "any"          # some module: code artifacts belong to no module until ``Prepare`` names one
EVERY = "every"      # every module (``*``): operations on the whole worker


#: (module, group) -> the group's replicas as this worker last learnt them from its znode (None: not hosted here)
GroupReplicas = Callable[[str, int], Sequence[str] | None]


def _no_groups(module: str, group: int) -> None:
    return None


@dataclass(frozen=True)
class Rule:
    """The permission a method needs, and on which module; ``replicas_only``: only a worker that the request's
    group names as a replica may call, for itself (``request.follower``)."""

    permission: str
    scope: str = REQUEST
    replicas_only: bool = False


#: every method the worker serves -> its rule (the one place; a method absent here is refused)
RULES: dict[str, Rule] = {
    "/millrace.Client/Append": Rule(APPEND),
    "/millrace.Client/AppendStream": Rule(APPEND),
    "/millrace.Client/CommitBatch": Rule(APPEND),
    "/millrace.Client/Select": Rule(QUERY),
    "/millrace.Client/DepotRead": Rule(QUERY),
    "/millrace.Client/DepotStream": Rule(QUERY),  # the same reads as DepotRead, on one server stream
    "/millrace.Client/PartitionInfo": Rule(QUERY),
    "/millrace.Client/Progress": Rule(QUERY),
    "/millrace.Client/GroupStatus": Rule(QUERY),
    "/millrace.Client/Scan": Rule(QUERY),
    "/millrace.Client/ScanStream": Rule(QUERY),  # the same pages as Scan, on one server stream
    "/millrace.Client/QueryRun": Rule(QUERY),  # read-only; runs only the module's own code, by name
    # deleting records is more than appending them: the module's admins (retention's own trims need none)
    "/millrace.Client/DepotTrim": Rule(ADMIN),
    "/millrace.Client/Subscribe": Rule(QUERY),
    # code runs only if an identity with deploy shipped it: storing needs deploy on some module, and
    # Prepare (the import) deploy on the module it names
    "/millrace.code.Code/PutArtifact": Rule(DEPLOY, ANY),
    "/millrace.code.Code/Prepare": Rule(DEPLOY),
    "/millrace.code.Code/Discard": Rule(DEPLOY, ANY),
    # code, not data: whoever may query some module may fetch a version (an app's client loads its module's code
    # to route; workers fetch from each other); not yet narrowed to the modules that use the version
    "/millrace.code.Code/FetchArtifact": Rule(QUERY, ANY),
    "/millrace.admin.Admin/Ping": Rule(ADMIN, EVERY),
    # a far-horizon copy is a replica's whole state: only a replica of the group, and only for itself
    "/millrace.Replication/FetchCheckpoint": Rule(QUERY, replicas_only=True),
    # conductor backup: the same copy, for an operator; the module's whole state leaves the cluster to wherever the
    # operator points, so it takes admin on the module (the operator's role), not query (an app's reads)
    "/millrace.Replication/BackupCheckpoint": Rule(ADMIN),
    # the same backup written by the leader's worker into the folder the admin named (conductor.worker.backup_folder
    # checks that the admin's CLI wrote a probe there and writes nowhere else): admin too
    "/millrace.Replication/BackupToFolder": Rule(ADMIN),
    # conductor restore: writes a new module's whole state, as a deploy writes its code, so deploy on the module it
    # names (the receiver refuses a module that exists: a restore only creates)
    "/millrace.Replication/RestoreCheckpoint": Rule(DEPLOY),
}


class NotAReplica(Exception):
    """A method only a group's replicas call (a far-horizon copy) called by another identity, or for another."""


class Unauthenticated(Exception):
    """No identity: no client certificate and no (valid) token; the message says which and what to do."""


def _deny(identity: Identity, module: str, permission: str) -> Denied:
    if module != ANY:
        return Denied(identity, module, permission)
    denied = Denied(identity, "*", permission)
    verb = "ship" if permission == DEPLOY else "fetch"
    denied.args = (f"{identity} may not {permission} on any module (missing permission {permission!r}), so it may "
                   f"not {verb} code; an admin grants it with `conductor acl grant {identity} MODULE {permission}`",)
    return denied


class Checker:
    """The pure part: identity from a call, permission answers memoized per ACL version (no gRPC here)."""

    def __init__(self, acls: AclCache, tokens: TokenCache, replicas: GroupReplicas = _no_groups) -> None:
        self.acls = acls
        self.tokens = tokens
        #: the replicas of a group hosted here (which workers may copy it); unknown groups: nobody
        self.replicas = replicas
        self._memo: dict[tuple[Identity, str, str], bool] = {}
        self._memo_of: Acls | None = None
        self._certs: dict[bytes, Identity] = {}

    def identify(self, context: Any) -> Identity:
        """The caller: its verified certificate, else its bearer token; Unauthenticated if neither."""
        pems = list(context.auth_context().get("x509_pem_cert", ()))
        if pems:
            known = self._certs.get(pems[0])
            if known is None:
                try:
                    known = from_grpc_context(context)
                except IdentityError as e:
                    raise Unauthenticated(str(e)) from None
                if len(self._certs) >= MEMO_ENTRIES:
                    self._certs.clear()
                self._certs[pems[0]] = known
            return known
        token = presented_token(context.invocation_metadata())
        if token is None:
            raise Unauthenticated("no client certificate and no bearer token on this call: connect with mutual TLS "
                                  "and a certificate from the cluster's CA (`conductor certs issue --role app "
                                  "--name NAME CA_DIR`), or send `authorization: Bearer <token>` "
                                  "(`conductor token create --name APP`)")
        try:
            return self.tokens.verify(token)
        except TokenRefused as e:
            raise Unauthenticated(str(e)) from None

    def generation(self) -> tuple[object, object]:
        """Changes (by identity) whenever a watch replaced the ACLs or the token records: a long-lived stream
        authenticates and checks again then, so a revoke reaches streams opened before it."""
        return self.acls.acls, self.tokens.records

    def allowed(self, identity: Identity, module: str, permission: str) -> bool:
        acls = self.acls.acls
        if acls is not self._memo_of or len(self._memo) >= MEMO_ENTRIES:  # the watch replaced them: forget
            self._memo, self._memo_of = {}, acls
        key = (identity, module, permission)
        answer = self._memo.get(key)
        if answer is None:
            if module == ANY:
                answer = permission in permissions(acls, identity, ALL_MODULES) or any(
                    permission in perms for _m, who, perms in acls.rows() if who == identity)
            else:
                answer = permission in permissions(acls, identity, module)
            self._memo[key] = answer
        return answer

    def check(self, identity: Identity, rule: Rule, request: Any) -> None:
        """Raise Denied / NotAReplica unless ``identity`` may make ``request`` under ``rule``."""
        if rule.replicas_only:
            self._require_replica(identity, request)
        module = (ALL_MODULES if rule.scope == EVERY else ANY if rule.scope == ANY
                  else str(getattr(request, "module", "")))
        if not self.allowed(identity, module, rule.permission):
            raise _deny(identity, module, rule.permission)

    def _require_replica(self, identity: Identity, request: Any) -> None:
        """``identity`` is a worker fetching for itself that the group's znode names as a replica."""
        module, group = str(getattr(request, "module", "")), int(getattr(request, "group", 0))
        follower = str(getattr(request, "follower", ""))
        if identity.role != "worker" or follower != identity.name:
            raise NotAReplica(f"{identity} may not copy a replica's checkpoint of {module}/{group}"
                              f"{f' for worker {follower!r}' if follower else ''}: only a replica of the group, "
                              "for itself, fetches far-horizon checkpoints (Replication.FetchCheckpoint)")
        replicas = self.replicas(module, group)
        if replicas is None or identity.name not in replicas:
            known = "this worker hosts no replica of it" if replicas is None else f"its replicas: {list(replicas)}"
            raise NotAReplica(f"{identity} is not a replica of {module}/{group} ({known}): only the workers the "
                              "group's znode names may copy its checkpoint")


class Authorizer(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # (grpc ships no types)
    """The worker's gRPC interceptor: every call is checked against :data:`RULES` before its service runs.

    Built with the server (before ZooKeeper is reached); :meth:`attach` gives it
    the ACL and token caches once the metastore is up. Calls before that are
    refused with ``UNAVAILABLE`` (the worker is not registered yet, so none are
    expected).
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.checker: Checker | None = None
        #: method -> (the handler gRPC gave, our wrapped one): generic handlers return the same object per call
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def attach(self, acls: AclCache, tokens: TokenCache, replicas: GroupReplicas = _no_groups) -> None:
        self.checker = Checker(acls, tokens, replicas)

    def close(self) -> None:
        if self.checker is not None:
            self.checker.acls.close()
            self.checker.tokens.close()

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # UNIMPLEMENTED, as without us
        method = handler_call_details.method
        seen = self._wrapped.get(method)
        if seen is not None and seen[0] is handler:
            return seen[1]
        wrapped = self._wrap(handler, method, RULES.get(method))
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    async def _caller(self, context: Any, method: str, rule: Rule | None) -> tuple[Checker, Identity, Rule]:
        """Authenticate the call (abort if it cannot be); the rule it is checked by."""
        checker = self.checker
        if checker is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"node {self.node_id} is starting: it cannot check permissions yet; try again")
        assert checker is not None
        try:
            identity = checker.identify(context)
        except Unauthenticated as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
        if rule is None:  # a method nobody gave a rule: refused, never open by omission
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{method} has no authorization rule on node {self.node_id}: refused")
        assert rule is not None
        return checker, identity, rule

    async def _require(self, context: Any, checker: Checker, identity: Identity, rule: Rule, request: Any) -> None:
        try:
            checker.check(identity, rule, request)
        except (Denied, NotAReplica) as e:
            log.info("node %s refused a call: %s", self.node_id, e)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

    async def _checked_stream(self, requests: AsyncIterator[Any], context: Any, checker: Checker,
                              identity: Identity, rule: Rule) -> AsyncIterator[Any]:
        """A request stream checked once per module it names (an undecodable body passes to checked.py), and
        again from scratch (the caller re-authenticated, each module re-checked) after a revoke or grant: an
        open ``AppendStream`` lives as long as the client, and a revoked token must not keep appending on it."""
        modules: set[str] = set()
        seen = checker.generation()
        async for request in requests:
            now = checker.generation()
            if now[0] is not seen[0] or now[1] is not seen[1]:
                seen, modules = now, set()
                try:
                    identity = checker.identify(context)
                except Unauthenticated as e:
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
            module = None if isinstance(request, Undecodable) else getattr(request, "module", None)
            if rule.scope == REQUEST and module is not None and module not in modules:
                await self._require(context, checker, identity, rule, request)
                modules.add(module)
            yield request

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str, rule: Rule | None) -> grpc.RpcMethodHandler:
        """``handler`` behind the check, of the same kind (unary or streaming on either side)."""
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        caller, require, checked_stream = self._caller, self._require, self._checked_stream

        async def upfront(context: Any, request: Any) -> tuple[Checker, Identity, Rule]:
            checker, identity, r = await caller(context, method, rule)
            if isinstance(request, Undecodable):
                return checker, identity, r  # the checked handler answers INVALID_ARGUMENT; nothing runs
            if request is not None or r.scope != REQUEST:  # a stream's module-less rule: before any message
                await require(context, checker, identity, r, request)
            return checker, identity, r

        if handler.request_streaming and handler.response_streaming:
            inner_ss = handler.stream_stream

            async def both(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
                checker, identity, r = await upfront(context, None)
                async for reply in inner_ss(checked_stream(requests, context, checker, identity, r), context):
                    yield reply
            return grpc.stream_stream_rpc_method_handler(both, **kw)
        if handler.request_streaming:
            inner_su = handler.stream_unary

            async def streaming(requests: AsyncIterator[Any], context: Any) -> Any:
                checker, identity, r = await upfront(context, None)
                return await inner_su(checked_stream(requests, context, checker, identity, r), context)
            return grpc.stream_unary_rpc_method_handler(streaming, **kw)
        if handler.response_streaming:
            inner_us = handler.unary_stream

            async def replies(request: Any, context: Any) -> AsyncIterator[Any]:
                await upfront(context, request)
                async for reply in inner_us(request, context):
                    yield reply
            return grpc.unary_stream_rpc_method_handler(replies, **kw)
        inner_uu = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            await upfront(context, request)
            return await inner_uu(request, context)
        return grpc.unary_unary_rpc_method_handler(unary, **kw)
