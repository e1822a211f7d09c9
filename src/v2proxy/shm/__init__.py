"""Client shared memory, the adapters behind the core's regions port (docs/protocol.md, shared
memory): :mod:`v2proxy.shm.registry` (the regions of one process, reference counted),
:mod:`v2proxy.shm.shared` (those ``--workers N`` share) and :mod:`v2proxy.shm.system` (POSIX
shared memory mapped with ``posix_ipc`` and ``mmap``). The pipeline sees them through
:class:`v2proxy.core.regions.Regions`; nothing here imports the core's stages."""
