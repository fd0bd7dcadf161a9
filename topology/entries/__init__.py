"""The replog entries a group's leader builds, behind one port (:class:`topology.entries.port.EntryPort`).

A worker's task thread asks for an entry with a typed request
(:mod:`topology.entries.requests`: a client's depot appends, a microbatch
commit, a code switch, a migration batch, an inbound entry, an outbox trim) and
gets back a change set to stage and append, with the result its requester is
answered with. What each entry writes is decided here and in the rules it
applies (:mod:`topology.dataflow`, :mod:`topology.group_code`, :mod:`pstate`);
the worker only moves requests, change sets and replies.

This package's ``__init__`` imports nothing, so the Spark side can read the
microbatch op names (:mod:`topology.entries.requests`) without loading RocksDB.
"""
