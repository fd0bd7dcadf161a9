"""Cluster status as plain data: what `conductor status` renders and what a metrics endpoint can export.

Two sources are combined, and they answer different questions:

* the metastore (ZooKeeper) says what the conductor *decided*: the leader,
  epoch, ISR and OSR of every task group;
* the leader's ``GroupStatus`` RPC says what the replica is *doing*: whether it
  has taken the leadership yet, its log end, its apply offset and how far each
  follower is behind.

They can disagree for a moment (a leader elected in ZooKeeper that has not
noticed yet, a leader that is stopped or partitioned), and that disagreement is
exactly what an operator needs to see, so nothing here raises on an
unreachable node: each group carries a ``problem`` string instead. Everything
returned is plain dicts, lists, strings and ints so it can go to JSON,
Prometheus or a table without translation.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from conductor.metastore import GroupState, Metastore, ModuleNotFound
from conductor.metastore.module_spec import MIN_ISR, REASSIGN_COPY_BYTES_PER_S, ModuleSpec
from conductor.metastore.plans import ReassignmentPlan
from conductor.reassigning import plan_progress
from conductor.wire import channels as wire_channels
from conductor.wire import millrace_pb2 as pb
from conductor.wire import millrace_pb2_grpc as pbg
from conductor.wire.options import GRPC_OPTIONS
from replog.election import leaderless_reason

#: How long one GroupStatus call may take before the leader is shown as unreachable. A stopped or
#: partitioned node would otherwise hang the whole status view.
RPC_TIMEOUT_S = 2.0

# Many groups are queried in parallel so one unreachable node costs one timeout, not one per group.
_MAX_PARALLEL_RPCS = 16


class Channels(wire_channels.Channels):
    """The channels of a status view: one per worker for every group it asks about, and for every refresh of a
    poll (``conductor update`` waiting for the switch, ``status --watch``)."""

    #: a worker that restarts is asked again within a poll or two, not after gRPC's default backoff (up to 2 min)
    OPTIONS = [*GRPC_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
               ("grpc.max_reconnect_backoff_ms", 1000)]

    def __init__(self, credentials: wire_channels.Credentials | None = None) -> None:
        super().__init__(self.OPTIONS, credentials)


def query_group_status(address: str, module: str, group: int, timeout_s: float = RPC_TIMEOUT_S,
                       channels: Channels | None = None) -> dict[str, Any]:
    """Ask the replica at ``address`` for its view of ``module/group``; never raises on RPC failure.

    Returns ``{"reachable": False, "error": ...}`` when the node does not
    answer within ``timeout_s``, so one dead node cannot break a status view.
    """
    try:
        if channels is None:
            with Channels() as own:
                reply = _group_status(own.get(address), module, group, timeout_s)
        else:
            reply = _group_status(channels.get(address), module, group, timeout_s)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else str(e)
        name = code.name if code is not None else "ERROR"
        return {"reachable": False, "error": f"{name}: {details}"}
    c = reply.catchup
    catchup = None if not reply.HasField("catchup") else {
        "leader": c.leader, "round": c.round, "bytes_done": c.bytes_done, "bytes_total": c.bytes_total,
        "bytes_per_s": c.bytes_per_s, "state": c.state}
    return {
        "reachable": True, "error": None, "role": reply.role, "epoch": reply.epoch,
        "log_start": reply.log_start, "log_end": reply.log_end, "apply_offset": reply.apply_offset,
        "applied_offset": reply.applied_offset, "follower_offsets": dict(reply.follower_offsets),
        "catchup": catchup, "dead_letters": reply.dead_letters, "envelopes_in_flight": reply.envelopes_in_flight,
        "appends_waiting_for_hops": reply.appends_waiting_for_hops,
        "code_version": reply.code_version, "code_build": reply.code_build,
        "migrations": [{"pstate": m.pstate, "id": m.id, "done": m.done, "rewritten": m.rewritten}
                       for m in reply.migrations],
        "fault": reply.fault or None,
        "depots": [{"depot": d.depot, "task": d.task, "start": d.start, "end": d.end, "records": d.records,
                    "bytes": d.bytes} for d in reply.depot_partitions],
        "depot_bytes": dict(reply.depot_bytes),
    }


def _group_status(channel: grpc.Channel, module: str, group: int, timeout_s: float) -> pb.GroupStatusReply:
    reply: pb.GroupStatusReply = pbg.ClientStub(channel).GroupStatus(
        pb.GroupStatusRequest(module=module, group=group), timeout=timeout_s)
    return reply


def follower_lag(log_end: int, follower_offset: int) -> int:
    """Entries a follower still lacks.

    ``log_end`` is exclusive (the next offset the leader will assign) while a
    follower offset is the highest offset it holds (inclusive), so a caught-up
    follower holds ``log_end - 1`` and has lag 0. The node reports "holds
    nothing" as 0 (the field is unsigned), hence the floor at 0.
    """
    return max(0, log_end - 1 - follower_offset)


def _spec_summary(spec: ModuleSpec) -> dict[str, Any]:
    return {
        "module": spec.name, "module_ref": spec.module_ref, "tasks": spec.tasks, "group_count": spec.threads,
        "replication_factor": spec.replication_factor, "workers": spec.workers,
        "min_isr": spec.option(MIN_ISR), "options": dict(sorted(spec.options.items())),
        "effective_options": spec.shown_options(),
    }


#: module states shown by `conductor status`
RUNNING = "running"
LEADERSHIP_BALANCING = "leadership-balancing"


def plan_overview(plan: ReassignmentPlan, groups: Mapping[int, tuple[GroupState, int]], live: Mapping[str, int],
                  catchups: Mapping[int, list[dict[str, Any]]], copy_limit: int) -> dict[str, Any]:
    """A module's reassignment in progress: its groups by phase, and the far-horizon copies of the groups
    copying summed up (bytes of their current rounds, their rates, the time left at those rates).

    ``catchups`` are what the added replicas report (:func:`module_status`); ``copy_limit`` the module's
    ``reassignment.copy.bytes.per.second`` (a budget each worker's copies of the module share). Groups still
    queued copy later: the ETA is the running copies', not the plan's.
    """
    rows = plan_progress(plan, groups, live)
    phases = Counter(r.phase for r in rows)
    copies = [c for r in rows if r.phase == "copying" for c in catchups.get(r.group, []) if c["state"] == "copying"]
    done, total = sum(c["bytes_done"] for c in copies), sum(c["bytes_total"] for c in copies)
    rate = sum(c["bytes_per_s"] for c in copies)
    return {"kind": plan.kind, "replication_factor": plan.replication_factor, "workers": plan.workers,
            "cancel": plan.cancel, "requested": plan.requested, "groups": len(rows), "done": phases["done"],
            "phases": {p: n for p, n in sorted(phases.items()) if p != "done"},
            "waiting": sorted({r.detail for r in rows if r.phase in ("waiting", "handing-off") and r.detail}),
            "copies": len(copies), "bytes_done": done, "bytes_total": total, "bytes_per_s": rate,
            "eta_s": (total - done) / rate if rate > 0 else None, "copy_limit_bytes_per_s": copy_limit}


def resigning_groups(ms: Metastore, module: str, groups: dict[int, tuple[GroupState, int]]) -> dict[int, str]:
    """Groups whose leader was asked to hand off and has not yet: ``{group: successor}``.

    Only requests for the group's current epoch count; an older one is stale
    (leadership moved anyway) and the conductor withdraws it.
    """
    out = {}
    for g, req in ms.resigns.all(module).items():
        st = groups.get(g)
        if st is not None and st[0].epoch == req.get("epoch"):
            out[g] = str(req.get("to"))
    return out


def nodes_overview(ms: Metastore) -> list[dict[str, Any]]:
    """Live worker nodes with their gRPC, replication and metrics addresses and pid, sorted by id;
    ``leaders_allowed`` False when drained."""
    out = []
    drained = ms.drains.nodes()
    for node_id in ms.nodes.live():
        info = ms.nodes.get(node_id)
        if info is not None:  # it may have left between the two reads
            out.append({"node": node_id, "address": info.address, "replication": info.replication,
                        "metrics": info.metrics, "pid": info.pid, "started": info.started,
                        "secure": info.secure, "leaders_allowed": node_id not in drained,
                        "version": info.version or None, "token": info.token or None})
    return out


def modules_overview(ms: Metastore) -> list[dict[str, Any]]:
    """One row per deployed module: its spec and how many of its groups have a live leader.

    Only the metastore is read (no RPCs), so this stays cheap with many modules.
    """
    live = ms.nodes.sessions()
    rows = []
    for name in ms.modules.names():
        try:
            spec, _ = ms.modules.get(name)
            groups = ms.groups.all(name)
        except ModuleNotFound:
            continue  # destroyed while we listed
        led = sum(1 for state, _ in groups.values() if leaderless_reason(state, live) is None)
        state = LEADERSHIP_BALANCING if resigning_groups(ms, name, groups) else RUNNING
        rows.append({**_spec_summary(spec), "groups_led": led, "groups_total": len(groups), "state": state})
    return rows


def cluster_overview(ms: Metastore) -> dict[str, Any]:
    """The no-argument `conductor status`: ZooKeeper address, live nodes and modules."""
    return {"zk": ms.hosts, "nodes": nodes_overview(ms), "modules": modules_overview(ms)}


def status_document(ms: Metastore, module: str | None = None,
                    channels: Channels | None = None) -> dict[str, Any]:
    """What ``conductor status [MODULE] --json`` prints and the UI's API serves (``/api/status``,
    ``/api/modules/{module}``): one function, so a script reading either sees the same document."""
    return cluster_overview(ms) if module is None else module_status(ms, module, channels=channels)


def _group_row(spec: ModuleSpec, g: int, state: GroupState, live: dict[str, int],
               address: str | None, replica: dict[str, Any] | None) -> dict[str, Any]:
    """Merge the metastore's decision for one group with what its leader reports."""
    reason = leaderless_reason(state, live)
    followers = []
    if replica is not None and replica.get("reachable"):
        offsets: dict[str, int] = replica["follower_offsets"]
        for node in state.replicas:
            if node == state.leader:
                continue
            offset = offsets.get(node)
            followers.append({"node": node, "in_isr": node in state.isr, "live": node in live, "offset": offset,
                              "lag": None if offset is None else follower_lag(replica["log_end"], offset)})
    problem: str | None
    if reason is not None:
        problem = reason
    elif replica is None or not replica.get("reachable"):
        error = replica["error"] if replica else "its node has no registered address"
        problem = f"leader {state.leader} at {address} is unreachable ({error})"
    elif replica["role"] != "leader":
        problem = (f"leader {state.leader} has not taken the group yet (it reports role {replica['role']!r} "
                   f"at epoch {replica['epoch']}); if this lasts, check its log")
    elif replica["epoch"] != state.epoch:
        problem = (f"leader {state.leader} reports epoch {replica['epoch']} but the metastore says "
                   f"{state.epoch}; it is catching up with the metastore")
    else:
        problem = None
    return {
        "group": g, "tasks": spec.tasks_of(g), "leader": state.leader, "leader_address": address,
        "epoch": state.epoch, "isr": list(state.isr), "osr": list(state.osr), "elr": list(state.elr),
        "replicas": list(state.replicas),
        "leaderless_reason": reason, "replica": replica, "followers": followers,
        "serving": problem is None, "problem": problem,
    }


def leader_reports(ms: Metastore, module: str, channels: Channels,
                   rpc_timeout_s: float = RPC_TIMEOUT_S) -> dict[int, dict[str, Any]]:
    """What each group's leader reports (:func:`query_group_status`), by group; groups without a leader are
    left out. A fraction of :func:`module_status`'s reads and calls, for a poll that needs only the leaders
    (``conductor update`` waiting for the switch, on workers serving appends)."""
    addresses: dict[str, str | None] = {}
    targets = {g: _address(ms, addresses, state.leader) for g, (state, _) in ms.groups.all(module).items()
               if state.leader is not None}
    queried = {g: a for g, a in targets.items() if a is not None}
    if not queried:
        return {}
    with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL_RPCS, len(queried))) as pool:
        futures = {g: pool.submit(query_group_status, a, module, g, rpc_timeout_s, channels)
                   for g, a in queried.items()}
        return {g: f.result() for g, f in futures.items()}


def module_status(ms: Metastore, module: str, rpc_timeout_s: float = RPC_TIMEOUT_S,
                  channels: Channels | None = None) -> dict[str, Any]:
    """Every task group of ``module``: leadership from the metastore, offsets and lag from its leader.

    Raises ``ModuleNotFound`` if the module is not deployed; an unreachable
    leader only marks its group (``serving: False`` and a ``problem``). A caller that polls passes its
    ``channels`` (kept open between calls); otherwise one channel per worker serves this call.
    """
    if channels is None:
        with Channels() as own:
            return module_status(ms, module, rpc_timeout_s, own)
    spec, _ = ms.modules.get(module)
    groups = ms.groups.all(module)
    live = ms.nodes.sessions()
    addresses: dict[str, str | None] = {}
    for state, _ in groups.values():
        if state.leader is not None and state.leader in live:
            _address(ms, addresses, state.leader)
    to_query = {g: addresses.get(state.leader) for g, (state, _) in groups.items()
                if state.leader is not None and leaderless_reason(state, live) is None}
    # Live OSR members may be copying a far-horizon checkpoint: only they can say how far along; and any
    # follower may be restarting after a fault (damaged data, a full disk): only it can say why.
    osr_query = {(g, node): _address(ms, addresses, node) for g, (state, _) in groups.items()
                 for node in state.replicas if node in live and node != state.leader}
    replicas: dict[int, dict[str, Any] | None] = {}
    catchups: dict[int, list[dict[str, Any]]] = {}
    faults: dict[int, list[dict[str, Any]]] = {}
    if to_query or osr_query:
        with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL_RPCS, len(to_query) + len(osr_query))) as pool:
            futures = {g: pool.submit(query_group_status, addr, module, g, rpc_timeout_s, channels)
                       for g, addr in to_query.items() if addr is not None}
            osr_futures = {k: pool.submit(query_group_status, addr, module, k[0], rpc_timeout_s, channels)
                           for k, addr in osr_query.items() if addr is not None}
            replicas = {g: f.result() for g, f in futures.items()}
            for (g, node), f in sorted(osr_futures.items()):
                r = f.result()
                c = r.get("catchup")
                if c is not None:
                    catchups.setdefault(g, []).append({"node": node, **c})
                if r.get("fault"):
                    faults.setdefault(g, []).append({"node": node, "fault": r["fault"]})
            for g, led in replicas.items():
                if led is not None and led.get("fault"):
                    faults.setdefault(g, []).append({"node": groups[g][0].leader, "fault": led["fault"]})
    rows = [_group_row(spec, g, state, live, addresses.get(state.leader) if state.leader else None,
                       replicas.get(g)) | {"catchups": catchups.get(g, []), "faults": faults.get(g, [])}
            for g, (state, _) in sorted(groups.items())]
    resigning = resigning_groups(ms, module, groups)
    for row in rows:
        row["handing_off_to"] = resigning.get(row["group"])
    found = ms.plans.get(module)
    plan = None if found is None else plan_overview(found[0], groups, live, catchups,
                                                    spec.option(REASSIGN_COPY_BYTES_PER_S))
    return {**_spec_summary(spec), "code": code_overview(spec, rows), "depots": depot_overview(rows),
            "live_nodes": sorted(live), "groups": rows,
            "serving": sum(1 for r in rows if r["serving"]), "checked_at": time.time(),
            "state": LEADERSHIP_BALANCING if resigning else RUNNING,
            "disallowed_leaders": sorted(ms.drains.nodes()), "plan": plan}


def code_overview(spec: ModuleSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The module's code version, the groups still switching to it, and PState migrations in progress."""
    switching = []
    migrations: dict[str, dict[str, Any]] = {}
    for row in rows:
        r = row.get("replica") or {}
        if not r.get("reachable"):
            continue
        if r.get("code_version") and r["code_version"] != spec.version:
            switching.append(row["group"])
        for m in r.get("migrations") or []:
            agg = migrations.setdefault(m["pstate"], {"id": m["id"], "groups_done": 0, "groups": 0, "rewritten": 0})
            agg["groups"] += 1
            agg["groups_done"] += int(m["done"])
            agg["rewritten"] += m["rewritten"]
    running = {p: m for p, m in migrations.items() if m["groups_done"] < spec.threads}
    return {"version": spec.version, "initial_version": spec.initial_version, "switching": switching,
            "migrations": running}


def depot_overview(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each depot's size as the groups' leaders report it: its partitions' offsets (``start``: the first held,
    ``end``: the next to append), the records held (summed), and the bytes of its flushed
    data on the leaders (memtables count once flushed). ``groups_reporting`` < the module's groups: some
    leader did not answer, so the sums are short."""
    depots: dict[str, dict[str, Any]] = {}
    for row in rows:
        r = row.get("replica") or {}
        if not r.get("reachable"):
            continue
        seen = set()
        for p in r.get("depots") or []:
            d = depots.setdefault(p["depot"], {"depot": p["depot"], "partitions": [], "records": 0, "start": 0,
                                               "end": 0, "bytes": 0, "groups_reporting": 0})
            d["partitions"].append({"task": p["task"], "start": p["start"], "end": p["end"],
                                    "records": p["records"]})
            d["records"] += p["records"]  # (a key-compacted partition holds fewer than end - start)
            d["start"] += p["start"]
            d["end"] += p["end"]
            seen.add(p["depot"])
        for name in seen:
            depots[name]["bytes"] += int((r.get("depot_bytes") or {}).get(name, 0))
            depots[name]["groups_reporting"] += 1
    for d in depots.values():
        d["partitions"].sort(key=lambda p: p["task"])
    return [depots[n] for n in sorted(depots)]


def _address(ms: Metastore, known: dict[str, str | None], node: str) -> str | None:
    if node not in known:
        info = ms.nodes.get(node)
        known[node] = info.address if info else None
    return known[node]


def wait_serving(ms: Metastore, module: str, timeout_s: float, poll_s: float = 0.2,
                 on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Poll ``module_status`` until every group's leader serves, or ``timeout_s`` passes.

    Returns the last status either way (check ``status["serving"]`` against
    ``len(status["groups"])``): a deploy that does not come up is reported with
    what each group is waiting for, not as an exception.
    """
    deadline = time.monotonic() + timeout_s
    with Channels() as channels:
        while True:
            status = module_status(ms, module, min(RPC_TIMEOUT_S, max(0.2, timeout_s)), channels)
            if on_update is not None:
                on_update(status)
            if status["serving"] == len(status["groups"]) or time.monotonic() >= deadline:
                return status
            time.sleep(poll_s)
