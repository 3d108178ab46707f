"""GET /api/v1/status: the figures of constructed situations — an
overdue unacked job, one past its deadline that no sweep has timed out, the oldest queued
age, the last sweep with its error — through the real API as arm_api; `bridge` null
without a bridge and the states of a running one; 401 without credentials."""

from __future__ import annotations

import time
from typing import Any

import pytest

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import ack, dict_conn, publish, result, sample, upload
from arm_core.http.keys import METRICS
from arm_core.runtime import BRIDGE
from tests.support.api import api_settings, running_api
from tests.support.bridge import fast_settings

pytestmark = pytest.mark.integration


async def test_the_status_of_constructed_situations(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        upload(conn)
        publish(conn)  # published now, its ack not overdue
        overdue = upload(conn)
        publish(conn)
        conn.execute(
            "UPDATE arm.recognition_job SET last_published_at = clock_timestamp() - "
            "interval '1 minute' WHERE id = %s",
            (overdue.job_id,),
        )
        late = upload(conn, "PDF")
        publish(conn, image_timeout=0)  # its deadline is now: past it at once
        ack(conn, late.job_id, late.file_id, "scan-gateway")
        upload(conn)  # queued
    # ACK_TIMEOUT_SECONDS 30: the job published a minute ago is overdue, the other not.
    async with running_api(api_settings(db_url, ack_timeout_seconds=30)) as http:
        assert http.app is not None
        http.app[METRICS].status_cache_seconds = 0
        resp = await http.get("/api/v1/status")
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["jobs"] == {
            "queued": 1,
            "published": 2,
            "processing": 1,
            "done": 0,
            "needs_check": 0,
            "error": 0,
            "timeout": 0,
            "dlq": 0,
        }
        assert body["files"] == {"UPLOADED": 3, "PROCESSING": 1, "ERROR": 0}
        assert body["unacked_overdue"] == 1
        assert body["past_deadline_unswept"] == 1
        assert 0 < body["oldest_queued_age_seconds"] < 3600
        assert body["last_sweep"] == {"at": None, "result": None, "error": None}
        assert body["bridge"] is None  # NATS_ENABLED=false: this process runs no bridge

        with dict_conn(db_url) as conn:
            conn.execute("UPDATE arm.periodic_task SET next_run_at = clock_timestamp()")
            conn.execute("SELECT * FROM arm.run_due_tasks()")  # the sweep times `late` out
        body = await (await http.get("/api/v1/status")).json()
        assert (body["past_deadline_unswept"], body["jobs"]["timeout"]) == (0, 1)
        assert (body["last_sweep"]["result"], body["last_sweep"]["error"]) == ("1", None)
        assert body["last_sweep"]["at"] is not None

        with dict_conn(db_url) as conn:  # a sweep that fails
            conn.execute("CREATE FUNCTION arm.broken() RETURNS int LANGUAGE sql AS 'SELECT 1/0'")
            conn.execute(
                "UPDATE arm.periodic_task SET function_name = 'arm.broken()', "
                "next_run_at = clock_timestamp() WHERE name = 'sweep_timeouts'"
            )
            conn.execute("SELECT * FROM arm.run_due_tasks()")
        body = await (await http.get("/api/v1/status")).json()
        assert body["last_sweep"]["result"] is None
        assert body["last_sweep"]["error"] == "22012: division by zero"


async def test_the_status_names_the_bridge_of_a_serve_that_runs_one(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    settings = fast_settings(db_url, nats_server.url())
    settings = api_settings(db_url, nats_enabled=True, nats_urls=settings.nats_urls)
    async with running_api(settings) as http:
        assert http.app is not None
        http.app[METRICS].status_cache_seconds = 0

        name = http.app[BRIDGE].name

        async def status() -> Any:
            return await (await http.get("/api/v1/status")).json()

        async def bridge_ok() -> bool:
            body = await status()
            # its own, as it is now; and its row, as it wrote it (every bridge's)
            own = body["bridge"] == {"name": name, "nats": "ok", "listener": "ok"}
            rows = [b for b in body["bridges"] if b["name"] == name]
            return own and len(rows) == 1 and rows[0]["nats"] == "ok" and not rows[0]["silent"]

        await wait_for(bridge_ok, 10, "bridge nats ok, listener ok, its row written")
        nats_server.stop()

        async def reconnecting() -> bool:
            body = await status()
            [row] = [b for b in body["bridges"] if b["name"] == name]
            return bool(body["bridge"]["nats"] == "reconnecting" == row["nats"])

        # Its row says so at its next write (every 5 s).
        await wait_for(reconnecting, 20, "bridge nats reconnecting, and its row")


async def test_the_status_needs_credentials_when_auth_is_on(db_url: str) -> None:
    settings = api_settings(db_url, auth_mode="token", api_tokens=(("ops", "s3cret-token-x"),))
    async with running_api(settings) as http:
        resp = await http.get("/api/v1/status")
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "UNAUTHORIZED"
        resp = await http.get("/api/v1/status", headers={"Authorization": "Bearer s3cret-token-x"})
        assert resp.status == 200


async def test_the_series_of_the_charts_and_what_it_refuses(db_url: str) -> None:
    """GET /api/v1/status/series: the database's samples as the page draws them, through
    the real API as arm_api; a window outside 1–1,440 minutes is a 400 naming it."""
    with dict_conn(db_url) as conn:
        sample(conn, ago=90 * 60)  # outside the default hour
        up = upload(conn)
        began = time.monotonic()
        sample(conn, ago=60)
        publish(conn)
        result(conn, up.job_id, up.file_id)
        conn.execute("SELECT arm.record_waits('queued', %s)", ([0, 4] + [0] * 15,))
        sample(conn)
        between = time.monotonic() - began  # the samples' distance, beyond the 60 s forged
    async with running_api(api_settings(db_url)) as http:
        resp = await http.get("/api/v1/status/series")
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["minutes"] == 60
        first, second = body["points"]
        assert (first["queued"], first["finished"], first["waits"]) == (1, None, None)
        assert second["finished"] == {
            "done": 1,
            "needs_check": 0,
            "error": 0,
            "timeout": 0,
            "dlq": 0,
        }
        assert second["waits"] == {"queued": {"n": 4, "p50": 0.03, "p99": 0.05}}  # ms precision
        assert 60 <= second["seconds"] <= 60 + between + 0.5 and second["queued"] == 0
        resp = await http.get("/api/v1/status/series", params={"minutes": "120"})
        assert len((await resp.json())["points"]) == 3
        for bad in ("0", "1441", "ten", "٣", "60.5", ""):
            resp = await http.get("/api/v1/status/series", params={"minutes": bad})
            assert resp.status == 400, bad
            error = (await resp.json())["error"]
            assert (error["code"], error["details"]) == (
                "VALIDATION_ERROR",
                {"parameter": "minutes"},
            )
        resp = await http.get("/api/v1/status/series?minutes=5&minutes=6")
        assert resp.status == 400
        resp = await http.get("/api/v1/status/series?hours=1")
        assert resp.status == 400
        assert (await resp.json())["error"]["details"] == {"parameter": "hours"}
