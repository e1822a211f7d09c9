"""Pure, sans-IO codecs: wire bytes <-> the internal model (v2proxy.core.model)."""
