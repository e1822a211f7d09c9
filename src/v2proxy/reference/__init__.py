"""The builtin reference models (DESIGN.md, product contract; reference §6.1)."""
