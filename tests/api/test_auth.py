"""AUTH_MODE=token through the real app (real sockets, a real PostgreSQL): each
configured token names its own actor in the retry audit, and nothing that is not
exactly a configured token gets in — a prefix, one character more or less, another
case, a token of another length, bytes that are not UTF-8."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient

from arm_core.devtools.testbed.sql import dict_conn, fail_by_no_ack, publish, scalar, upload
from tests.support.api import api_settings, running_api

pytestmark = pytest.mark.integration

TOKENS = (
    ("ivanova@arm", "ivanova-0123456789abcdef"),
    ("ops", "ops-fedcba9876543210-xyz"),
    ("petrov", "petrov-00000000000000000000000000000000000000000001"),
)


def failed_file(db_url: str) -> str:
    """A file whose only attempt ended dlq / NO_ACK: retryable."""
    with dict_conn(db_url) as conn:
        up = upload(conn, "XLSX")
        publish(conn)
        fail_by_no_ack(conn)
    return str(up.file_id)


async def retry_as(http: TestClient, db_url: str, authorization: str) -> tuple[int, str]:
    """POSTs a retry with this Authorization header: the status and the error code or the
    actor the audit recorded."""
    file_id = failed_file(db_url)
    resp = await http.post(
        f"/api/v1/files/{file_id}/retry", headers={"Authorization": authorization}
    )
    body = await resp.json()
    if resp.status != 201:
        return resp.status, body["error"]["code"]
    with dict_conn(db_url) as conn:
        actor = scalar(conn, "SELECT actor FROM arm.retry_audit WHERE file_id = %s", (file_id,))
    return resp.status, actor


async def test_every_configured_token_names_its_actor(db_url: str) -> None:
    settings = api_settings(db_url, auth_mode="token", api_tokens=TOKENS)
    async with running_api(settings) as http:
        for actor, token in reversed(TOKENS):  # first, middle and last entry
            assert await retry_as(http, db_url, f"Bearer {token}") == (201, actor)
        assert await retry_as(http, db_url, f"bearer   {TOKENS[1][1]}  ") == (201, "ops")


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        "Bearer",
        "Bearer ",
        f"Basic {TOKENS[0][1]}",
        f"Bearer {TOKENS[0][1][:-1]}",  # a prefix
        f"Bearer {TOKENS[0][1]}0",  # one character more
        f"Bearer {TOKENS[0][1][:-1]}e",  # the same length, the last character differs
        f"Bearer {TOKENS[0][1].upper()}",
        f"Bearer {TOKENS[0][1]}{TOKENS[1][1]}",  # two tokens run together
        "Bearer ivanova@arm",  # an actor is not a token
    ],
)
async def test_anything_but_a_configured_token_is_refused(db_url: str, authorization: str) -> None:
    settings = api_settings(db_url, auth_mode="token", api_tokens=TOKENS)
    async with running_api(settings) as http:
        assert await retry_as(http, db_url, authorization) == (401, "UNAUTHORIZED")
    with dict_conn(db_url) as conn:
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 0


async def test_a_token_that_is_not_utf8_is_refused_not_a_500(db_url: str) -> None:
    settings = api_settings(db_url, auth_mode="token", api_tokens=TOKENS)
    async with running_api(settings) as http:
        file_id = failed_file(db_url)
        reader, writer = await asyncio.open_connection(http.host, http.port)
        writer.write(
            f"POST /api/v1/files/{file_id}/retry HTTP/1.1\r\nHost: x\r\n".encode()
            + b"Authorization: Bearer \xff\xfe\x80ivanova-0123456789abcdef\r\n"
            + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        answer = await reader.read()
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401 "), answer
        assert json.loads(body)["error"]["code"] == "UNAUTHORIZED"
