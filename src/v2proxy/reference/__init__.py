"""The builtin reference models (docs/architecture.md, the product contract;
docs/models.md)."""
