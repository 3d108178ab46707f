"""The API against clients that misbehave (issue 10, part 4), on the real server of
`arm-core serve` (arm_core.http.server) on a free loopback port with a real PostgreSQL:
raw sockets send what no HTTP client library would — oversized request lines and
headers, garbage, half a header, half a body, hundreds of stalled connections — and every
answer is JSON, every slow connection is answered 408 and closed, nothing in the database
changes, and the server goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from arm_core.config import Settings
from arm_core.devtools.embedded import free_port
from arm_core.http.app import create_app
from arm_core.http.server import serving
from arm_core.runtime import bridge_app
from tests.support.api import api_settings
from tests.support.processes import ArmProcess
from tests.support.sql import Upload, dict_conn, fail_by_no_ack, jobs_of, publish, upload

pytestmark = pytest.mark.integration

# Small deadlines, so a test waits a fraction of a second for the server to give up on
# a client; the waits below are for the close and fail only if it never comes.
HEADER_TIMEOUT = 0.5
BODY_TIMEOUT = 0.5
WAIT = 20.0  # the longest any test waits for an answer or a close
LINGERING = 10.0  # aiohttp's lingering_time: how long it reads a body nobody reads


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


async def send(port: int, data: bytes, within: float = WAIT) -> Answer:
    """Sends `data` on a fresh connection and reads until the server closes it: returns
    only if the server closes the connection (within `within` seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), within)  # to EOF: closed by the server
    finally:
        writer.close()
    assert raw, "closed without an answer"
    return parse(raw)


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


# --- what aiohttp's parser refuses is answered in JSON -----------------------------


async def test_a_request_line_over_8190_bytes_is_a_json_414(port: int) -> None:
    answer = await send(port, request("GET", "/api/v1/files/" + "a" * 9000))
    assert answer.status == 414
    assert answer.error()["code"] == "URI_TOO_LONG"


async def test_a_header_over_8190_bytes_is_a_json_431_that_does_not_quote_it(port: int) -> None:
    secret = "Bearer " + "s3cr3t" * 1500
    answer = await send(port, request("GET", "/healthcheck", f"Authorization: {secret}"))
    assert answer.status == 431
    assert answer.error()["code"] == "HEADER_TOO_LARGE"
    assert b"s3cr3t" not in answer.body


async def test_too_many_headers_is_a_json_431(port: int) -> None:
    many = [f"X-Header-{i}: {i}" for i in range(200)]
    answer = await send(port, request("GET", "/healthcheck", *many))
    assert answer.status == 431
    assert answer.error()["code"] == "HEADER_TOO_LARGE"


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
async def test_what_is_not_http_is_a_json_400(port: int, data: bytes) -> None:
    answer = await send(port, data)
    assert answer.status == 400, answer
    assert answer.error()["code"] == "BAD_REQUEST"


# --- slow clients are answered 408 and closed ---------------------------------------


async def test_half_a_header_is_answered_408_and_closed(port: int) -> None:
    answer = await send(port, b"POST /api/v1/files/retry HTTP/1.1\r\nHost: 127.0.0.1\r\nCont")
    assert answer.status == 408
    error = answer.error()
    assert error["code"] == "REQUEST_TIMEOUT"
    assert "HTTP_HEADER_TIMEOUT_SECONDS" in error["message"]


async def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    answer = await send(port, b"")
    assert answer.status == 408 and answer.error()["code"] == "REQUEST_TIMEOUT"


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
    """GET answers without reading a body; aiohttp alone would then go on reading what is
    left of it for its lingering time (10 s). The body deadline closes the connection
    instead, well within that."""
    head = request("GET", f"/api/v1/files/{uuid.uuid4()}", "Content-Length: 1000")
    answer = await send(port, head + b"x" * 10, within=LINGERING / 2)
    assert answer.status == 404 and answer.error()["code"] == "FILE_NOT_FOUND"


async def test_300_stalled_connections_are_all_answered_and_closed(port: int) -> None:
    """The issue's attack: 300 connections that send half a header and one that sends
    half a body, all at once. Each is answered 408 and closed; then the server serves."""
    halves = [b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "] * 300
    halves.append(request("POST", "/api/v1/files/retry", "Content-Length: 100", body=b"{"))
    answers = await asyncio.gather(*(send(port, half) for half in halves))
    assert {a.status for a in answers} == {408}
    assert {a.error()["code"] for a in answers} == {"REQUEST_TIMEOUT"}
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
        assert answer.status == 431 and answer.error()["code"] == "HEADER_TOO_LARGE"
        answer = await send(port, b"GET /healthcheck HTTP/1.1\r\n")
        assert answer.status == 408 and answer.error()["code"] == "REQUEST_TIMEOUT"


def test_arm_core_serve_reads_the_timeouts_from_the_environment(
    db_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "DATABASE_URL": db_url,
        "NATS_ENABLED": "false",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
        "HTTP_HEADER_TIMEOUT_SECONDS": "0.5",
        "HTTP_BODY_TIMEOUT_SECONDS": "0.5",
    }
    proc = ArmProcess("serve", env, tmp_path / "serve.log")
    try:
        proc.wait_healthy(port)

        async def both() -> tuple[Answer, Answer]:
            half_body = request("POST", "/api/v1/files/retry", "Content-Length: 50", body=b"{")
            return await asyncio.gather(send(port, b"GET / HTTP/1.1\r\n"), send(port, half_body))

        header, body = asyncio.run(both())
        assert header.status == 408 and "HTTP_HEADER_TIMEOUT_SECONDS=0.5" in header.body.decode()
        assert body.status == 408 and "HTTP_BODY_TIMEOUT_SECONDS=0.5" in body.body.decode()
        assert proc.stop() == 0
    finally:
        if proc.proc.poll() is None:
            proc.kill()
    assert "HTTP_HEADER_TIMEOUT_SECONDS=0.5" in proc.log()  # the 408 is logged
