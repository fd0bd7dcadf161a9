"""The one port through which a leader's task thread has its replog entries built (:class:`EntryPort`).

One port per replica. Its task thread calls :meth:`EntryPort.build` for each
request in the order the entries will reach the log, right before staging
each one, because what an entry writes depends on every entry appended before
it (depot offsets, read-modify-write transforms, microbatch and progress
markers, inbox positions). The stream runner is always the group's build
version's (:class:`topology.group_code.GroupCode`): an append after a switch
entry in the same drain runs the new version's topologies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pstate.store import ChangeSetBuilder, TaskGroupStore
from topology.dataflow.group import GroupDataflow
from topology.entries.batch_commit import build_batch_commit
from topology.entries.client_append import build_depot_append
from topology.entries.requests import (
    BatchCommit,
    CodeSwitch,
    DepotAppend,
    DepotTrim,
    EntryRequest,
    InboundHops,
    MigrationBatch,
    OutboxTrim,
    RetentionCheck,
)
from topology.entries.retention import build_depot_trim, build_retention_check
from topology.group_code import GroupCode
from topology.stream import StreamRunner


class EntryPort:
    """Builds one replica's entries from typed requests (see the module docstring); task thread only.

    ``store`` is a getter (a far-horizon install replaces the store object);
    ``code`` is the replica's code versions (None: a store with no module code,
    as unit tests and benchmarks open one; then no topology runs).
    """

    def __init__(self, store: Callable[[], TaskGroupStore], code: GroupCode | None) -> None:
        self._store = store
        self._code = code
        #: retried appends answered from the idempotence window (not appended again)
        self.retries_answered = 0

    def build(self, request: EntryRequest) -> tuple[ChangeSetBuilder | None, Any]:
        """The change set to stage and append for ``request`` (None: nothing to append), and its result.

        Results: a depot append's ``(firsts, acks)``; a microbatch commit's
        ``skipped`` (True when the group had it); a trim's new start; a retention
        check's records deleted; None for the others. A
        request that cannot be built raises a typed error (ValueError, or the
        pstate, topology and replog errors) that fails it alone.
        """
        store = self._store()
        if isinstance(request, DepotAppend):
            builder, reply, retried = build_depot_append(store, self._runner(), request)
            self.retries_answered += retried
            return builder, reply
        if isinstance(request, BatchCommit):
            commit = build_batch_commit(store, self._runner(), request)
            return commit, commit is None
        if isinstance(request, CodeSwitch):
            return self._group_code().switch_entry(store, request.version), None
        if isinstance(request, MigrationBatch):
            return self._group_code().migration_entry(store, request.limit), None
        if isinstance(request, InboundHops):
            return self._flow().build_inbound(request.now_ms), None
        if isinstance(request, OutboxTrim):
            return self._flow().build_trim(), None
        if isinstance(request, DepotTrim):
            return build_depot_trim(store, request)
        if isinstance(request, RetentionCheck):
            return build_retention_check(store, self._runner(), request)
        raise TypeError(f"not an entry request: {request!r}")  # a bug: EntryRequest is a closed union

    def _runner(self) -> StreamRunner | None:
        return self._code.runner if self._code is not None else None

    def _group_code(self) -> GroupCode:
        assert self._code is not None, "code switches and migrations need the replica's GroupCode"
        return self._code

    def _flow(self) -> GroupDataflow:
        flow = self._code.flow if self._code is not None else None
        assert flow is not None, "inbound and trim entries come only from a replica's dataflow"
        return flow
