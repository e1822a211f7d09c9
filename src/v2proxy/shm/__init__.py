"""Client shared memory (docs/protocol.md, shared memory): :mod:`v2proxy.shm.registry` (the regions
of one process, reference counted) and :mod:`v2proxy.shm.system` (POSIX shared memory mapped with
``posix_ipc`` and ``mmap``). The pipeline sees them through the ports of
:mod:`v2proxy.shm_stage`."""
