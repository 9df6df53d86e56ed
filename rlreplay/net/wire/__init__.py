"""What a client and a server share: the message codec and framing, the request schemas,
payload arrays, addresses and CURVE keys, and the shared-memory segment format."""
