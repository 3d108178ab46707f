"""The data path under load and with bad input (issue 8): a burst through a real
`arm-core bridge` loses nothing, the inbox waits instead of dropping while the database is
up, a batch with bad envelopes still applies the good ones, results PostgreSQL cannot store
as given are made storable, and one unpublishable request never holds back the rest."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.client import Client
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.envelope import Envelope, parse_envelope
from arm_core.bridge.inbox import Inbox
from arm_core.bridge.runner import Bridge
from arm_core.devtools.embedded import EmbeddedNats, EmbeddedPostgres, free_port
from arm_core.runtime import bridge_app
from arm_core.statuses import ApplyOutcome
from tests.bridge.test_processes import bridge_env
from tests.support.bridge import (
    TcpProxy,
    collect,
    envelope,
    fast_settings,
    instant_service,
    logged,
    nats_client,
    running_bridge,
    send,
    wait_for,
)
from tests.support.processes import ArmProcess, log_lines
from tests.support.sql import dict_conn, job, publish, scalar, stored_file, upload, upload_many

pytestmark = pytest.mark.integration


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
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """A buffer of 5 and batches of 2 against 300 envelopes sent at once: the callback
    waits for room (the database is reachable), so nothing is dropped and all apply."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(150)]
        publish(conn)
    settings = fast_settings(db_url, nats_server.url(), inbox_buffer_size=5, inbox_batch_size=2)
    async with running_bridge(settings) as bridge:
        for up in ups:
            for status, kind in (("processing", "ack"), ("done", "result")):
                await client.publish(
                    "files.tabular_parsed",
                    json.dumps(envelope(up.job_id, up.file_id, status)).encode(),
                    headers={"Nats-Msg-Id": f"{kind}:{up.job_id}:1"},
                )
        await client.flush()
        await wait_for(lambda: bridge.inbox.stats.applied == 300, 60, "all applied")
        assert not bridge.inbox.stats.dropped
        assert bridge.inbox.stats.batches < 300  # they were batched
    with dict_conn(db_url) as conn:
        assert counts(conn) == {"done": 150}


async def test_envelopes_beyond_the_buffer_are_dropped_counted_and_logged_in_an_outage(
    db_url: str,
    pg_server: EmbeddedPostgres,
    nats_server: EmbeddedNats,
    client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the database is unreachable the inbox (one worker) holds a batch and a buffer
    of 4; what
    arrives beyond that is dropped, and each drop is counted and logged with its job id.
    What was held is applied once the database is back."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(10)]
        publish(conn)
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    caplog.set_level(logging.INFO, logger="arm_core")
    try:
        settings = fast_settings(proxied, nats_server.url(), inbox_buffer_size=4, inbox_workers=1)
        async with running_bridge(settings) as bridge:
            proxy.block()
            await send(client, envelope(ups[0].job_id, ups[0].file_id, "processing"), "ack:0")
            await wait_for(lambda: bridge.inbox.db_unreachable, 20, "outage noticed")
            for i, up in enumerate(ups[1:], 1):
                await send(client, envelope(up.job_id, up.file_id, "processing"), f"ack:{i}")
            await wait_for(lambda: bridge.inbox.stats.dropped["buffer_full"] == 5, 10)
            proxy.unblock()
            await wait_for(lambda: bridge.inbox.stats.applied == 5, 30, "held ones applied")
    finally:
        await proxy.close()
    drops = logged(caplog.records, action="inbox_drop", reason="buffer_full")
    assert {str(r.job_id) for r in drops} == {str(up.job_id) for up in ups[5:]}
    with dict_conn(db_url) as conn:
        assert [job(conn, up.job_id)["status"] for up in ups] == ["processing"] * 5 + [
            "published"
        ] * 5


def _parsed(body: dict[str, Any] | bytes, msg_id: str) -> Envelope:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    parsed = parse_envelope(data, {"Nats-Msg-Id": msg_id}, 1 << 20)
    assert isinstance(parsed, Envelope), parsed
    return parsed


async def test_a_batch_applies_the_good_envelopes_and_gives_each_bad_one_its_outcome(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One batch: valid acks and results, an unknown job, a file mismatch, duplicates
    inside the batch, and a result that fails inside the database. The database rejects
    the batch as a whole; the inbox applies it again one by one: the valid ones are
    applied, each other one gets its own outcome, the failing one `failed`."""
    with dict_conn(db_url) as conn:
        ok1, ok2, bad = upload(conn), upload(conn), upload(conn)
        publish(conn)
        # A result file the database refuses: an error raised inside apply_result's insert.
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
    batch = [
        _parsed(envelope(ok1.job_id, ok1.file_id, "processing"), f"ack:{ok1.job_id}:1"),
        _parsed(envelope(ok1.job_id, ok1.file_id, "processing"), f"ack:{ok1.job_id}:1"),
        _parsed(envelope(ok1.job_id, ok1.file_id, "done"), f"result:{ok1.job_id}:1"),
        _parsed(envelope(ok1.job_id, ok1.file_id, "done"), f"result:{ok1.job_id}:1"),
        _parsed(envelope(uuid.uuid4(), ok2.file_id, "done"), "result:unknown"),
        _parsed(envelope(ok2.job_id, uuid.uuid4(), "done"), "result:mismatch"),
        _parsed(refused, f"result:{bad.job_id}:1"),
        _parsed(
            envelope(
                ok2.job_id,
                ok2.file_id,
                "error",
                error={"code": "UNSUPPORTED_FORMAT", "message": "m"},
            ),
            f"result:{ok2.job_id}:1",
        ),
    ]
    caplog.set_level(logging.INFO, logger="arm_core")
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, min_size=1) as pool:
        inbox = Inbox(fast_settings(db_url, "nats://127.0.0.1:1"), pool)
        await inbox._apply_until_done(batch, asyncio.Event())
    assert inbox.stats.outcomes == {
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
    db_url: str, nats_server: EmbeddedNats, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Schema-valid results with NUL in error.message, \\u0000 in metrics (key and value)
    and NaN/Infinity in metrics (Python's json.dumps writes them) are recorded, the
    offending parts removed or nulled, and the fact logged with the job id."""
    with dict_conn(db_url) as conn:
        err, nan = upload(conn), upload(conn)
        publish(conn)
    caplog.set_level(logging.INFO, logger="arm_core")
    async with running_bridge(fast_settings(db_url, nats_server.url())) as bridge:
        with_nul = envelope(
            err.job_id,
            err.file_id,
            "error",
            error={"code": "UNSUPPORTED_FORMAT", "message": "broken\u0000 sheet"},
            metrics={"note\u0000": "a\u0000b"},
        )
        await send(client, json.dumps(with_nul).encode(), f"result:{err.job_id}:1")
        not_finite = envelope(
            nan.job_id,
            nan.file_id,
            "done",
            metrics={"rows": float("nan"), "ratio": float("inf"), "ok": 1.5, "l": [float("-inf")]},
        )
        await send(client, json.dumps(not_finite).encode(), f"result:{nan.job_id}:1")
        await wait_for(lambda: bridge.inbox.stats.applied == 2, 10, "both applied")
        assert bridge.inbox.stats.made_storable == 2
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


@pytest.fixture
def small_nats(tmp_path: Path) -> Any:
    """A nats-server that takes messages of at most 3 KiB (max_payload)."""
    config = tmp_path / "small.conf"
    config.write_text("max_payload: 3072\n")
    server = EmbeddedNats(log_dir=tmp_path / "small-nats", extra_args=["-c", str(config)]).start()
    try:
        yield server
    finally:
        server.stop()


async def test_an_unpublishable_request_dead_letters_alone_and_the_rest_go_out_at_once(
    db_url: str, small_nats: EmbeddedNats, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The oldest queued job's request exceeds the server's max_payload: it goes to dlq
    with REQUEST_TOO_LARGE and its file to ERROR, while the 300 uploaded with it are
    published in the same cycle — no waiting for OUTBOX_POLL_SECONDS (here an hour)."""
    # Long, but within the upload bounds (1,024 characters of name and of key; the key
    # is "uploads/<uuid>/<name>"): about 4 KB of request in UTF-8.
    name = "Ж" * 965 + ".xlsx"
    with dict_conn(db_url) as conn, conn.transaction():
        big = upload(conn, name=name)
        upload_many(conn, 300)
    caplog.set_level(logging.INFO, logger="arm_core")
    listener = await nats_client(small_nats.url())
    seen = await collect(listener, "files.tabular_uploaded")
    settings = fast_settings(db_url, small_nats.url(), outbox_poll_seconds=3600)
    try:
        async with running_bridge(settings) as bridge:
            await wait_for(lambda: len(seen.messages) == 300, 20, "the others published")
            with dict_conn(db_url) as conn:
                assert counts(conn) == {"published": 300, "dlq": 1}
                dead = job(conn, big.job_id)
                assert dead["status"] == "dlq" and dead["error_code"] == "REQUEST_TOO_LARGE"
                assert "max_payload" in dead["error_message"]
                assert dead["published_at"] is None and dead["finished_at"] is not None
                assert stored_file(conn, big.file_id)["status"] == "ERROR"
            assert bridge.publisher.stats.unpublishable == 1
            assert bridge.publisher.stats.failed_batches == 0
            assert bridge.nats_state() == "ok"  # the server never saw the oversized message
    finally:
        await listener.close()
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
            assert body["outbox"].startswith("stuck: the oldest queued job has waited")
        with dict_conn(db_url) as conn:
            await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 10)
        assert await health() == {"status": "ok", "db": "ok", "nats": "ok", "outbox": "ok"}


async def test_an_early_answer_waits_as_busy_and_is_applied_after_the_commit(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """The early-ack race under batching, through the bridge: while another transaction
    holds the job (as a publisher does until its commit), the ack and the result that
    answer it come back `busy` and wait, in order, while other envelopes are applied;
    after the commit both are applied, the ack first."""
    with dict_conn(db_url) as conn:
        racing, other = upload(conn), upload(conn)
        publish(conn)
    async with running_bridge(fast_settings(db_url, nats_server.url())) as bridge:
        with psycopg.connect(db_url) as holder:
            holder.execute(
                "SELECT 1 FROM arm.recognition_job WHERE id = %s FOR UPDATE", (racing.job_id,)
            )
            for up in (racing, other):
                await send(client, envelope(up.job_id, up.file_id, "processing"), f"a:{up.job_id}")
                await send(client, envelope(up.job_id, up.file_id, "done"), f"r:{up.job_id}")
            await wait_for(lambda: bridge.inbox.stats.applied == 2, 10, "the other job applied")
            assert bridge.inbox.stats.outcomes[ApplyOutcome.BUSY] >= 2
            with dict_conn(db_url) as conn:
                assert job(conn, racing.job_id)["status"] == "published"
                assert job(conn, other.job_id)["status"] == "done"
        await wait_for(lambda: bridge.inbox.stats.applied == 4, 10, "applied after the commit")
        assert bridge.inbox.stats.ignored == 0  # the ack was not overtaken by the result
    with dict_conn(db_url) as conn:
        assert job(conn, racing.job_id)["status"] == "done"
        assert job(conn, racing.job_id)["started_at"] is not None


async def test_an_answer_still_waiting_at_shutdown_is_counted_and_logged_as_lost(
    db_url: str, nats_server: EmbeddedNats, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A job held by another transaction past the shutdown grace: its answer, still
    `busy`, is never applied; the inbox counts it as dropped (shutdown) and logs it with
    its job id instead of losing it silently."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
    caplog.set_level(logging.INFO, logger="arm_core")
    pool = AsyncConnectionPool(db_url, open=False, min_size=1, kwargs={"autocommit": True})
    await pool.open()
    bridge = Bridge(fast_settings(db_url, nats_server.url()), pool)
    try:
        await bridge.start()
        await wait_for(lambda: bridge.nats_state() == "ok", 10, "connected")
        with psycopg.connect(db_url) as holder:
            holder.execute(
                "SELECT 1 FROM arm.recognition_job WHERE id = %s FOR UPDATE", (up.job_id,)
            )
            await send(client, envelope(up.job_id, up.file_id, "processing"), f"a:{up.job_id}")
            await wait_for(lambda: bridge.inbox.stats.outcomes[ApplyOutcome.BUSY] >= 1, 10, "busy")
            await bridge.stop(grace=1)
    finally:
        await pool.close()
    assert bridge.inbox.stats.dropped == {"shutdown": 1}
    [line] = logged(caplog.records, action="inbox_drop", reason="shutdown")
    assert line.job_id == up.job_id
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "published"
