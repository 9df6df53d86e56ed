"""The server side: a :class:`~rlreplay.net.server.server.Server` (its dispatcher and
request handler), the table of operations and what they serve (writer sessions and their
ingest, parked calls, per-client limits, shared-memory segments, checkpoints)."""
