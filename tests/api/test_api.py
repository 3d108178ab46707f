"""The HTTP API against a real PostgreSQL (docs/behaviour.md#retry, #interfaces): every
status code, retry races through HTTP, authentication, and JSON errors for whatever a client
sends."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from arm_core.devtools.testbed.sql import (
    Upload,
    dict_conn,
    fail_by_no_ack,
    jobs_of,
    one_row,
    publish,
    scalar,
    stored_file,
    upload,
)
from tests.support.api import api_settings, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def http(db_url: str) -> AsyncIterator[TestClient]:
    async with running_api(api_settings(db_url)) as client:
        yield client


def failed(db_url: str, n: int = 1) -> list[Upload]:
    """n tabular uploads whose attempt 1 ended dlq / NO_ACK."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn, "XLSX", name="ОСВ РБ.xlsx") for _ in range(n)]
        publish(conn)
        fail_by_no_ack(conn)
    return ups


async def error_of(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return dict(body["error"])


# --- single retry ------------------------------------------------------------------


async def test_S_RT_1_retry_through_http(http: TestClient, db_url: str) -> None:
    """S-RT-1 via POST /api/v1/files/{id}/retry → 201 with the new queued attempt 2."""
    [up] = failed(db_url)
    resp = await http.post(f"/api/v1/files/{up.file_id}/retry")
    assert resp.status == 201
    body = await resp.json()
    assert body["attempt"] == 2 and body["status"] == "queued"
    assert body["previous_job_id"] == str(up.job_id)
    with dict_conn(db_url) as conn:
        f = stored_file(conn, up.file_id)
        assert str(f["current_recognition_job_id"]) == body["job_id"]
        assert f["status"] == "UPLOADED" and f["s3_object_id"] == up.s3_object_id
        audit = one_row(conn, "SELECT * FROM arm.retry_audit")
        assert audit["actor"] == "anonymous" and str(audit["new_job_id"]) == body["job_id"]


async def test_not_retryable_says_why(http: TestClient, db_url: str) -> None:
    with dict_conn(db_url) as conn:
        live = upload(conn)
    err = await error_of(
        await http.post(f"/api/v1/files/{live.file_id}/retry"), 409, "FILE_NOT_RETRYABLE"
    )
    assert err["details"]["reason"] == "not_failed"
    assert err["details"]["current_status"] == "queued"
    assert err["details"]["current_attempt"] == 1

    [up] = failed(db_url)
    with dict_conn(db_url) as conn:
        conn.execute("SELECT arm.set_setting('default_max_attempts', '1')")
        one_shot = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
    err = await error_of(
        await http.post(f"/api/v1/files/{one_shot.file_id}/retry"), 409, "FILE_NOT_RETRYABLE"
    )
    assert err["details"]["reason"] == "attempts_exhausted"
    assert (err["details"]["current_attempt"], err["details"]["max_attempts"]) == (1, 1)
    assert "last allowed attempt" in err["message"]
    assert (await http.post(f"/api/v1/files/{up.file_id}/retry")).status == 201


async def test_a_late_second_click_names_attempt_1_and_is_refused(
    http: TestClient, db_url: str
) -> None:
    """A retry names its attempt, through HTTP: two operators on the same page (attempt 1
    failed); the first click creates attempt 2, which fails at once; the second click
    names attempt 1 (body or If-Match) and gets 409 attempt_changed — no attempt 3."""
    [up] = failed(db_url)
    first = await http.post(f"/api/v1/files/{up.file_id}/retry", json={"job_id": str(up.job_id)})
    assert first.status == 201, await first.text()
    attempt_2 = (await first.json())["job_id"]
    with dict_conn(db_url) as conn:
        publish(conn)
        fail_by_no_ack(conn)  # attempt 2 fails fast
    hows: list[dict[str, Any]] = [
        {"json": {"job_id": str(up.job_id)}},
        {"headers": {"If-Match": f'"{up.job_id}"'}},
    ]
    for how in hows:
        err = await error_of(
            await http.post(f"/api/v1/files/{up.file_id}/retry", **how), 409, "FILE_NOT_RETRYABLE"
        )
        assert err["details"]["reason"] == "attempt_changed"
        assert err["details"]["current_job_id"] == attempt_2
        assert (err["details"]["current_status"], err["details"]["current_attempt"]) == ("dlq", 2)
        assert "look at the file again" in err["message"]
    with dict_conn(db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, up.file_id)] == [1, 2]
    # The batch names them too; naming attempt 2 retries it.
    resp = await http.post(
        "/api/v1/files/retry",
        json={"files": [{"file_id": str(up.file_id), "job_id": str(up.job_id)}]},
    )
    [entry] = (await resp.json())["results"]
    assert (entry["outcome"], entry["details"]["reason"]) == ("skipped", "attempt_changed")
    resp = await http.post(
        f"/api/v1/files/{up.file_id}/retry", headers={"If-Match": f'"{attempt_2}"'}
    )
    assert resp.status == 201 and (await resp.json())["attempt"] == 3


@pytest.mark.parametrize(
    "how",
    [
        {"json": {"job_id": "not-a-uuid"}},
        {"json": {"job_id": 5}},
        {"json": {"force": True}},
        {"json": ["x"]},
        {"headers": {"If-Match": "*"}},
        {"json": {"job_id": str(uuid.uuid4())}, "headers": {"If-Match": str(uuid.uuid4())}},
    ],
)
async def test_a_retry_that_names_no_job_clearly_is_a_400(
    http: TestClient, db_url: str, how: dict[str, Any]
) -> None:
    [up] = failed(db_url)
    await error_of(
        await http.post(f"/api/v1/files/{up.file_id}/retry", **how), 400, "VALIDATION_ERROR"
    )
    with dict_conn(db_url) as conn:
        assert len(jobs_of(conn, up.file_id)) == 1  # nothing retried


async def test_unknown_and_malformed_file_ids(http: TestClient) -> None:
    await error_of(await http.post(f"/api/v1/files/{uuid.uuid4()}/retry"), 404, "FILE_NOT_FOUND")
    await error_of(await http.post("/api/v1/files/not-a-uuid/retry"), 400, "INVALID_FILE_ID")
    await error_of(await http.get(f"/api/v1/files/{uuid.uuid4()}"), 404, "FILE_NOT_FOUND")
    await error_of(await http.get("/api/v1/files/12345"), 400, "INVALID_FILE_ID")


async def test_S_RT_4_twenty_parallel_retries_one_201(http: TestClient, db_url: str) -> None:
    """S-RT-4 through HTTP: a double-click times ten → exactly one 201, the rest 409
    FILE_NOT_RETRYABLE, exactly one attempt 2 and no attempt 3."""
    [up] = failed(db_url)
    responses = await asyncio.gather(
        *(http.post(f"/api/v1/files/{up.file_id}/retry") for _ in range(20))
    )
    statuses = sorted(r.status for r in responses)
    assert statuses == [201] + [409] * 19
    for r in responses:
        if r.status == 409:
            assert (await r.json())["error"]["code"] == "FILE_NOT_RETRYABLE"
    with dict_conn(db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, up.file_id)] == [1, 2]
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 1


async def test_S_RT_4_batch_racing_singles(http: TestClient, db_url: str) -> None:
    """A batch and single retries of the same files at once: each file is retried
    exactly once, either by a single (201) or by the batch (retried); the loser gets 409
    or `skipped`."""
    ups = failed(db_url, 6)
    ids = [str(u.file_id) for u in ups]
    calls = [http.post("/api/v1/files/retry", json={"file_ids": ids}) for _ in range(2)]
    calls += [http.post(f"/api/v1/files/{i}/retry") for i in ids for _ in range(2)]
    responses = await asyncio.gather(*calls)
    batches = [await r.json() for r in responses[:2]]
    singles = responses[2:]
    wins: dict[str, int] = dict.fromkeys(ids, 0)
    for b in batches:
        for entry in b["results"]:
            if entry["outcome"] == "retried":
                wins[entry["file_id"]] += 1
            else:
                assert entry["reason"] == "FILE_NOT_RETRYABLE"
    for i, r in zip([i for i in ids for _ in range(2)], singles, strict=True):
        assert r.status in (201, 409)
        wins[i] += r.status == 201
    assert wins == dict.fromkeys(ids, 1)
    with dict_conn(db_url) as conn:
        for u in ups:
            assert [j["attempt"] for j in jobs_of(conn, u.file_id)] == [1, 2]


# --- batch retry -------------------------------------------------------------------


async def test_batch_mix_of_retryable_not_retryable_unknown_and_duplicates(
    http: TestClient, db_url: str
) -> None:
    a, b = failed(db_url, 2)
    with dict_conn(db_url) as conn:
        live = upload(conn)
    unknown = uuid.uuid4()
    ids = [str(a.file_id), str(live.file_id), str(unknown), str(a.file_id), str(b.file_id)]
    resp = await http.post("/api/v1/files/retry", json={"file_ids": ids})
    assert resp.status == 200
    results = (await resp.json())["results"]
    assert [r["file_id"] for r in results] == [
        str(a.file_id),
        str(live.file_id),
        str(unknown),
        str(b.file_id),
    ]
    assert [r["outcome"] for r in results] == ["retried", "skipped", "skipped", "retried"]
    assert results[0]["attempt"] == 2 and results[3]["attempt"] == 2
    assert results[1]["reason"] == "FILE_NOT_RETRYABLE"
    assert results[1]["details"]["reason"] == "not_failed"
    assert results[2]["reason"] == "FILE_NOT_FOUND"
    with dict_conn(db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, a.file_id)] == [1, 2]
        assert (
            str(stored_file(conn, b.file_id)["current_recognition_job_id"]) == results[3]["job_id"]
        )


# A file id no database holds (fixed: pytest-xdist's workers must collect the same ids).
NO_FILE = b"00000000-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "INVALID_JSON"),
        (b"", 400, "INVALID_JSON"),
        (b"[]", 400, "VALIDATION_ERROR"),
        (b'"x"', 400, "VALIDATION_ERROR"),
        (b'{"file_ids": "abc"}', 400, "VALIDATION_ERROR"),
        (b'{"file_ids": [1, 2]}', 400, "VALIDATION_ERROR"),
        (b'{"file_ids": ["not-a-uuid"]}', 400, "VALIDATION_ERROR"),
        (b'{"file_ids": []}', 400, "VALIDATION_ERROR"),
        (b'{"file_ids": null}', 400, "VALIDATION_ERROR"),
        (b'{"file_ids": [], "force": true}', 400, "VALIDATION_ERROR"),
        (
            b'{"file_ids": ["%s"], "job_ids": []}' % NO_FILE,
            400,
            "VALIDATION_ERROR",
        ),
        (
            b'{"file_ids": ["%s"], "job_ids": ["x"]}' % NO_FILE,
            400,
            "VALIDATION_ERROR",
        ),
        (
            b'{"file_ids": ["%s"], "job_ids": 7}' % NO_FILE,
            400,
            "VALIDATION_ERROR",
        ),
        (b"\xff\xfe\x00", 400, "INVALID_JSON"),
    ],
)
async def test_batch_rejects_malformed_bodies(
    http: TestClient, body: bytes, status: int, code: str
) -> None:
    resp = await http.post(
        "/api/v1/files/retry", data=body, headers={"Content-Type": "application/json"}
    )
    await error_of(resp, status, code)


async def test_batch_size_and_body_limits(db_url: str) -> None:
    settings = api_settings(db_url, retry_batch_max=5, http_max_body_bytes=4096)
    async with running_api(settings) as http:
        ids = [str(uuid.uuid4()) for _ in range(6)]
        await error_of(
            await http.post("/api/v1/files/retry", json={"file_ids": ids}), 413, "TOO_MANY_FILES"
        )
        huge = {"file_ids": [str(uuid.uuid4())] * 200}
        await error_of(await http.post("/api/v1/files/retry", json=huge), 413, "PAYLOAD_TOO_LARGE")
        await error_of(
            await http.post(
                "/api/v1/files/retry",
                data=b"file_ids=1",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        )


# --- reading a file ----------------------------------------------------------------


async def test_get_file_shows_every_attempt_in_order(http: TestClient, db_url: str) -> None:
    [up] = failed(db_url)
    new = await (await http.post(f"/api/v1/files/{up.file_id}/retry")).json()
    resp = await http.get(f"/api/v1/files/{up.file_id}")
    assert resp.status == 200
    body = await resp.json()
    assert body["file"]["id"] == str(up.file_id)
    assert body["file"]["s3"]["key"] == up.key
    assert body["file"]["status"] == "UPLOADED"
    assert body["current_job"]["job_id"] == new["job_id"]
    first, second = body["attempts"]
    assert (first["attempt"], first["status"]) == (1, "dlq")
    assert first["error"] == {"code": "NO_ACK", "message": first["error"]["message"]}
    assert first["published_at"] and first["finished_at"]
    assert (second["attempt"], second["status"], second["published_at"]) == (2, "queued", None)


# --- errors are always JSON --------------------------------------------------------


async def test_unknown_routes_and_methods_answer_json(http: TestClient) -> None:
    await error_of(await http.get("/nope"), 404, "NOT_FOUND")
    await error_of(await http.get("/api/v1/nope"), 404, "NOT_FOUND")
    await error_of(await http.get("/api/v1/files/"), 404, "NOT_FOUND")  # the list has no /
    err = await http.delete(f"/api/v1/files/{uuid.uuid4()}")
    await error_of(err, 405, "METHOD_NOT_ALLOWED")
    assert "GET" in err.headers["Allow"]
    batch = await http.get("/api/v1/files/retry")  # the batch route, not a file id
    await error_of(batch, 405, "METHOD_NOT_ALLOWED")
    assert batch.headers["Allow"] == "POST"
    await error_of(
        await http.post(
            f"/api/v1/files/{uuid.uuid4()}/retry",
            data=b"{oops",
            headers={"Content-Type": "application/json"},
        ),
        400,
        "INVALID_JSON",
    )


async def test_no_input_a_client_can_send_gives_a_500(http: TestClient, db_url: str) -> None:
    """Random bodies, paths and headers: every answer is JSON below 500, nothing changes."""
    [up] = failed(db_url)
    rng = random.Random(20261129)
    paths = [
        "/api/v1/files/retry",
        f"/api/v1/files/{up.file_id}/retry",
        f"/api/v1/files/{up.file_id}",
        "/api/v1/files/%00/retry",
        "/api/v1/files/" + "a" * 3000,
    ]
    bodies: list[bytes] = [
        b"null",
        b"1e999",
        b'{"force": true}',
        b'{"file_ids": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
        b'{"file_ids": [{"$gt": ""}]}',
        '{"file_ids": ["\u0000"]}'.encode(),
        b'{"file_ids": ["' + str(up.file_id).encode() + b'", 7]}',
    ]
    bodies += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))) for _ in range(60)]
    for i, body in enumerate(bodies):
        path = paths[i % len(paths)] if i >= 3 else f"/api/v1/files/{up.file_id}/retry"
        method = "GET" if path.endswith(str(up.file_id)) and i % 2 else "POST"
        ctype = rng.choice(["application/json", "text/plain", "application/octet-stream", ""])
        resp = await http.request(method, path, data=body, headers={"Content-Type": ctype})
        assert resp.status < 500, (path, body[:80], await resp.text())
        if resp.status >= 400:
            assert (await resp.json())["error"]["code"]
    with dict_conn(db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, up.file_id)] == [1]


# --- authentication: who retried ---------------------------------------------------


async def test_token_auth_records_the_actor_and_refuses_without(db_url: str) -> None:
    [up] = failed(db_url)
    settings = api_settings(
        db_url, auth_mode="token", api_tokens=(("ivanova@arm", "t0ken-ivanova-0123456789"),)
    )
    async with running_api(settings) as http:
        url = f"/api/v1/files/{up.file_id}/retry"
        await error_of(await http.post(url), 401, "UNAUTHORIZED")
        await error_of(
            await http.post(url, headers={"Authorization": "Bearer wrong-token-xxxxxx"}),
            401,
            "UNAUTHORIZED",
        )
        await error_of(
            await http.post("/api/v1/files/retry", json={"file_ids": [str(up.file_id)]}),
            401,
            "UNAUTHORIZED",
        )
        await error_of(await http.get(f"/api/v1/files/{up.file_id}"), 401, "UNAUTHORIZED")
        with dict_conn(db_url) as conn:
            assert len(jobs_of(conn, up.file_id)) == 1  # the 401s changed nothing
        assert (await http.get("/healthcheck")).status == 200  # public
        ok = await http.post(url, headers={"Authorization": "Bearer t0ken-ivanova-0123456789"})
        assert ok.status == 201
    with dict_conn(db_url) as conn:
        assert one_row(conn, "SELECT actor FROM arm.retry_audit")["actor"] == "ivanova@arm"


async def test_proxy_header_auth(db_url: str) -> None:
    [up] = failed(db_url)
    async with running_api(api_settings(db_url, auth_mode="header")) as http:
        url = f"/api/v1/files/{up.file_id}/retry"
        await error_of(await http.post(url), 401, "UNAUTHORIZED")
        ok = await http.post(url, headers={"X-Forwarded-User": "petrov"})
        assert ok.status == 201
    with dict_conn(db_url) as conn:
        assert one_row(conn, "SELECT actor FROM arm.retry_audit")["actor"] == "petrov"
