"""The dataflow runtime: how hops move work between task groups, exactly once, and when a tree is done.

:mod:`topology.stream` is what user code sees (``ctx.send``, ``ctx.update``...);
this package is what happens between task groups. Its rules are pure (no I/O);
the worker performs them over streams and its task threads, and
``tests/unit/test_dataflow_exactly_once.py`` drives the same rules over a lossy
network with crashing leaders.

Vocabulary
==========

* **message**: run a handler on the task that owns a key, with plain values
  (:mod:`topology.envelope`). Functions travel by name (:mod:`topology.refs`).
* **envelope**: one entry's messages to one destination group; the unit of
  shipping, of exactly-once consumption and of completion tracking. It lists
  its **parents**: what it was sent on behalf of (an envelope the entry
  consumed, or the entry's own input, a *root*).
* **outbox**: the envelopes a group sent, per destination, numbered
  ``0, 1, 2...`` with no holes (:mod:`pstate.outbox`). **inbox position**: per
  source, the next sequence number a group will consume.

Exactly once across hops
========================

1. A group's leader builds an entry from an input (a client append, or a batch
   of envelopes that arrived). Its writes, the envelopes it sends (with their
   sequence numbers) and, for consumed envelopes, the new inbox positions are
   all in that one replog entry (:mod:`.entries`).
2. An envelope exists iff its entry is applied: the source ships only applied
   envelopes, read from its applied state. An entry lost with a failed leader
   sent nothing (and its inputs are consumed again, by the next leader).
3. A destination consumes envelope ``seq`` from ``src`` only when it is the
   next one at the inbox position as the entry being built sees it (applied
   and staged entries). Duplicates fall below it, gaps wait. The effects and
   the position are applied together, or neither is: a replay, a resend or a
   new leader on either side can neither lose nor repeat a message.
4. Envelopes stay in the outbox (on every replica) until the destination
   reports them complete; then the source trims them in a later entry.

Shipping (pull, with a window; a stream per pair of workers)
============================================================

The destination pulls, because it alone knows its position: a pull names the
source group, the first sequence number wanted and a byte window, and carries
the destination's completion report for that source, so positions and
completions flow back on the same message that asks for more (Kafka's fetch
offset is its ack, likewise). The source does not answer a pull once: it keeps
the latest pull per destination and ships envelopes as they are applied, up to
the window, so latency is that of a push (no polling interval), while a slow
destination holds back its sources by not renewing its window
(:mod:`.shipping`). In the worker:

* pulls and envelope batches ride on the workers' replication streams (one
  stream per ordered pair of workers, many messages per frame); a batch is
  its envelopes as one bytes field plus a length array (Python pays per
  object, not per byte). Messages between groups led by one worker skip the
  network, and a group's envelopes to itself never leave its task thread;
* a destination leader pulls from every group of the module (an idle pull
  costs nothing until something is applied; it is repeated every second to
  repair lost messages and carry reports); the first pull of a leadership
  starts at its staged inbox positions. Pulls go to the leader the worker's
  metastore watches report; a replica that does not lead ignores them, and
  the next pull finds the new leader;
* a source leader answers from its applied outbox, after each drain, as far
  as each destination's window allows;
* the destination's task thread queues accepted envelopes (bounded by the
  windows) and consumes them in bulk: one entry for all that arrived during
  the previous drain, sharing its fsync with the drain's client appends, and
  no new one while the last is not applied (what arrives meanwhile waits for
  the next: one replication round per round, not one per arriving batch); an
  envelope's messages run as one unit, one by one only if one fails;
* trims are entries of their own, in batches (``TRIM_MIN_ENVELOPES``, or the
  last ones), looked for every 200 ms.

``ack="applied"`` covers the whole tree
=======================================

A client's append is a *root*. Its reply waits until the entry is applied and
every envelope it sent is **complete**: consumed and applied at its
destination, with every envelope *that* consumption sent complete in turn.
Each destination reports per source ``(position, incomplete)``: everything
below its applied inbox position is complete except the few consumed
envelopes still waiting for children. Sources resolve parents with these
reports, so completion flows back up the tree hop by hop
(:mod:`.completion`), costing O(1) per envelope and nothing per message. A
new leader rebuilds the tracker from applied state; appends waiting on the
old leader fail with ``NotLeader`` and are retried by the client as today.

Backpressure and poison
=======================

A client append is refused with ``Backpressure`` (the app retries later) while
an outbox it would add to holds too much its destination has not completed.
Hop traffic itself is never refused, so groups that send to each other cannot
deadlock; it is bounded by what the refused appends let in. User code that
raises is retried with backoff and then dead-lettered (:mod:`.poison`).
"""
