"""Pure, sans-IO codecs: wire bytes <-> the internal model (v2proxy.core.model).

Nothing in this package imports asyncio, aiohttp, grpc, prometheus_client, posix_ipc or cupy.
Every decoding failure is a :class:`v2proxy.core.errors.CodecError` naming the field at fault.
"""
