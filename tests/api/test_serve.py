"""``kcert serve --workers N``'s listening socket keeps TCP_NODELAY on accepted connections."""

from __future__ import annotations

import asyncio
import socket

from kcert.api.serve import listening_socket


def test_accepted_connections_get_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on sockets of proto IPPROTO_TCP (uvicorn's own has 0)."""
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted = writer.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
