"""The request's one pass, pure: model, errors, pipeline, stages and ports.

The internal model and the one error tree, the pipeline every frontend calls and its stages
(:mod:`v2proxy.core.stages`), and what the core knows of the backend (:mod:`.ports`,
:mod:`.knowledge`) and of the client's shared memory (:mod:`.regions`) through its ports. Nothing
here imports an I/O library, the edges or the operations (checked by tools/check_layers.py).
"""
