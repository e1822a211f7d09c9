"""Client shared memory: the adapters behind the core's regions port (docs/protocol.md)."""
