"""GET /api/v1/files through the real app on a real PostgreSQL, as the API's login (a
member of arm_api only): the item's fields, keyset pages that new uploads do not shift,
the cursor and every parameter checked (400 naming the parameter), auth; and the retry
audit of GET /api/v1/files/{id}."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from jsonschema_rs import Draft202012Validator

from arm_core.devtools.testbed.sql import (
    Upload,
    dict_conn,
    fail_by_no_ack,
    publish,
    upload,
    upload_many,
)
from arm_core.http.app import OPENAPI_PATH
from arm_core.http.file_list import decode_cursor, encode_cursor
from tests.support.api import api_settings, running_api

pytestmark = pytest.mark.integration

L = "/api/v1/files"


@pytest.fixture
async def http(db_url: str) -> AsyncIterator[TestClient]:
    async with running_api(api_settings(db_url)) as client:
        yield client


async def get_page(http: TestClient, **params: Any) -> dict[str, Any]:
    resp = await http.get(L, params=params)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def error_of(http: TestClient, params: Any, status: int = 400) -> dict[str, Any]:
    resp = await http.get(L, params=params)
    assert resp.status == status, (params, await resp.text())
    assert resp.content_type == "application/json"
    error: dict[str, Any] = (await resp.json())["error"]
    return error


def uploads(db_url: str, n: int, name: str = "файл") -> list[Upload]:
    with dict_conn(db_url) as conn:
        return [upload(conn, name=f"{name} {i}.xlsx") for i in range(n)]


async def test_an_item_is_the_file_its_current_job_and_retryable(
    http: TestClient, db_url: str
) -> None:
    with dict_conn(db_url) as conn:
        failed = upload(conn, name="ОСВ за март.xlsx")
        publish(conn)
        fail_by_no_ack(conn)
        live = upload(conn, "PDF", name="Скан.pdf")
    body = await get_page(http)
    assert body["next_cursor"] is None
    second, first = body["items"]
    assert second["id"] == str(live.file_id)
    assert first == {
        "id": str(failed.file_id),
        "consolidation_id": first["consolidation_id"],
        "original_name": "ОСВ за март.xlsx",
        "file_type": "XLSX",
        "status": "ERROR",
        "s3": {"bucket": "arm-ka", "key": failed.key},
        "created_at": first["created_at"],
        "updated_at": first["updated_at"],
        "current_job": {
            "job_id": str(failed.job_id),
            "status": "dlq",
            "attempt": 1,
            "max_attempts": 3,
            "error_code": "NO_ACK",
        },
        "retryable": True,
    }
    assert first["created_at"].endswith("+00:00") and first["consolidation_id"]
    assert second["current_job"]["status"] == "queued" and second["retryable"] is False

    # Retried through the API: the list shows attempt 2, queued, no longer retryable.
    assert (await http.post(f"/api/v1/files/{failed.file_id}/retry")).status == 201
    [item] = (await get_page(http, status="UPLOADED", q="март"))["items"]
    assert (item["current_job"]["attempt"], item["current_job"]["status"]) == (2, "queued")
    assert (item["status"], item["retryable"]) == ("UPLOADED", False)


async def test_filters_from_the_query_string(http: TestClient, db_url: str) -> None:
    with dict_conn(db_url) as conn:
        failed = upload(conn, name="Оборотка.XLSX")
        publish(conn)
        fail_by_no_ack(conn)
        consolidation = uuid.uuid4()
        scan = upload(conn, "PNG", name="фото.png", consolidation_id=consolidation)

    async def found(params: Any) -> list[str]:
        resp = await http.get(L, params=params)
        assert resp.status == 200, await resp.text()
        return [i["id"] for i in (await resp.json())["items"]]

    f, s = str(failed.file_id), str(scan.file_id)
    assert await found({"status": "ERROR"}) == [f]
    assert await found([("status", "ERROR"), ("status", "UPLOADED")]) == [s, f]
    assert await found({"status": "ERROR,UPLOADED"}) == [s, f]
    assert await found({"job_status": "dlq"}) == [f]
    assert await found({"job_status": "queued", "file_type": "PNG"}) == [s]
    assert await found({"consolidation_id": str(consolidation)}) == [s]
    assert await found({"q": "ОБОРОТКА"}) == [f]
    assert await found({"q": "ФОТО", "status": "ERROR"}) == []
    assert await found({"q": ""}) == [s, f]  # an empty search box is no filter
    assert await found({"updated_after": "2000-01-01T00:00:00Z"}) == [s, f]
    assert await found({"updated_before": "2000-01-01T00:00:00+03:00"}) == []


async def test_pages_are_stable_while_files_arrive(http: TestClient, db_url: str) -> None:
    with dict_conn(db_url) as conn:
        upload_many(conn, 4)  # four with one created_at: the id orders them
    old = uploads(db_url, 6)
    everything = [i["id"] for i in (await get_page(http, limit=500))["items"]]
    assert len(everything) == 10

    first = await get_page(http, limit=4)
    assert [i["id"] for i in first["items"]] == everything[:4]
    assert first["next_cursor"]
    new = uploads(db_url, 3, "новый")  # arrive between pages
    second = await get_page(http, limit=4, cursor=first["next_cursor"])
    assert [i["id"] for i in second["items"]] == everything[4:8]
    more = uploads(db_url, 2, "ещё")
    third = await get_page(http, limit=4, cursor=second["next_cursor"])
    assert [i["id"] for i in third["items"]] == everything[8:]
    assert third["next_cursor"] is None
    # A page that ends exactly at the last file says so: no cursor to an empty page.
    exact = await get_page(http, limit=2, cursor=second["next_cursor"])
    assert len(exact["items"]) == 2 and exact["next_cursor"] is None
    # The arrivals are on a new first page, newest first, before the ten.
    top = [i["id"] for i in (await get_page(http, limit=500))["items"]]
    assert top == [str(u.file_id) for u in reversed(new + more)] + everything
    assert [str(u.file_id) for u in reversed(old)] == everything[:6]


async def test_a_cursor_is_checked(http: TestClient, db_url: str) -> None:
    uploads(db_url, 3)
    cursor = (await get_page(http, limit=1))["next_cursor"]
    assert isinstance(cursor, str)
    created_at, file_id = decode_cursor(cursor)
    assert encode_cursor(created_at, file_id) == cursor

    def b64(keyset: str) -> str:  # a made-up cursor, with a correct check
        text = f"{keyset}:{hashlib.sha256(keyset.encode()).hexdigest()[:8]}"
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    _, micros, _, check = base64.urlsafe_b64decode(cursor + "==").decode().split(":")
    moved = f"v1:{int(micros) + 1}:{file_id}:{check}"  # another keyset, the old check

    tampered = [
        *(cursor[:i] + ("A" if cursor[i] != "A" else "B") + cursor[i + 1 :] for i in range(8)),
        cursor[:-1] + ("A" if cursor[-1] != "A" else "B"),
        base64.urlsafe_b64encode(moved.encode()).decode().rstrip("="),
        cursor + "=",  # padded: not the spelling the API gives out
        cursor[:-4],
        "x" * 101,
        "not a cursor!",
        b64("v1:abc:" + str(file_id)),
        b64(f"v2:0:{file_id}"),
        b64("v1:0:not-a-uuid-not-a-uuid-not-a-uuid-x"),
        b64(f"v1:999999999999999999:{file_id}"),  # past year 9999
        b64(f"v1:0:{str(file_id).upper()}"),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ]
    for bad in tampered:
        error = await error_of(http, {"cursor": bad})
        assert error["code"] == "INVALID_CURSOR", bad
        assert "cursor" in error["message"]
    # A well-formed cursor (its check right) is a position: the files older than it.
    assert (await get_page(http, cursor=b64(f"v1:{micros}:{uuid.UUID(int=0)}")))["items"]
    assert (await get_page(http, cursor=encode_cursor(created_at, uuid.UUID(int=0))))["items"]


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"limit": ""}, "limit"),
        ({"limit": "٣"}, "limit"),  # a digit, but not an ASCII one
        ({"status": "FAILED"}, "status"),
        ({"status": "error"}, "status"),  # file statuses are upper case
        ({"status": ""}, "status"),
        ({"job_status": "ERROR"}, "job_status"),
        ({"file_type": "DOCX"}, "file_type"),
        ({"consolidation_id": "42"}, "consolidation_id"),
        ({"consolidation_id": ""}, "consolidation_id"),
        ({"updated_after": "yesterday"}, "updated_after"),
        ({"updated_after": "2026-11-30T05:00:00"}, "updated_after"),  # no time zone
        ({"updated_before": ""}, "updated_before"),
        ({"q": "x" * 201}, "q"),
        ({"q": "a\x00b"}, "q"),
        ({"sort": "name"}, "sort"),  # unknown
        ([("limit", "5"), ("limit", "6")], "limit"),  # single-valued, twice
        ([("q", "a"), ("q", "b")], "q"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(
    http: TestClient, params: Any, parameter: str
) -> None:
    error = await error_of(http, params)
    assert error["code"] == "VALIDATION_ERROR"
    assert error["details"] == {"parameter": parameter}
    assert error["message"].startswith(f"{parameter}: ")


async def test_limit_bounds_and_default(http: TestClient, db_url: str) -> None:
    with dict_conn(db_url) as conn:
        upload_many(conn, 501)
    assert len((await get_page(http))["items"]) == 50
    one = await get_page(http, limit=1)
    assert len(one["items"]) == 1 and one["next_cursor"]
    most = await get_page(http, limit=500)
    assert len(most["items"]) == 500 and most["next_cursor"]
    rest = await get_page(http, limit=500, cursor=most["next_cursor"])
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None


async def test_the_list_needs_credentials_when_auth_is_on(db_url: str) -> None:
    uploads(db_url, 1)
    settings = api_settings(db_url, auth_mode="token", api_tokens=(("ops", "s3cret-t0ken"),))
    async with running_api(settings) as http:
        resp = await http.get(L)
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "UNAUTHORIZED"
        resp = await http.get(L, headers={"Authorization": "Bearer s3cret-t0ken"})
        assert resp.status == 200 and len((await resp.json())["items"]) == 1


async def test_the_file_page_has_the_retry_audit(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
    settings = api_settings(db_url, auth_mode="token", api_tokens=(("alice", "al1ce-t0ken"),))
    async with running_api(settings) as http:
        auth = {"Authorization": "Bearer al1ce-t0ken"}
        before = await (await http.get(f"{L}/{up.file_id}", headers=auth)).json()
        assert before["retries"] == []
        new = await (await http.post(f"{L}/{up.file_id}/retry", headers=auth)).json()
        after = await (await http.get(f"{L}/{up.file_id}", headers=auth)).json()
    [entry] = after["retries"]
    assert entry == {
        "actor": "alice",
        "actor_level": "all",  # a token without a level holds every level
        "retried_at": entry["retried_at"],
        "old_job_id": str(up.job_id),
        "new_job_id": new["job_id"],
        "new_attempt": 2,
    }
    assert [a["attempt"] for a in after["attempts"]] == [1, 2]
    doc = json.loads(OPENAPI_PATH.read_text())
    file_view = {"components": doc["components"], "$ref": "#/components/schemas/FileView"}
    validator = Draft202012Validator(file_view, validate_formats=True)
    assert sorted(e.message for e in validator.iter_errors(after)) == []
