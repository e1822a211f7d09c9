"""Client shared memory: the adapters behind the core's regions port (docs/protocol.md).

:mod:`v2proxy.shm.registry` (the regions of one process, reference counted),
:mod:`v2proxy.shm.shared` (those ``--workers N`` share) and :mod:`v2proxy.shm.system` (POSIX
shared memory mapped with ``posix_ipc`` and ``mmap``) implement
:class:`v2proxy.core.regions.Regions`, through which the pipeline sees them; nothing here imports
the core's stages.
"""
