"""The pipeline's stages, pure: client shared memory, classification, and the generate
extension (the order they run in is in :mod:`v2proxy.core.pipeline`'s docstring)."""
