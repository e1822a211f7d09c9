"""v2proxy: a sidecar that makes every KServe v2 / Open Inference Protocol client work with every
model server."""

__version__ = "0.1.0"
