"""The server side: a :class:`~rlreplay.net.server.server.Server`, its operations and what
they serve."""
