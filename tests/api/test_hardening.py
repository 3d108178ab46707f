"""The API against clients that misbehave, on the real server of `arm-core serve`
(arm_core.http.server) on a free loopback port with a real PostgreSQL: raw sockets send
what no HTTP client library would — oversized request lines and headers, garbage, half a
header, half a body, hundreds of stalled connections. What aiohttp cannot parse is
refused with its own 400 and closed (logged without the client's bytes); a connection
whose request line and headers stall is closed at HTTP_HEADER_TIMEOUT_SECONDS; a body
that stalls is answered JSON 408 and closed; nothing in the database changes, and the
server goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from arm_core.config import Settings
from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.processes import ArmProcess, serve_env
from arm_core.devtools.testbed.sql import (
    Upload,
    dict_conn,
    fail_by_no_ack,
    jobs_of,
    publish,
    upload,
)
from arm_core.http.server import PROTOCOL_LOG, serving
from arm_core.runtime import bridge_app, create_app
from tests.support.api import api_settings

pytestmark = pytest.mark.integration

# Small deadlines, so a test waits a fraction of a second for the server to give up on
# a client; the waits below are for the close and fail only if it never comes.
HEADER_TIMEOUT = 0.5
BODY_TIMEOUT = 0.5
WAIT = 20.0  # the longest any test waits for an answer or a close
# aiohttp's default lingering_time: how long it would read a body nobody reads (the
# server sets it to HTTP_BODY_TIMEOUT_SECONDS instead).
LINGERING = 10.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers.get("content-type", "").startswith("application/json"), self
        loaded = json.loads(self.body)
        assert set(loaded) == {"error"} and loaded["error"]["message"], loaded
        return dict(loaded["error"])


def parse(raw: bytes) -> Answer:
    """One HTTP/1.x response, read to the connection's end."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


async def exchange(port: int, data: bytes, within: float = WAIT) -> tuple[bytes, float]:
    """Sends `data` on a fresh connection and reads until the server closes it: returns
    what came back and the seconds from the send to the close, only if the server closes
    the connection (within `within` seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        sent = time.monotonic()
        return await asyncio.wait_for(to_the_close(reader), within), time.monotonic() - sent
    finally:
        writer.close()


async def to_the_close(reader: asyncio.StreamReader) -> bytes:
    """What the server sent until it closed the connection. A close may come as a reset:
    when a deadline fires before the server's event loop has read the client's bytes
    (300 connections at once on a loaded machine), its kernel answers the close of a
    socket with unread data with RST instead of FIN. Closed all the same; what came
    before the reset is kept."""
    raw = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(1 << 16):
            raw += chunk
    return raw


async def send(port: int, data: bytes, within: float = WAIT) -> Answer:
    """One answer to `data`, the connection closed by the server after it."""
    raw, _ = await exchange(port, data, within)
    assert raw, "closed without an answer"
    return parse(raw)


async def closed_unanswered(port: int, data: bytes, within: float = WAIT) -> float:
    """Sends `data` and asserts that the server closes the connection without a byte of
    answer (the header deadline); returns the seconds it took."""
    raw, took = await exchange(port, data, within)
    assert raw == b"", raw[:200]
    return took


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[int]:
    async with serving(create_app(settings), "127.0.0.1", 0) as (_, port):
        yield port


def hardened(db_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "http_header_timeout_seconds": HEADER_TIMEOUT,
        "http_body_timeout_seconds": BODY_TIMEOUT,
    }
    values.update(overrides)
    return api_settings(db_url, **values)


@pytest.fixture
async def port(db_url: str) -> AsyncIterator[int]:
    async with served(hardened(db_url)) as p:
        yield p


def failed_upload(db_url: str) -> Upload:
    """A file whose attempt 1 ended dlq / NO_ACK: a retry would create attempt 2."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
    return up


def attempts(db_url: str, up: Upload) -> list[int]:
    with dict_conn(db_url) as conn:
        return [j["attempt"] for j in jobs_of(conn, up.file_id)]


def request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# --- what aiohttp's parser refuses: its own 400, the connection closed ---------------
# aiohttp answers these before any middleware runs and has no documented hook to shape
# that answer: it is its plain-text 400, not the API's JSON (arm_core.http.server).


async def test_a_request_line_over_8190_bytes_is_refused_and_closed(port: int) -> None:
    answer = await send(port, request("GET", "/api/v1/files/" + "a" * 9000))
    assert answer.status == 400
    # Under the limit, the same request reaches the API and is answered in JSON.
    answer = await send(port, request("GET", "/api/v1/files/" + "a" * 8000, "Connection: close"))
    assert answer.status == 400 and answer.error()["code"] == "INVALID_FILE_ID"


async def test_a_header_over_8190_bytes_is_refused_and_not_logged(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp's 400 echoes the start of the header to the client that sent it; the log
    gets one INFO line naming the parser's complaint, never the header (a credential)."""
    caplog.set_level(logging.DEBUG, logger=PROTOCOL_LOG.name)
    secret = "Bearer " + "s3cr3t" * 1500
    answer = await send(port, request("GET", "/healthcheck", f"Authorization: {secret}"))
    assert answer.status == 400
    records = [r for r in caplog.records if r.name == PROTOCOL_LOG.name]
    assert [(r.levelno, r.__dict__.get("error")) for r in records] == [
        (logging.INFO, "LineTooLong")
    ]
    assert records[0].__dict__["action"] == "http_bad_request"
    assert "s3cr3t" not in caplog.text


async def test_too_many_headers_is_refused_and_closed(port: int) -> None:
    many = [f"X-Header-{i}: {i}" for i in range(200)]
    answer = await send(port, request("GET", "/healthcheck", *many))
    assert answer.status == 400
    few = [f"X-Header-{i}: {i}" for i in range(100)]
    answer = await send(port, request("GET", "/healthcheck", *few, "Connection: close"))
    assert answer.status == 200


@pytest.mark.parametrize(
    "data",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello\r\n\r\n",
        b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n",
        b"GET /healthcheck HTTP/9.9\r\nHost: x\r\n\r\n",
        b"POST /api/v1/files/retry HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /api/v1/files/retry HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["tls", "header-name", "version", "content-length", "chunk-size"],
)
async def test_what_is_not_http_is_refused_and_closed(
    port: int, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=PROTOCOL_LOG.name)
    answer = await send(port, data)
    assert answer.status == 400, answer
    records = [r for r in caplog.records if r.name == PROTOCOL_LOG.name]
    assert records and all(r.levelno <= logging.INFO and not r.exc_info for r in records)


async def test_a_header_the_parser_quotes_is_not_logged(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp's complaint about a bad byte in a header quotes the header; the log line
    does not."""
    caplog.set_level(logging.DEBUG, logger=PROTOCOL_LOG.name)
    bad = b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cr3t\x01\r\n\r\n"
    answer = await send(port, bad)
    assert answer.status == 400
    assert any(r.name == PROTOCOL_LOG.name for r in caplog.records)
    assert "s3cr3t" not in caplog.text


# --- slow clients are cut off ----------------------------------------------------------
# Headers: aiohttp's keepalive_timeout (HTTP_HEADER_TIMEOUT_SECONDS) closes the
# connection, without an answer. Body: the handler reading it answers JSON 408 and closes.


async def test_half_a_header_is_closed_at_the_header_deadline(port: int) -> None:
    took = await closed_unanswered(
        port, b"POST /api/v1/files/retry HTTP/1.1\r\nHost: 127.0.0.1\r\nCont"
    )
    assert took >= HEADER_TIMEOUT * 0.8  # the client had its deadline, not less


async def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    await closed_unanswered(port, b"")


async def test_a_stalled_request_after_an_answer_is_closed(port: int) -> None:
    """The deadline runs again from each answer: a keep-alive connection whose next
    request stalls (or that stays idle) is closed too."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request("GET", "/healthcheck"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        answer = parse(head)
        assert answer.status == 200
        await asyncio.wait_for(reader.readexactly(int(answer.headers["content-length"])), WAIT)
        writer.write(b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed, nothing more
    finally:
        writer.close()


async def test_half_a_body_is_answered_408_closed_and_changes_nothing(
    port: int, db_url: str
) -> None:
    up = failed_upload(db_url)
    body = json.dumps({"file_ids": [str(up.file_id)]}).encode()
    for path in ("/api/v1/files/retry", f"/api/v1/files/{up.file_id}/retry"):
        head = request(
            "POST", path, "Content-Type: application/json", f"Content-Length: {len(body)}"
        )
        answer = await send(port, head + body[: len(body) // 2])
        assert answer.status == 408, answer
        error = answer.error()
        assert error["code"] == "REQUEST_TIMEOUT"
        assert "HTTP_BODY_TIMEOUT_SECONDS" in error["message"]
        assert answer.headers["connection"] == "close"
    assert attempts(db_url, up) == [1]  # neither request retried the file


async def test_half_a_body_that_the_handler_does_not_read_closes_the_connection(
    port: int,
) -> None:
    """GET answers without reading a body; aiohttp then reads what is left of it for its
    lingering_time, which the server sets to HTTP_BODY_TIMEOUT_SECONDS (aiohttp's own
    is 10 s), and closes the connection when it is still incomplete."""
    head = request("GET", f"/api/v1/files/{uuid.uuid4()}", "Content-Length: 1000")
    answer = await send(port, head + b"x" * 10, within=LINGERING / 2)
    assert answer.status == 404 and answer.error()["code"] == "FILE_NOT_FOUND"


async def test_300_stalled_connections_are_all_closed(port: int) -> None:
    """300 connections that send half a header and one that sends half a body, all at
    once: each half header is closed at the header deadline, the half body is answered
    408 and closed; then the server serves."""
    half_header = b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    half_body = request("POST", "/api/v1/files/retry", "Content-Length: 100", body=b"{")
    closes = asyncio.gather(*(closed_unanswered(port, half_header) for _ in range(300)))
    _, answer = await asyncio.gather(closes, send(port, half_body))
    assert answer.status == 408 and answer.error()["code"] == "REQUEST_TIMEOUT"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthcheck") as resp:
            assert resp.status == 200


async def test_keep_alive_and_pipelined_requests_are_served(port: int, db_url: str) -> None:
    """The deadlines are per request: requests one after another on one connection, and
    two sent in one packet, are all answered."""
    up = failed_upload(db_url)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(3):
            writer.write(request("GET", f"/api/v1/files/{up.file_id}"))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            answer = parse(head)
            assert answer.status == 200
            await asyncio.wait_for(reader.readexactly(int(answer.headers["content-length"])), WAIT)
        body = b'{"file_ids": ["' + str(up.file_id).encode() + b'"]}'
        batch = request(
            "POST",
            "/api/v1/files/retry",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            body=body,
        )
        writer.write(batch + request("GET", "/healthcheck", "Connection: close"))
        raw = await asyncio.wait_for(reader.read(), WAIT)
    finally:
        writer.close()
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    assert attempts(db_url, up) == [1, 2]


# --- deep JSON and the batch route ---------------------------------------------------


async def test_100000_nested_brackets_are_400_invalid_json(port: int, db_url: str) -> None:
    up = failed_upload(db_url)
    deep = b"[" * 100_000 + b"]" * 100_000
    for path, body in [
        ("/api/v1/files/retry", deep),
        ("/api/v1/files/retry", b'{"file_ids": ' + deep + b"}"),
        (f"/api/v1/files/{up.file_id}/retry", deep),
    ]:
        head = request(
            "POST",
            path,
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
        )
        answer = await send(port, head + body)
        assert answer.status == 400, answer
        assert answer.error()["code"] == "INVALID_JSON"
    assert attempts(db_url, up) == [1]


async def test_the_batch_route_allows_post_only(port: int) -> None:
    async with aiohttp.ClientSession() as http:
        for method in ("GET", "OPTIONS", "PUT", "DELETE"):
            async with http.request(method, f"http://127.0.0.1:{port}/api/v1/files/retry") as r:
                assert r.status == 405, method
                assert r.headers["Allow"] == "POST"
                assert (await r.json())["error"]["code"] == "METHOD_NOT_ALLOWED"
        async with http.options(f"http://127.0.0.1:{port}/api/v1/files/{uuid.uuid4()}") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"


# --- the bridge's health endpoint and `arm-core serve` itself -----------------------


async def test_the_bridge_health_server_answers_json_too(db_url: str) -> None:
    app = bridge_app(hardened(db_url))
    async with serving(app, "127.0.0.1", 0) as (_, port):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/nope") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "NOT_FOUND"
            async with http.get(f"http://127.0.0.1:{port}/healthcheck") as r:
                assert r.status == 200
        answer = await send(port, request("GET", "/healthcheck", "X-Big: " + "b" * 9000))
        assert answer.status == 400  # aiohttp's own refusal, as on the API's port
        await closed_unanswered(port, b"GET /healthcheck HTTP/1.1\r\n")


def test_arm_core_serve_reads_the_timeouts_from_the_environment(
    db_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = serve_env(
        db_url, port, HTTP_HEADER_TIMEOUT_SECONDS="0.5", HTTP_BODY_TIMEOUT_SECONDS="0.5"
    )
    proc = ArmProcess("serve", env, tmp_path / "serve.log")
    try:
        proc.wait_healthy(port)

        async def both() -> tuple[float, Answer]:
            half_body = request("POST", "/api/v1/files/retry", "Content-Length: 50", body=b"{")
            # Closed well before the default deadline (10 s): the variable was read.
            header = closed_unanswered(port, b"GET / HTTP/1.1\r\n", within=5.0)
            return await asyncio.gather(header, send(port, half_body))

        _, body = asyncio.run(both())
        assert body.status == 408 and "HTTP_BODY_TIMEOUT_SECONDS=0.5" in body.body.decode()
        assert proc.stop() == 0
    finally:
        if proc.proc.poll() is None:
            proc.kill()
    assert "HTTP_BODY_TIMEOUT_SECONDS=0.5" in proc.log()  # the 408 is logged
