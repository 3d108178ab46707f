"""Archived files through the API: the file view shows one as archived, with its whole
history; a retry of it, single or in a batch, is refused with the reason."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient

from arm_core.devtools.testbed.sql import age, archive, dict_conn, fail_by_no_ack, publish, upload
from tests.support.api import api_settings, running_api

pytestmark = pytest.mark.integration


@pytest.fixture
async def http(db_url: str) -> AsyncIterator[TestClient]:
    async with running_api(api_settings(db_url)) as client:
        yield client


async def test_an_archived_file_is_shown_as_archived_and_not_retried(
    http: TestClient, db_url: str
) -> None:
    with dict_conn(db_url) as conn:
        old, hot = upload(conn), upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        age(conn, old.file_id, 400)
        assert archive(conn, days=365)["files"] == 1

    resp = await http.get(f"/api/v1/files/{old.file_id}")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["file"]["archived_at"] is not None
    assert [a["status"] for a in doc["attempts"]] == ["dlq"]
    assert doc["current_job"]["job_id"] == str(old.job_id)
    hot_doc = await (await http.get(f"/api/v1/files/{hot.file_id}")).json()
    assert hot_doc["file"]["archived_at"] is None

    resp = await http.post(f"/api/v1/files/{old.file_id}/retry", json={"job_id": str(old.job_id)})
    assert resp.status == 409
    err = (await resp.json())["error"]
    assert err["code"] == "FILE_NOT_RETRYABLE"
    assert err["details"]["reason"] == "archived"
    assert err["details"]["current_job_id"] == str(old.job_id)
    assert "archive" in err["message"]

    # The file list holds the hot tables only.
    listed = await (await http.get("/api/v1/files?status=ERROR")).json()
    assert [item["id"] for item in listed["items"]] == [str(hot.file_id)]
