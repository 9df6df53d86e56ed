"""The client side: a :class:`~rlreplay.net.client.client.Client` (its settings, transport
and shared-memory path), the remote tables, writers and sample iterators made from it."""
