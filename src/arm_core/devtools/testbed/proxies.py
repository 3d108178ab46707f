"""Loopback TCP proxies in front of a server: one that can cut the database (or NATS) off
as a real outage looks to its client, and one in front of nats-server that cuts or holds
a client's connection at an exact message it publishes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Self


class TcpProxy:
    """A loopback TCP proxy in front of a server (PostgreSQL, nats-server) that can cut
    every connection and refuse new ones: a real outage as the client sees it, without
    stopping the server the rest of the suite shares."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.blocked = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _to_server(self, upstream: asyncio.StreamWriter) -> Callable[[bytes], tuple[bytes, bool]]:
        """For a new connection to the server (`upstream`): what to forward of the bytes
        its client sends, and whether to cut the connection once that is forwarded. Here
        everything, and never (a subclass reads the protocol)."""
        return lambda data: (data, False)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        if self.blocked:  # blocked while this connection was being made: cut it too
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        to_server = self._to_server(up_writer)

        async def pipe(
            src: asyncio.StreamReader,
            dst: asyncio.StreamWriter,
            inspect: Callable[[bytes], tuple[bytes, bool]],
        ) -> None:
            try:
                while data := await src.read(65536):
                    data, cut = inspect(data)
                    dst.write(data)
                    await dst.drain()
                    if cut:
                        # The server reads what was forwarded, then the end of the
                        # stream; the client's connection is reset under it.
                        writer.transport.abort()
                        break
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, to_server), pipe(up_reader, writer, lambda d: (d, False))
        )
        self._writers -= {writer, up_writer}

    def block(self) -> None:
        self.blocked = True
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def unblock(self) -> None:
        self.blocked = False

    async def close(self) -> None:
        self.block()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class NatsProxy(TcpProxy):
    """A TcpProxy in front of nats-server that reads the client's side of the protocol
    and counts the messages it publishes (PUB and HPUB frames), so a test can act at
    an exact message of a batch:

    - `cut_after(n)`: forward n more messages, then cut that connection (the server
      has the n messages, the client's socket is reset) and refuse new ones; with
      `reconnect=True` a new connection is let through (the connection drops and
      comes back);
    - `hold_after(n)`: forward n more messages, then forward nothing more from the
      client (its connection stays open: the server answers nothing it sent after)
      until `release()`.

    `published` counts the messages forwarded to the server."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.published = 0
        self.holding = False
        self._left: int | None = None  # messages to forward before acting
        self._then = ""  # "cut", "cut_reconnect" or "hold"
        self._held: list[tuple[asyncio.StreamWriter, bytes]] = []

    def cut_after(self, messages: int, reconnect: bool = False) -> None:
        self._left, self._then = messages, "cut_reconnect" if reconnect else "cut"

    def hold_after(self, messages: int) -> None:
        self._left, self._then = messages, "hold"

    def release(self) -> None:
        """Forwards what was held, and everything after it."""
        self.holding = False
        for up, data in self._held:
            if not up.is_closing():
                up.write(data)
        self._held.clear()

    def _to_server(self, upstream: asyncio.StreamWriter) -> Callable[[bytes], tuple[bytes, bool]]:
        frames = _ClientFrames()

        def inspect(data: bytes) -> tuple[bytes, bool]:
            out = bytearray()
            for frame, is_message in frames.feed(data):
                if self.holding:
                    self._held.append((upstream, frame))
                    continue
                out += frame
                if not is_message:
                    continue
                self.published += 1
                if self._left is None:
                    continue
                self._left -= 1
                if self._left > 0:
                    continue
                self._left, then = None, self._then
                if then == "hold":
                    self.holding = True
                    continue
                self.blocked = then == "cut"
                return bytes(out), True  # what follows is never forwarded
            return bytes(out), False

        return inspect


class _ClientFrames:
    """Splits what a NATS client sends into protocol frames: a PUB or HPUB with its
    payload is one frame (a message), any other operation (CONNECT, PING, PONG, SUB,
    UNSUB) another. feed() returns the bytes of each frame completed so far (an
    incomplete one waits for more), each with whether it is a message."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        self._buffer += data
        frames: list[tuple[bytes, bool]] = []
        while (end := self._buffer.find(b"\r\n")) >= 0:
            line = bytes(self._buffer[: end + 2])
            op = line.split(maxsplit=1)[0].upper() if line.strip() else b""
            size = 0
            if op in (b"PUB", b"HPUB"):
                # PUB <subject> [reply] <size>; HPUB <subject> [reply] <hdr size> <total>
                size = int(line.split()[-1]) + 2  # the payload and its CRLF
                if len(self._buffer) < len(line) + size:
                    break
            frames.append((bytes(self._buffer[: len(line) + size]), op in (b"PUB", b"HPUB")))
            del self._buffer[: len(line) + size]
        return frames
