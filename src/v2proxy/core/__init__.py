"""The request's one pass: the internal model, the error tree, the pipeline and its stages, and
what the core knows of the backend and the client's shared memory through its ports (pure: no I/O
library, nothing from the edges or operations; checked by tools/check_layers.py)."""
