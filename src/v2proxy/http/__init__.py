"""HTTP/1.1 on httptools (llhttp) and asyncio.Protocol: server connections, client pool.

Transport only: nothing here imports the core, the codecs or the edges. :data:`Buffer` is what a
body's pieces may be (the core's ``Buffer`` is the same union, spelt there for its own use)."""

Buffer = bytes | bytearray | memoryview
