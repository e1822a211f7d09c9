"""HTTP/1.1 on httptools (llhttp) and asyncio.Protocol: server connections, client pool."""
