"""web/asgi.py's coalesced writes: what a response writes in one turn of the loop leaves in one write."""

from __future__ import annotations

import asyncio

from funnel.web.transport.protocol import _OneWrite


class Transport:
    """Records what reaches the socket (a real asyncio transport would send it)."""

    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_a_head_and_body_written_in_one_turn_leave_in_one_write():
    async def respond():
        transport = Transport()
        writes = _OneWrite(transport, asyncio.get_running_loop())
        writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        writes.write(b"{}")
        assert transport.writes == []  # held until the loop turns
        await asyncio.sleep(0)
        writes.write(b"next")  # a later turn: a write of its own
        await asyncio.sleep(0)
        return transport.writes

    assert asyncio.run(respond()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b"next"]


def test_what_is_held_goes_out_before_a_close():
    async def close_at_once():
        transport = Transport()
        writes = _OneWrite(transport, asyncio.get_running_loop())
        writes.write(b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\n\r\n")
        writes.write(b"{}")
        writes.close()
        await asyncio.sleep(0)  # the turn's flush finds nothing left
        return transport

    transport = asyncio.run(close_at_once())
    assert transport.writes == [b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\n\r\n{}"]
    assert transport.closed and transport.is_closing()
