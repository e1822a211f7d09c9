"""v2proxy: a sidecar that makes every KServe v2 / Open Inference Protocol client work with every
model server."""

from v2proxy import _compiled

_compiled.install()

__version__ = "0.1.0"
