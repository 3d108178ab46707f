"""The exchange end to end, processes as users run them: happy paths, a service that
never acks, one that never answers, NATS restarted mid-flow, two core instances, and
kill -9 of the bridge in the middle of a burst. Nothing lost, nothing stuck."""

from __future__ import annotations

import json
import signal
import urllib.request
from typing import Any

import pytest

from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, listening, log_lines
from arm_core.devtools.testbed.services import envelope, nats_client, send
from arm_core.devtools.testbed.sql import dict_conn, job, jobs_of, scalar, stored_file, upload

pytestmark = pytest.mark.e2e


def http(
    method: str, url: str, body: dict[str, Any] | None = None, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def current_status(db_url: str, file_id: Any) -> tuple[int, str]:
    with dict_conn(db_url) as conn:
        row = conn.execute(
            "SELECT j.attempt, j.status::text AS status FROM arm.stored_file f "
            "JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id WHERE f.id = %s",
            (file_id,),
        ).fetchone()
    assert row is not None
    return row["attempt"], row["status"]


async def until(db_url: str, file_id: Any, expected: tuple[int, str], within: float = 30) -> None:
    await wait_for(
        lambda: current_status(db_url, file_id) == expected,
        within,
        lambda: f"file {file_id} at {expected}, is {current_status(db_url, file_id)}",
    )


async def test_happy_path_tabular_and_image(stack: Stack) -> None:
    _, api = stack.serve()
    await listening(stack.reference())
    with dict_conn(stack.db_url) as conn:
        sheet, scan = upload(conn, "XLSX"), upload(conn, "PDF")
    await until(stack.db_url, sheet.file_id, (1, "done"))
    await until(stack.db_url, scan.file_id, (1, "done"))
    status, body = http("GET", f"{api}/api/v1/files/{sheet.file_id}")
    assert status == 200 and body["current_job"]["status"] == "done"
    assert body["current_job"]["service"]["name"] == "tabular-parser"
    key = body["current_job"]["result"]["key"]
    assert key == f"results/{sheet.file_id}/{sheet.job_id}/result.json"
    assert (stack.results / key).is_file()
    with dict_conn(stack.db_url) as conn:
        assert job(conn, scan.job_id)["service_name"] == "scan-gateway"
        assert stored_file(conn, sheet.file_id)["status"] == "PROCESSING"  # waits for mapping


async def test_never_acked_dead_letters_then_http_retry_succeeds(stack: Stack) -> None:
    """No ack → republished OUTBOX_MAX_REPUBLISH times → dlq/NO_ACK → retry through
    HTTP → done on attempt 2 once a healthy service is there."""
    _, api = stack.serve(OUTBOX_MAX_REPUBLISH=2)
    deaf = await listening(stack.reference(REFERENCE_MODE="never_ack"))
    with dict_conn(stack.db_url) as conn:
        up = upload(conn)
    await until(stack.db_url, up.file_id, (1, "dlq"), 30)
    with dict_conn(stack.db_url) as conn:
        dead = job(conn, up.job_id)
        assert (dead["error_code"], dead["republish_count"]) == ("NO_ACK", 2)
        assert stored_file(conn, up.file_id)["status"] == "ERROR"
    assert deaf.stop() == 0
    await listening(stack.reference())  # attempt 2 has OUTBOX_MAX_REPUBLISH acks' time too
    status, body = http("POST", f"{api}/api/v1/files/{up.file_id}/retry")
    assert status == 201 and body["attempt"] == 2
    await until(stack.db_url, up.file_id, (2, "done"), 30)


async def test_S_RT_2_silent_service_times_out_and_late_done_is_ignored(stack: Stack) -> None:
    """Acked but never answered → timeout → retry → attempt 2 done; then the slow
    service's done for attempt 1 arrives: ignored, nothing changes."""
    serve, api = stack.serve(TABULAR_REPLY_TIMEOUT_SECONDS=2)
    # The 2 s run from the publish: the service listens before the upload.
    silent = await listening(stack.reference(REFERENCE_MODE="never_answer"))
    with dict_conn(stack.db_url) as conn:
        up = upload(conn)
    await until(stack.db_url, up.file_id, (1, "timeout"), 20)
    with dict_conn(stack.db_url) as conn:
        first = job(conn, up.job_id)
    assert first["started_at"] is not None  # acked, then timed out
    assert (first["service_name"], first["error_code"]) == ("tabular-parser", "TIMEOUT")
    assert silent.stop() == 0
    await listening(stack.reference())  # attempt 2 has 2 s too
    status, _ = http("POST", f"{api}/api/v1/files/{up.file_id}/retry")
    assert status == 201
    await until(stack.db_url, up.file_id, (2, "done"), 30)
    with dict_conn(stack.db_url) as conn:
        before = (jobs_of(conn, up.file_id), stored_file(conn, up.file_id))
    client = await nats_client(stack.nats.url())
    try:
        await send(client, envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
        await send(client, envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
    finally:
        await client.close()
    await wait_for(
        lambda: len(log_lines(serve.log(), job_id=str(up.job_id), reason="already_final")) == 2,
        10,
        "late answers logged",
    )
    with dict_conn(stack.db_url) as conn:
        assert (jobs_of(conn, up.file_id), stored_file(conn, up.file_id)) == before


async def test_S_OUT_2_S_RT_3_nats_restarted_mid_flow(stack: Stack) -> None:
    """NATS stops while uploads and a retry come in: they stay queued; when it is back
    they are published (the retry with a fresh deadline and its own Nats-Msg-Id)."""
    # Ten republishes a second apart: when NATS is back the core publishes at once, and
    # the service, reconnecting too, may take seconds to subscribe again on a loaded
    # machine; with the default three the fresh job could be dead-lettered meanwhile.
    serve, api = stack.serve(OUTBOX_MAX_REPUBLISH=10)
    deaf = await listening(stack.reference(REFERENCE_MODE="never_ack"))
    with dict_conn(stack.db_url) as conn:
        failed = upload(conn)
    await until(stack.db_url, failed.file_id, (1, "dlq"), 60)
    assert deaf.stop() == 0
    stack.nats.stop()
    with dict_conn(stack.db_url) as conn:
        fresh = upload(conn)
    status, body = http("POST", f"{api}/api/v1/files/{failed.file_id}/retry")
    assert status == 201  # the API works without NATS
    # The publisher cycles on and says so once NATS has been gone a while; nothing moves.
    await wait_for(lambda: "NATS unreachable" in serve.log(), 20, "outage logged")
    with dict_conn(stack.db_url) as conn:
        assert job(conn, fresh.job_id)["status"] == "queued"
    assert current_status(stack.db_url, failed.file_id) == (2, "queued")
    _, health = http("GET", f"{api}/healthcheck")
    assert health["nats"] != "ok"
    stack.reference()  # connects as soon as NATS is back, like the core
    stack.nats.start()
    await until(stack.db_url, fresh.file_id, (1, "done"), 30)
    await until(stack.db_url, failed.file_id, (2, "done"), 30)
    with dict_conn(stack.db_url) as conn:
        retried = job(conn, body["job_id"])
        assert retried["request_msg_id"] == f"{body['job_id']}:2"
        assert retried["reply_deadline"] > job(conn, failed.job_id)["reply_deadline"]


async def test_S_NATS_2_two_core_instances_share_the_work(stack: Stack) -> None:
    """Two `arm-core serve` instances: every job done, every result applied by exactly
    one instance, every request published once."""
    first, _ = stack.serve(DEBUG="true")  # DEBUG: a log line per envelope applied
    second, _ = stack.serve(DEBUG="true")
    ref = await listening(stack.reference())
    with dict_conn(stack.db_url) as conn:
        ups = [upload(conn, "XLSX" if i % 2 else "PNG") for i in range(30)]
    for up in ups:
        await until(stack.db_url, up.file_id, (1, "done"), 30)
    for up in ups:
        applied = [
            len(log_lines(p.log(), job_id=str(up.job_id), action="result")) for p in (first, second)
        ]
        assert sorted(applied) == [0, 1], (up.job_id, applied)
    assert all(len(log_lines(p.log(), action="result")) > 0 for p in (first, second))
    ref_results = log_lines(ref.log(), action="ref_result")
    assert len(ref_results) == len(ups)  # each processed once


async def test_kill_9_of_the_bridge_mid_burst_then_restart(stack: Stack) -> None:
    """kill -9 while a burst is being published and answered, then a restart. Every job
    reaches a final status exactly once and none is stuck: answers that reached the
    restarted bridge are applied once each; answers published while no core instance
    was subscribed are lost (core NATS keeps nothing), so those jobs time out at their
    reply deadline — and a retry brings them to done. Nothing is lost for good."""
    n = 600
    with dict_conn(stack.db_url) as conn:
        ups = [upload(conn) for _ in range(n)]
    ref = await listening(stack.reference())
    # DEBUG: a log line per envelope applied, counted below. ACK_TIMEOUT_SECONDS above
    # the reply timeout: an ack lost in the kill leaves its job to time out, and a loaded
    # machine applying 600 acks more slowly than the stack's 1 s does not republish and
    # dead-letter jobs whose ack is on its way.
    env = {
        "OUTBOX_BATCH_SIZE": 50,
        "TABULAR_REPLY_TIMEOUT_SECONDS": 8,
        "ACK_TIMEOUT_SECONDS": 10,
        "DEBUG": "true",
    }
    bridge = stack.bridge(**env)
    live = (
        "SELECT count(*) FROM arm.recognition_job "
        "WHERE status IN ('queued', 'published', 'processing')"
    )
    with dict_conn(stack.db_url) as conn:
        # Killed while answers are being applied (publishing 600 takes well under a
        # second now, so "some published" would often find the burst already out).
        await wait_for(
            lambda: (
                scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'")
                >= 100
            ),
            30,
        )
        bridge.proc.send_signal(signal.SIGKILL)
        bridge.proc.wait()
        restarted = stack.bridge(**env)
        await wait_for(lambda: scalar(conn, live) == 0, 90, "no job left live")
        counts = {
            r["status"]: r["count"]
            for r in conn.execute(
                "SELECT status::text AS status, count(*) AS count FROM arm.recognition_job "
                "GROUP BY 1"
            ).fetchall()
        }
        assert set(counts) <= {"done", "timeout"}, counts
        assert counts.get("done", 0) + counts.get("timeout", 0) == n
        assert counts.get("done", 0) > 0
        assert (
            scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'")
            == counts["done"]
        )

        applied: dict[str, int] = {}
        for line in log_lines(bridge.log() + restarted.log(), action="result"):
            if "result applied" in line:
                job_id = line.split(" job_id=")[1].split()[0]
                applied[job_id] = applied.get(job_id, 0) + 1
        # Never applied twice. A kill -9 may land between a batch's commit and its log
        # lines, so the log can name fewer than the database holds (a loaded CI run once
        # named none); the database's own count of result objects above is the exact one.
        assert all(n == 1 for n in applied.values()) and len(applied) <= counts["done"], applied
        assert len(log_lines(ref.log(), action="ref_result")) == n  # each processed once

        timed_out = [u.file_id for u in ups if job(conn, u.job_id)["status"] == "timeout"]
        if timed_out:  # a DBA retries them; the new attempts go through
            rows = conn.execute(
                "SELECT * FROM arm.retry_files(%s::uuid[], 'dba')", (timed_out,)
            ).fetchall()
            assert {r["outcome"] for r in rows} == {"retried"}
        await wait_for(
            lambda: (
                scalar(
                    conn,
                    "SELECT count(*) FROM arm.stored_file f JOIN arm.recognition_job j "
                    "ON j.id = f.current_recognition_job_id WHERE j.status = 'done'",
                )
                == n
            ),
            60,
            "every file done",
        )
