"""The pipeline's stages: client shared memory, classification, the generate extension.

Each is pure, and the order they run in is in :mod:`v2proxy.core.pipeline`'s docstring.
"""
