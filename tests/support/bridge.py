"""Test support for the bridge: condition waits with deadlines, a NATS collector, a TCP
proxy that can cut the database (or NATS) off, one in front of nats-server that cuts or
holds a client's connection at an exact message it publishes, envelope builders and an
instant service.

The bridge under test connects as a login of arm_bridge (tests/support/sql.py), not as
the superuser the test's own connections use: fast_settings and running_bridge turn the
superuser's URL into that login's, so every bridge path runs with the role's privileges."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Self

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.contracts import REQUEST_SCHEMA, validator
from arm_core.bridge.runner import Bridge
from arm_core.config import Settings
from arm_core.store import Store
from tests.support.polling import wait_for
from tests.support.sql import BRIDGE_LOGIN, as_login

__all__ = ["wait_for"]  # the suite's one polling helper (tests/support/polling.py)


# The supervised loops of a bridge with the default settings and core NATS (two inbox
# workers; RESULTS_STREAM adds `stream` and `replay`).
LOOPS = ("publisher", "inbox-0", "inbox-1", "listen", "schedule", "nats-connect")


def fast_settings(db_url: str, nats_url: str, **overrides: Any) -> Settings:
    """Settings with short periods so the tests wait seconds, not minutes; the database
    as the bridge's login."""
    values: dict[str, Any] = {
        "database_url": as_login(db_url, BRIDGE_LOGIN),
        "nats_urls": (nats_url,),
        "outbox_poll_seconds": 0.2,
        "schedule_tick_seconds": 0.2,
        "ack_timeout_seconds": 30.0,
    }
    values.update(overrides)
    return Settings(**values)


def new_bridge(settings: Settings, pool: AsyncConnectionPool[Any], **kwargs: Any) -> Bridge:
    """A bridge as arm_core.runtime makes one: its config from `settings`, a Store on
    `pool`."""
    return Bridge(BridgeConfig(settings), Store(pool), **kwargs)


@contextlib.asynccontextmanager
async def running_bridge(settings: Settings, pool_url: str | None = None) -> AsyncIterator[Bridge]:
    """A bridge in this event loop, connected and subscribed before the body runs; its
    pool connects as the bridge's login."""
    pool = AsyncConnectionPool(
        as_login(pool_url or settings.require_database_url(), BRIDGE_LOGIN),
        open=False,
        min_size=1,
        max_size=5,
        timeout=5,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=False)
    bridge = new_bridge(settings, pool)
    await bridge.start()
    try:
        await wait_for(lambda: bridge.nats_state() == "ok", 10, "bridge connected to NATS")
        yield bridge
    finally:
        await bridge.stop()
        await pool.close()


@dataclass
class Collector:
    """Everything published on a subject, as a real subscriber sees it."""

    messages: list[Msg] = field(default_factory=list)

    async def on_message(self, msg: Msg) -> None:
        self.messages.append(msg)

    def msg_ids(self) -> list[str]:
        return [(m.headers or {}).get("Nats-Msg-Id", "") for m in self.messages]

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(m.data) for m in self.messages]

    def assert_valid_requests(self) -> None:
        """Every request seen passes the request schema, and its header matches it."""
        for msg, body in zip(self.messages, self.bodies(), strict=True):
            validator(REQUEST_SCHEMA).validate(body)
            assert (msg.headers or {})["Nats-Msg-Id"] == f"{body['job_id']}:{body['attempt']}"
            expected = (
                "files.tabular_uploaded" if body["pipeline"] == "tabular" else "files.img_uploaded"
            )
            assert msg.subject == expected


async def collect(client: Client, subject: str) -> Collector:
    collector = Collector()
    await client.subscribe(subject, cb=collector.on_message)
    # Twice: nats-py's PING can overtake the pending SUB; the second PONG proves the SUB.
    await client.flush()
    await client.flush()
    return collector


async def nats_client(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)


def envelope(
    job_id: uuid.UUID,
    file_id: uuid.UUID,
    status: str,
    service: str = "tabular-parser",
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_version": "1.0",
        "job_id": str(job_id),
        "file_id": str(file_id),
        "status": status,
        "service": {"name": service, "version": "1.4.2"},
    }
    if status in ("done", "needs_check"):
        body["result_s3"] = {"bucket": "arm-ka", "key": f"results/{file_id}/{job_id}/result.json"}
        body["result_schema_version"] = "1.0"
    body.update(extra)
    return body


async def send(
    client: Client,
    body: dict[str, Any] | bytes,
    msg_id: str | None,
    subject: str = "files.tabular_parsed",
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await client.publish(subject, data, headers={"Nats-Msg-Id": msg_id} if msg_id else None)
    await client.flush()  # twice, for the same reason as in collect()
    await client.flush()


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


def logged(records: list[Any], **fields: Any) -> list[Any]:
    """Log records whose structured fields (extra=) match all of `fields`."""
    return [
        r for r in records if all(str(getattr(r, k, None)) == str(v) for k, v in fields.items())
    ]


@dataclass
class InstantService:
    """A recognition service that acks and answers `done` at once to every request, on
    a NATS connection of its own (what the burst tests and the benchmark need).

    With `answer_first` set, only that many requests are answered at once; the results
    of the others wait (their acks still go at once) until `release()`, so a test can
    land a fault with those answers still to come."""

    client: Client
    result_subject: str = "files.tabular_parsed"
    answered: int = 0
    answer_first: int | None = None
    held: list[tuple[bytes, str]] = field(default_factory=list)

    async def on_request(self, msg: Msg) -> None:
        request = json.loads(msg.data)
        job_id, file_id, attempt = request["job_id"], request["file_id"], request["attempt"]
        service = "tabular-parser" if request["pipeline"] == "tabular" else "scan-gateway"
        ack = envelope(uuid.UUID(job_id), uuid.UUID(file_id), "processing", service)
        done = envelope(uuid.UUID(job_id), uuid.UUID(file_id), "done", service)
        await self.client.publish(
            self.result_subject,
            json.dumps(ack).encode(),
            headers={"Nats-Msg-Id": f"ack:{job_id}:{attempt}"},
        )
        result = (json.dumps(done).encode(), f"result:{job_id}:{attempt}")
        if self.answer_first is not None and self.answered >= self.answer_first:
            self.held.append(result)
        else:
            await self._send(*result)
        self.answered += 1

    async def _send(self, data: bytes, msg_id: str) -> None:
        await self.client.publish(self.result_subject, data, headers={"Nats-Msg-Id": msg_id})

    async def release(self) -> int:
        """Sends every held result, in the order the requests came, and answers at once
        from then on; returns how many were held."""
        self.answer_first = None
        held, self.held = self.held, []
        for data, msg_id in held:
            await self._send(data, msg_id)
        await self.client.flush()
        await self.client.flush()  # the second PONG proves the server has them all
        return len(held)


async def instant_service(url: str, answer_first: int | None = None) -> InstantService:
    """Subscribes an InstantService to both request subjects; close its client when done."""
    service = InstantService(await nats_client(url), answer_first=answer_first)
    for subject in ("files.tabular_uploaded", "files.img_uploaded"):
        await service.client.subscribe(subject, cb=service.on_request)
    await service.client.flush()
    await service.client.flush()
    return service
