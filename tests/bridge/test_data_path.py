"""The data path under load and with bad input: a burst through a real
`arm-core bridge` loses nothing, the inbox waits instead of dropping while the database is
up, a batch with bad envelopes still applies the good ones, results PostgreSQL cannot store
as given are made storable, and one unpublishable request never holds back the rest.

Most of these drive the bridge's steps (an inbox fed through its subscription callback,
`Inbox.run_once`, `Publisher.run_once`) and assert on what each returned. Three run more:
the 20,000-file burst a real `arm-core bridge` process, the health check the bridge's
app, and the answer lost at shutdown a whole bridge that is stopped."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.client import Client
from psycopg_pool import AsyncConnectionPool

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, log_lines
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import envelope, instant_service, nats_client, send
from arm_core.devtools.testbed.sql import (
    dict_conn,
    job,
    publish,
    scalar,
    stored_file,
    upload,
    upload_many,
)
from arm_core.runtime import bridge_app
from arm_core.statuses import ApplyOutcome, JobStatus
from arm_core.version import installed
from tests.bridge.test_processes import bridge_env
from tests.support.bridge import fast_settings, logged, new_bridge
from tests.support.steps import (
    InboxStep,
    inbox_feed,
    inbox_step,
    outcomes,
    publisher,
    receive,
    step_pool,
)

pytestmark = pytest.mark.integration

APPLIED = ApplyOutcome.APPLIED


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with step_pool(db_url) as pool:
        yield pool


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT status::text AS status, count(*) AS n FROM arm.recognition_job GROUP BY 1"
    ).fetchall()
    return {r["status"]: r["n"] for r in rows}


async def test_a_burst_of_20000_files_through_a_real_bridge_loses_nothing(
    db_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """20,000 uploads in one transaction, one `arm-core bridge` with default inbox
    settings, a service that acks and answers at once: every job ends done, every result
    is applied exactly once, and no envelope is dropped (before batching, 13,661 of
    24,000 were dropped at 12,000 files)."""
    n = 20_000
    service = await instant_service(nats_server.url())
    port = free_port()
    bridge = ArmProcess("bridge", bridge_env(db_url, nats_server.url(), port), tmp_path / "b.log")
    try:
        bridge.wait_healthy(port)
        with dict_conn(db_url) as conn:
            upload_many(conn, n, mixed=True)
            await wait_for(
                lambda: counts(conn).get("done", 0) == n,
                180,
                lambda: f"all done: {counts(conn)}, answered {service.answered}",
            )
            assert counts(conn) == {"done": n}
            assert (
                scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'")
                == n
            )
            assert (
                scalar(
                    conn,
                    "SELECT count(*) FROM arm.stored_file f JOIN arm.recognition_job j "
                    "ON j.id = f.current_recognition_job_id "
                    "WHERE j.status = 'done' AND f.status = 'PROCESSING'",
                )
                == n
            )
    finally:
        code = bridge.stop()
        await service.client.close()
    log = bridge.log()
    assert code == 0
    assert log_lines(log, action="inbox_drop") == []
    # One INFO line per batch: every ack and every result applied once, nothing else.
    batches = log_lines(log, action="inbox_batch")
    assert sum(int(line.split(" count=")[1].split()[0]) for line in batches) == 2 * n
    assert not [line for line in batches if "duplicate" in line or "already_final" in line]


async def test_the_inbox_waits_for_room_instead_of_dropping_while_the_database_is_up(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """A buffer of 5 and batches of 2 against 300 envelopes sent at once: the callback
    waits for room (the database is reachable), so nothing is dropped, and inbox steps
    of at most 2 apply them all."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(150)]
        publish(conn)
    feed = await inbox_feed(client, db_url, pool, inbox_buffer_size=5, inbox_batch_size=2)
    inbox = feed.inbox
    for up in ups:
        for status, kind in (("processing", "ack"), ("done", "result")):
            await feed.send(envelope(up.job_id, up.file_id, status), f"{kind}:{up.job_id}:1")
    delivering = asyncio.create_task(feed.deliver())
    try:
        # The callback has filled the buffer and waits for room: it neither returned
        # nor dropped the 6th envelope.
        await wait_for(lambda: inbox.buffered() == 5, 10, "the buffer filled")
        assert not delivering.done() and inbox.dropped() == 0
        steps: list[InboxStep] = []
        while not delivering.done() or inbox.buffered():
            if not inbox.buffered():  # the callback is between two messages
                await wait_for(lambda: inbox.buffered() > 0 or delivering.done(), 10, "more")
                continue
            steps.append(step := await inbox_step(inbox))
            assert 1 <= len(step.results) <= 2
        assert await delivering == 300
    finally:
        delivering.cancel()
    results = [r for step in steps for r in step.results]
    assert [r.outcome for r in results] == [APPLIED] * 300
    assert len(steps) >= 150  # they were batched, two at most at a time
    assert inbox.counts["applied"] == 300 and inbox.counts["batches"] == len(steps)
    assert inbox.dropped() == 0
    with dict_conn(db_url) as conn:
        assert counts(conn) == {"done": 150}


async def test_envelopes_beyond_the_buffer_are_dropped_counted_and_logged_in_an_outage(
    db_url: str,
    pg_server: EmbeddedPostgres,
    client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the database is unreachable an inbox step (one worker) holds its batch and
    the buffer takes 4 more; what arrives beyond that is dropped at once (the callback
    does not wait for a database that is gone), and each drop is counted and logged with
    its job id at DEBUG, the burst once at ERROR when it starts and at WARNING with its
    count when it ends. What was held is applied once the database is back, in order."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(10)]
        publish(conn)
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    caplog.set_level(logging.DEBUG, logger="arm_core")
    holding: asyncio.Task[InboxStep] | None = None
    try:
        async with step_pool(proxied, pool_timeout=1) as pool:
            feed = await inbox_feed(client, proxied, pool, inbox_buffer_size=4)
            inbox = feed.inbox
            proxy.block()
            await feed.put(envelope(ups[0].job_id, ups[0].file_id, "processing"), "ack:0")
            holding = asyncio.create_task(inbox_step(inbox))
            await wait_for(lambda: inbox.db_unreachable, 20, "outage noticed")
            for i, up in enumerate(ups[1:], 1):
                await feed.send(envelope(up.job_id, up.file_id, "processing"), f"ack:{i}")
            # None of them waits for room (a deadline, not a timing: it would wait forever).
            assert await asyncio.wait_for(feed.deliver(), 10) == 9
            assert inbox.dropped() == inbox.counts["dropped.buffer_full"] == 5
            assert inbox.buffered() == 4
            assert not holding.done() and inbox.counts["db_retries"] >= 1
            proxy.unblock()
            held = await asyncio.wait_for(holding, 30)
            rest = await inbox_step(inbox)
            await feed.put(envelope(ups[5].job_id, ups[5].file_id, "processing"), "ack:5b")
    finally:
        if holding is not None:
            holding.cancel()  # a no-op unless the test failed while it held
        await proxy.close()
    assert [(r.envelope.msg_id, r.outcome) for r in held.results] == [("ack:0", APPLIED)]
    assert held.deferred == ()
    assert [(r.envelope.msg_id, r.outcome) for r in rest.results] == [
        (f"ack:{i}", APPLIED) for i in range(1, 5)
    ]
    drops = logged(caplog.records, action="inbox_drop", reason="buffer_full")
    assert {str(r.job_id) for r in drops} == {str(up.job_id) for up in ups[5:]}
    assert {r.levelno for r in drops} == {logging.DEBUG}
    started, ended = logged(caplog.records, action="inbox_drops", reason="buffer_full")
    assert (started.levelno, started.state) == (logging.ERROR, "started")
    assert str(ups[5].job_id) in started.getMessage()
    assert (ended.levelno, ended.state, ended.count) == (logging.WARNING, "ended", 5)
    with dict_conn(db_url) as conn:
        assert [job(conn, up.job_id)["status"] for up in ups] == ["processing"] * 5 + [
            "published"
        ] * 5


async def test_a_batch_applies_the_good_envelopes_and_gives_each_bad_one_its_outcome(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """One inbox step, one batch: valid acks and results, an unknown job, a file
    mismatch, duplicates inside the batch, and a result that fails inside the database.
    The database rejects the batch as a whole; the inbox applies it again one by one: the
    valid ones are applied, each other one gets its own outcome, the failing one
    `failed`, each in the batch's order."""
    with dict_conn(db_url) as conn:
        ok1, ok2, bad = upload(conn), upload(conn), upload(conn)
        publish(conn)
        # A result file the database refuses: an error raised inside the inbox's insert.
        conn.execute(
            """
            CREATE FUNCTION public.refuse_key() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.key LIKE '%%/refused.json' THEN
                    RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'check_violation';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_key BEFORE INSERT ON arm.s3_object
                FOR EACH ROW EXECUTE FUNCTION public.refuse_key();
            """
        )
    refused = envelope(
        bad.job_id, bad.file_id, "done", result_s3={"bucket": "arm-ka", "key": "x/refused.json"}
    )
    error = {"code": "UNSUPPORTED_FORMAT", "message": "m"}
    batch = [
        (envelope(ok1.job_id, ok1.file_id, "processing"), f"ack:{ok1.job_id}:1"),
        (envelope(ok1.job_id, ok1.file_id, "processing"), f"ack:{ok1.job_id}:1"),
        (envelope(ok1.job_id, ok1.file_id, "done"), f"result:{ok1.job_id}:1"),
        (envelope(ok1.job_id, ok1.file_id, "done"), f"result:{ok1.job_id}:1"),
        (envelope(uuid.uuid4(), ok2.file_id, "done"), "result:unknown"),
        (envelope(ok2.job_id, uuid.uuid4(), "done"), "result:mismatch"),
        (refused, f"result:{bad.job_id}:1"),
        (envelope(ok2.job_id, ok2.file_id, "error", error=error), f"result:{ok2.job_id}:1"),
    ]
    caplog.set_level(logging.INFO, logger="arm_core")
    feed = await inbox_feed(client, db_url, pool)
    for body, msg_id in batch:
        await feed.send(body, msg_id)
    assert await feed.deliver() == len(batch)
    step = await feed.step()
    A = ApplyOutcome
    assert [(r.envelope.msg_id, r.outcome) for r in step.results] == [
        (f"ack:{ok1.job_id}:1", A.APPLIED),
        (f"ack:{ok1.job_id}:1", A.DUPLICATE),
        (f"result:{ok1.job_id}:1", A.APPLIED),
        (f"result:{ok1.job_id}:1", A.DUPLICATE),
        ("result:unknown", A.UNKNOWN_JOB),
        ("result:mismatch", A.FILE_MISMATCH),
        (f"result:{bad.job_id}:1", A.FAILED),
        (f"result:{ok2.job_id}:1", A.APPLIED),
    ]
    assert step.deferred == ()
    inbox = feed.inbox
    assert {o: n for o, n in inbox.counts.items() if o in {a.value for a in A}} == {
        "applied": 3,
        "duplicate": 2,
        "unknown_job": 1,
        "file_mismatch": 1,
        "failed": 1,
    }
    assert logged(caplog.records, action="inbox_split")
    [failed] = logged(caplog.records, outcome="failed")
    assert failed.job_id == bad.job_id and "refused by the test" in failed.getMessage()
    with dict_conn(db_url) as conn:
        assert job(conn, ok1.job_id)["status"] == "done"
        assert job(conn, ok1.job_id)["started_at"] is not None  # the ack came first
        assert job(conn, ok2.job_id)["status"] == "error"
        assert stored_file(conn, ok2.file_id)["status"] == "ERROR"
        assert job(conn, bad.job_id)["status"] == "published"
        assert scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'") == 1


async def test_results_postgresql_cannot_store_as_given_are_made_storable(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Schema-valid results with NUL in error.message, \\u0000 in metrics (key and value)
    and NaN/Infinity in metrics (Python's json.dumps writes them) are recorded, the
    offending parts removed or nulled, and the fact logged with the job id."""
    with dict_conn(db_url) as conn:
        err, nan = upload(conn), upload(conn)
        publish(conn)
    caplog.set_level(logging.INFO, logger="arm_core")
    feed = await inbox_feed(client, db_url, pool)
    with_nul = envelope(
        err.job_id,
        err.file_id,
        "error",
        error={"code": "UNSUPPORTED_FORMAT", "message": "broken\u0000 sheet"},
        metrics={"note\u0000": "a\u0000b"},
    )
    await feed.put(json.dumps(with_nul).encode(), f"result:{err.job_id}:1")
    not_finite = envelope(
        nan.job_id,
        nan.file_id,
        "done",
        metrics={"rows": float("nan"), "ratio": float("inf"), "ok": 1.5, "l": [float("-inf")]},
    )
    await feed.put(json.dumps(not_finite).encode(), f"result:{nan.job_id}:1")
    assert feed.inbox.counts["made_storable"] == 2  # by the callback, before the buffer
    step = await feed.step()
    assert outcomes(step) == [(APPLIED, JobStatus.ERROR), (APPLIED, JobStatus.DONE)]
    with dict_conn(db_url) as conn:
        e = job(conn, err.job_id)
        assert (e["status"], e["error_code"], e["error_message"]) == (
            "error",
            "UNSUPPORTED_FORMAT",
            "broken sheet",
        )
        assert e["metrics"] == {"note": "ab"}
        d = job(conn, nan.job_id)
        assert d["status"] == "done"
        assert d["metrics"] == {"rows": None, "ratio": None, "ok": 1.5, "l": [None]}
    sanitized = logged(caplog.records, action="inbox_sanitize")
    assert {r.job_id for r in sanitized} == {err.job_id, nan.job_id}


async def test_an_unpublishable_request_dead_letters_alone_and_the_rest_go_out_at_once(
    db_url: str,
    small_nats: EmbeddedNats,
    pool: AsyncConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The oldest queued job's request exceeds the server's max_payload: it goes to dlq
    with REQUEST_TOO_LARGE and its file to ERROR, while the 300 uploaded with it are
    published in the same publisher step — no waiting for the next one."""
    # Long, but within the upload bounds (1,024 characters of name and of key; the key
    # is "uploads/<uuid>/<name>"): about 4 KB of request in UTF-8.
    name = "Ж" * 965 + ".xlsx"
    with dict_conn(db_url) as conn, conn.transaction():
        big = upload(conn, name=name)
        upload_many(conn, 300)
    caplog.set_level(logging.INFO, logger="arm_core")
    listener = await nats_client(small_nats.url())
    try:
        seen = await receive(listener, "files.tabular_uploaded")
        # Unpaced: the step claims them all (paced, nobody answers: the floor).
        async with publisher(db_url, small_nats.url(), pool, pacing="off") as pub:
            cycle = await pub.run_once()
            # The server never saw the oversized message (it would have closed the
            # connection: "maximum payload exceeded").
            assert pub.nats.is_connected and pub.nats.stats["reconnects"] == 0
            counted = pub.counts
        await seen.take()
    finally:
        await listener.close()
    [dead] = cycle.unpublishable
    assert dead.job_id == big.job_id
    assert len(cycle.published) == 300 and big.job_id not in {p.job_id for p in cycle.published}
    assert sorted(seen.msg_ids()) == sorted(p.msg_id for p in cycle.published)
    assert counted["unpublishable"] == 1 and counted["failed_batches"] == cycle.failed_batches == 0
    with dict_conn(db_url) as conn:
        assert counts(conn) == {"published": 300, "dlq": 1}
        row = job(conn, big.job_id)
        assert row["status"] == "dlq" and row["error_code"] == "REQUEST_TOO_LARGE"
        assert "max_payload" in row["error_message"]
        assert row["published_at"] is None and row["finished_at"] is not None
        assert stored_file(conn, big.file_id)["status"] == "ERROR"
    [line] = logged(caplog.records, action="dlq", reason="REQUEST_TOO_LARGE")
    assert line.job_id == big.job_id


async def test_health_says_degraded_while_the_outbox_is_stuck_and_ok_after(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """A queued job that the publisher cannot take (another transaction holds its row)
    for longer than OUTBOX_STUCK_SECONDS while NATS is up: /healthcheck answers 200
    with status degraded and outbox "stuck: …"; once it is published, ok again."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
    settings = fast_settings(db_url, nats_server.url(), outbox_stuck_seconds=1)
    async with TestClient(TestServer(bridge_app(settings))) as http:

        async def health() -> dict[str, Any]:
            resp = await http.get("/healthcheck")
            assert resp.status == 200  # the process itself is fine
            body: dict[str, Any] = await resp.json()
            return body

        async def stuck() -> bool:
            return (await health())["outbox"] != "ok"

        with psycopg.connect(db_url) as holder:  # a long transaction holds the job's row
            holder.execute(
                "SELECT 1 FROM arm.recognition_job WHERE id = %s FOR UPDATE", (up.job_id,)
            )
            await wait_for(stuck, 15, "outbox reported stuck")
            body = await health()
            assert body["status"] == "degraded" and body["nats"] == "ok"
            assert body["outbox"].startswith("stuck: the oldest job ready to publish has waited")
        with dict_conn(db_url) as conn:
            await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 10)
        assert await health() == {
            "status": "ok",
            "db": "ok",
            "nats": "ok",
            "outbox": "ok",
            "version": installed(),
        }


async def test_an_early_answer_waits_as_busy_and_is_applied_after_the_commit(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """The early-ack race under batching: while another transaction holds the job (as a
    publisher does until its commit), the ack and the result that answer it come back
    `busy` and wait, in order, while the other job's envelopes in the same step are
    applied; the step after the commit applies both, the ack first."""
    with dict_conn(db_url) as conn:
        racing, other = upload(conn), upload(conn)
        publish(conn)
    feed = await inbox_feed(client, db_url, pool)
    with psycopg.connect(db_url) as holder:
        holder.execute(
            "SELECT 1 FROM arm.recognition_job WHERE id = %s FOR UPDATE", (racing.job_id,)
        )
        for up in (racing, other):
            await feed.put(envelope(up.job_id, up.file_id, "processing"), f"a:{up.job_id}")
            await feed.put(envelope(up.job_id, up.file_id, "done"), f"r:{up.job_id}")
        held = await feed.step()
        assert [(r.envelope.job_id, r.outcome) for r in held.results] == [
            (racing.job_id, ApplyOutcome.BUSY),
            (racing.job_id, ApplyOutcome.BUSY),
            (other.job_id, APPLIED),
            (other.job_id, APPLIED),
        ]
        assert [e.msg_id for e in held.deferred] == [f"a:{racing.job_id}", f"r:{racing.job_id}"]
        with dict_conn(db_url) as conn:
            assert job(conn, racing.job_id)["status"] == "published"
            assert job(conn, other.job_id)["status"] == "done"
    after = await feed.step()  # the holder has committed
    assert [(r.envelope.msg_id, r.outcome, r.status) for r in after.results] == [
        (f"a:{racing.job_id}", APPLIED, JobStatus.PROCESSING),
        (f"r:{racing.job_id}", APPLIED, JobStatus.DONE),
    ]
    assert after.deferred == ()
    assert feed.inbox.counts["applied"] == 4
    assert feed.inbox.counts["ignored"] == 0  # the ack was not overtaken by the result
    with dict_conn(db_url) as conn:
        assert job(conn, racing.job_id)["status"] == "done"
        assert job(conn, racing.job_id)["started_at"] is not None


async def test_an_answer_still_waiting_at_shutdown_is_counted_and_logged_as_lost(
    db_url: str,
    bridge_db_url: str,
    nats_server: EmbeddedNats,
    client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job held by another transaction past the shutdown grace: its answer, still
    `busy`, is never applied; the inbox counts it as dropped (shutdown) and logs it with
    its job id instead of losing it silently."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
    caplog.set_level(logging.DEBUG, logger="arm_core")
    pool = AsyncConnectionPool(bridge_db_url, open=False, min_size=1, kwargs={"autocommit": True})
    await pool.open()
    bridge = new_bridge(fast_settings(db_url, nats_server.url()), pool)
    try:
        await bridge.start()
        await wait_for(lambda: bridge.nats_state() == "ok", 10, "connected")
        with psycopg.connect(db_url) as holder:
            holder.execute(
                "SELECT 1 FROM arm.recognition_job WHERE id = %s FOR UPDATE", (up.job_id,)
            )
            await send(client, envelope(up.job_id, up.file_id, "processing"), f"a:{up.job_id}")
            await wait_for(lambda: bridge.inbox.counts["busy"] >= 1, 10, "busy")
            await bridge.stop(grace=1)
    finally:
        await pool.close()
    assert bridge.inbox.dropped() == bridge.inbox.counts["dropped.shutdown"] == 1
    [line] = logged(caplog.records, action="inbox_drop", reason="shutdown")
    assert line.job_id == up.job_id and line.levelno == logging.DEBUG
    started, ended = logged(caplog.records, action="inbox_drops", reason="shutdown")
    assert str(up.job_id) in started.getMessage() and started.levelno == logging.ERROR
    assert ended.count == 1
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "published"
