"""The bridge's steps, driven one at a time: Publisher.run_once,
Inbox.run_once and Scheduler.run_once against a real PostgreSQL and a real nats-server,
each asserted on what it returns and on what it left in the database. Nothing here runs
the bridge's loops, so nothing waits for a poll or a tick; and nothing waits for a
message either (tests/support/steps.py: a flush proves a subscription has it all)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from nats.aio.client import Client
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.scheduler import Scheduler
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import envelope, nats_client
from arm_core.devtools.testbed.sql import dict_conn, job, publish, stored_file, upload
from arm_core.rows import TaskRun
from arm_core.statuses import ApplyOutcome, JobStatus, PublishOutcome
from arm_core.store import Store
from tests.support.bridge import fast_settings
from tests.support.steps import NO_NATS, inbox_feed, inbox_step, publisher, receive, step_pool

pytestmark = pytest.mark.integration


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with step_pool(db_url) as pool:
        yield pool


async def test_a_publisher_step_publishes_the_queued_jobs_and_they_arrive(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    tabular = await receive(client, "files.tabular_uploaded")
    image = await receive(client, "files.img_uploaded")
    with dict_conn(db_url) as conn:
        ups = [upload(conn, "XLSX"), upload(conn, "PDF"), upload(conn, "XLSB")]
    # Unpaced: one step publishes every queued job (paced, each pipeline starts at its
    # floor of one; tests/integration/test_pacing.py has the paced claim).
    async with publisher(db_url, nats_server.url(), pool, pacing="off") as pub:
        cycle = await pub.run_once()
        again = await pub.run_once()

    assert cycle.nats_connected and cycle.failed_batches == 0
    assert [p.job_id for p in cycle.published] == [u.job_id for u in ups]  # oldest first
    assert {p.outcome for p in cycle.published} == {PublishOutcome.PUBLISHED}
    assert cycle.unpublishable == ()
    # The ack-timeout steps ran (the first cycle is always due) and found nothing.
    assert cycle.ack_checked and cycle.dead_lettered == () and cycle.republished == ()
    assert again.published == () and again.failed_batches == 0

    with dict_conn(db_url) as conn:
        for p in cycle.published:
            row = job(conn, p.job_id)
            assert row["status"] == "published"
            assert (row["request_msg_id"], row["request_subject"]) == (p.msg_id, p.subject)
    assert (len(await tabular.take()), len(await image.take())) == (2, 1)
    tabular.assert_valid_requests()
    image.assert_valid_requests()
    sent = {p.msg_id: p for p in cycle.published}
    for msg in tabular.messages + image.messages:
        p = sent[(msg.headers or {})["Nats-Msg-Id"]]
        assert msg.subject == p.subject
        assert p.request is not None and json.loads(msg.data) == json.loads(p.request)
    assert [m.subject for m in image.messages] == ["files.img_uploaded"]


async def test_a_publisher_step_sends_nothing_until_the_answers_way_back_is_open(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """With RESULTS_STREAM (interest retention) an answer that reaches the stream before
    the bridge's durable consumer exists is dropped at once, and its job would end
    `timeout`: until the consumer is made the publisher claims nothing; then it
    publishes as usual."""
    tabular = await receive(client, "files.tabular_uploaded")
    with dict_conn(db_url) as conn:
        up = upload(conn, "XLSX")
    async with publisher(db_url, nats_server.url(), pool) as pub:
        pub.answers_open = False
        held = await pub.run_once()
        with dict_conn(db_url) as conn:
            assert job(conn, up.job_id)["status"] == "queued"
        pub.answers_open = True
        cycle = await pub.run_once()

    assert held.nats_connected and not held.answers_open and held.published == ()
    assert cycle.answers_open and [p.job_id for p in cycle.published] == [up.job_id]
    assert len(await tabular.take()) == 1


async def test_a_publisher_step_dead_letters_a_request_too_large_for_the_server(
    db_url: str, small_nats: EmbeddedNats, pool: AsyncConnectionPool[Any]
) -> None:
    listener = await nats_client(small_nats.url())
    try:
        seen = await receive(listener, "files.tabular_uploaded")
        with dict_conn(db_url) as conn:
            big = upload(conn, name="Ж" * 965 + ".xlsx")  # about 4 KB of request
            small = [upload(conn), upload(conn)]
        async with publisher(db_url, small_nats.url(), pool, pacing="off") as pub:  # all three
            cycle = await pub.run_once()
        assert len(await seen.take()) == 2  # the two that fit
    finally:
        await listener.close()

    [dead] = cycle.unpublishable
    assert (dead.job_id, dead.outcome, dead.request) == (big.job_id, PublishOutcome.DLQ, None)
    assert dead.error_message is not None and "max_payload" in dead.error_message
    assert [p.job_id for p in cycle.published] == [u.job_id for u in small]
    assert cycle.failed_batches == 0
    assert pub.counts["unpublishable"] == 1
    assert sorted(seen.msg_ids()) == sorted(p.msg_id for p in cycle.published)
    with dict_conn(db_url) as conn:
        row = job(conn, big.job_id)
        assert (row["status"], row["error_code"]) == ("dlq", "REQUEST_TOO_LARGE")
        assert row["published_at"] is None and row["finished_at"] is not None
        assert stored_file(conn, big.file_id)["status"] == "ERROR"


async def test_publisher_steps_republish_an_unacked_job_then_dead_letter_it(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """ACK_TIMEOUT_SECONDS=0: every cycle runs the ack-timeout steps and every published
    job is overdue at once; OUTBOX_MAX_REPUBLISH=1."""
    requests = await receive(client, "files.tabular_uploaded")
    with dict_conn(db_url) as conn:
        up = upload(conn)
    async with publisher(
        db_url, nats_server.url(), pool, ack_timeout_seconds=0, outbox_max_republish=1
    ) as pub:
        first = await pub.run_once()
        second = await pub.run_once()

    [published] = first.published
    [republished] = first.republished
    assert published.job_id == republished.job_id == up.job_id
    assert republished.msg_id == published.msg_id and republished.republish_count == 0
    assert republished.request == published.request  # byte for byte the same request
    assert first.ack_checked and first.dead_lettered == ()

    assert second.published == () and second.republished == () and second.ack_checked
    [dead] = second.dead_lettered
    assert (dead.job_id, dead.file_id, dead.attempt) == (up.job_id, up.file_id, 1)
    assert dead.republish_count == 1
    with dict_conn(db_url) as conn:
        row = job(conn, up.job_id)
        assert (row["status"], row["error_code"], row["republish_count"]) == ("dlq", "NO_ACK", 1)
        assert stored_file(conn, up.file_id)["status"] == "ERROR"
    await requests.take()
    assert requests.msg_ids() == [f"{up.job_id}:1"] * 2  # the publish and the republish


async def test_an_inbox_step_applies_a_batch_of_acks_and_results(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    with dict_conn(db_url) as conn:
        done, failed = upload(conn), upload(conn)
        publish(conn)
        queued = upload(conn)
    feed = await inbox_feed(client, db_url, pool)
    inbox = feed.inbox
    error = {"code": "UNSUPPORTED_FORMAT", "message": "not a balance sheet"}
    for body, msg_id in [
        (envelope(done.job_id, done.file_id, "processing"), f"ack:{done.job_id}:1"),
        (envelope(done.job_id, done.file_id, "done"), f"result:{done.job_id}:1"),
        (envelope(done.job_id, done.file_id, "done"), f"result:{done.job_id}:1"),
        (envelope(failed.job_id, failed.file_id, "processing"), f"ack:{failed.job_id}:1"),
        (envelope(failed.job_id, failed.file_id, "error", error=error), "result:f:1"),
        (envelope(uuid.uuid4(), done.file_id, "done"), "result:nobody:1"),
        (envelope(queued.job_id, queued.file_id, "processing"), f"ack:{queued.job_id}:1"),
    ]:
        await feed.send(body, msg_id)
    assert await feed.deliver() == 7 and inbox.buffered() == 7
    step = await inbox_step(inbox)
    empty = await inbox_step(inbox)

    A = ApplyOutcome
    assert [(r.outcome, r.status) for r in step.results] == [
        (A.APPLIED, JobStatus.PROCESSING),
        (A.APPLIED, JobStatus.DONE),
        (A.DUPLICATE, JobStatus.DONE),
        (A.APPLIED, JobStatus.PROCESSING),
        (A.APPLIED, JobStatus.ERROR),
        (A.UNKNOWN_JOB, None),
        (A.NOT_PUBLISHED, JobStatus.QUEUED),
    ]
    assert [r.attempt for r in step.results] == [1, 1, 1, 1, 1, None, 1]
    assert [r.envelope.job_id for r in step.results][:2] == [done.job_id, done.job_id]
    assert step.deferred == ()
    assert step.outcomes() == Counter(
        {A.APPLIED: 4, A.DUPLICATE: 1, A.UNKNOWN_JOB: 1, A.NOT_PUBLISHED: 1}
    )
    # The duplicate and the unknown job are ignored; the answer for the job still queued
    # waits for its publish (a young answer: its patience has not run out).
    counts = inbox.counts
    assert (counts["batches"], counts["applied"], counts["ignored"]) == (1, 4, 2)
    assert counts["not_published_waits"] == 1
    assert empty.results == () and inbox.buffered() == 0
    with dict_conn(db_url) as conn:
        assert job(conn, done.job_id)["status"] == "done"
        assert job(conn, done.job_id)["started_at"] is not None  # the ack came first
        assert stored_file(conn, done.file_id)["status"] == "PROCESSING"
        assert (job(conn, failed.job_id)["status"], job(conn, failed.job_id)["error_code"]) == (
            "error",
            "UNSUPPORTED_FORMAT",
        )
        assert stored_file(conn, failed.file_id)["status"] == "ERROR"
        assert job(conn, queued.job_id)["status"] == "queued"


async def test_an_inbox_step_keeps_busy_envelopes_to_lead_the_next_one(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """An envelope whose job another transaction holds comes back `busy`, is not
    applied, and leads the worker's next batch, ahead of what arrived after it."""
    with dict_conn(db_url) as conn:
        held, free = upload(conn), upload(conn)
        publish(conn)
    feed = await inbox_feed(client, db_url, pool)
    inbox = feed.inbox
    await feed.put(envelope(held.job_id, held.file_id, "processing"), f"ack:{held.job_id}:1")
    await feed.put(envelope(free.job_id, free.file_id, "processing"), f"ack:{free.job_id}:1")
    with dict_conn(db_url) as locker, locker.transaction():
        locker.execute("SELECT 1 FROM arm.recognition_job WHERE id = %s FOR UPDATE", (held.job_id,))
        step = await inbox_step(inbox)
    assert [r.outcome for r in step.results] == [ApplyOutcome.BUSY, ApplyOutcome.APPLIED]
    assert [e.job_id for e in step.deferred] == [held.job_id]

    await feed.put(envelope(held.job_id, held.file_id, "done"), f"result:{held.job_id}:1")
    after = await inbox_step(inbox)
    assert [(r.envelope.status, r.outcome) for r in after.results] == [
        (JobStatus.PROCESSING, ApplyOutcome.APPLIED),  # the held ack first
        (JobStatus.DONE, ApplyOutcome.APPLIED),
    ]
    assert after.deferred == ()
    with dict_conn(db_url) as conn:
        row = job(conn, held.job_id)
        assert row["status"] == "done" and row["started_at"] is not None
        assert job(conn, free.job_id)["status"] == "processing"


@pytest.mark.parametrize("patience", [90.0, 0.0], ids=["kept", "without-patience"])
async def test_answers_for_a_job_still_queued_wait_for_its_publish(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], patience: float
) -> None:
    """The answers to a request whose publishing transaction rolled back after the send
    (its publisher lost the database, or was killed, between the send and the commit)
    find the job still `queued`: they are kept, not ignored, and applied once the job is
    published again — the service answers a repeated request with its ack only, so the
    result would otherwise be lost and the job time out. Without patience they are
    ignored, as the database says (`not_published`)."""
    with dict_conn(db_url) as conn:
        up = upload(conn)  # queued: the rolled-back publish left it so
    feed = await inbox_feed(client, db_url, pool)
    inbox = feed.inbox
    inbox.config = dataclasses.replace(
        inbox.config, not_published_retry_seconds=0.0, not_published_patience_seconds=patience
    )
    await feed.put(envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
    await feed.put(envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
    first = await feed.step()
    assert first.outcomes() == Counter({ApplyOutcome.NOT_PUBLISHED: 2})
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "queued"
        publish(conn)  # published again, with the same Nats-Msg-Id and attempt
    again = await feed.step()
    with dict_conn(db_url) as conn:
        status = job(conn, up.job_id)["status"]
    if patience:
        assert inbox.counts["not_published_waits"] == 2
        assert again.outcomes() == Counter({ApplyOutcome.APPLIED: 2}) and status == "done"
    else:
        assert again.results == () and status == "published"
        assert inbox.counts["not_published"] == 2 and inbox.held() == 0


async def test_an_inbox_step_that_meets_a_starved_pool_holds_its_batch_until_it_frees(
    db_url: str, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Every connection of the pool in use (a schedule tick waiting on a DBA's lock
    holds the only one): the batch waits for a connection, backs off and tries again,
    whole — not split, not failed, and the database not taken for unreachable (so what
    arrives meanwhile waits for room instead of being dropped). Once the connection is
    given back, the same step applies it."""
    caplog.set_level(logging.DEBUG, logger="arm_core")
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
    async with step_pool(db_url, pool_timeout=0.3, max_size=1) as pool:
        feed = await inbox_feed(client, db_url, pool)
        inbox, store = feed.inbox, feed.inbox.store
        await feed.put(envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
        await feed.put(envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
        with dict_conn(db_url) as locker:
            locker.execute("BEGIN")
            locker.execute("LOCK TABLE arm.periodic_task IN ACCESS EXCLUSIVE MODE")
            tick = asyncio.ensure_future(store.run_due_tasks())
            await wait_for(lambda: store.pool_figures.in_use == 1, 10, "the tick holds it")
            step = asyncio.ensure_future(inbox_step(inbox))
            await wait_for(lambda: inbox.counts["db_retries"] >= 2, 10, "the batch held twice")
            assert not step.done() and inbox.db_unreachable is False
            with dict_conn(db_url) as conn:
                assert job(conn, up.job_id)["status"] == "published"
            locker.execute("COMMIT")
            await tick
            applied = await step
    assert [(r.outcome, r.status) for r in applied.results] == [
        (ApplyOutcome.APPLIED, JobStatus.PROCESSING),
        (ApplyOutcome.APPLIED, JobStatus.DONE),
    ]
    assert inbox.counts["batches"] == 1
    assert inbox.db_unreachable is False
    held = [r for r in caplog.records if getattr(r, "action", None) == "inbox_hold"]
    assert held and all("DATABASE_POOL_MAX_SIZE" in r.getMessage() for r in held)
    assert not [r for r in caplog.records if getattr(r, "action", None) == "inbox_split"]
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "done"


async def test_one_inbox_step_takes_every_worker_and_keeps_each_jobs_order(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """INBOX_WORKERS=3: a job's envelopes share one worker's buffer (chosen by job id), so
    a step over every worker (run_once without a worker) applies them all, one batch per
    worker that had any, and each job's ack before its result although all the acks
    arrived before all the results."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(12)]
        publish(conn)
    feed = await inbox_feed(client, db_url, pool, inbox_workers=3)
    for status, kind in (("processing", "ack"), ("done", "result")):
        for up in ups:
            await feed.send(envelope(up.job_id, up.file_id, status), f"{kind}:{up.job_id}:1")
    assert await feed.deliver() == 24
    for n, queue in enumerate(feed.inbox.queues):
        mine = [up for up in ups if up.job_id.int % 3 == n]
        assert len(queue) == 2 * len(mine)
    busy_workers = sum(bool(q) for q in feed.inbox.queues)

    step = await feed.step()
    assert step.outcomes() == Counter({ApplyOutcome.APPLIED: 24})
    assert feed.inbox.counts["batches"] == busy_workers and feed.inbox.buffered() == 0
    order = [(r.envelope.job_id, r.status) for r in step.results]
    for up in ups:
        assert order.index((up.job_id, JobStatus.PROCESSING)) < order.index(
            (up.job_id, JobStatus.DONE)
        )
    with dict_conn(db_url) as conn:
        for up in ups:
            row = job(conn, up.job_id)
            assert row["status"] == "done" and row["started_at"] is not None


async def test_a_schedule_tick_runs_the_sweep_when_it_is_due(
    db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn, tabular_timeout=0)  # its reply deadline is now
        conn.execute(
            "UPDATE arm.periodic_task SET next_run_at = clock_timestamp() + interval '1 hour'"
        )
    scheduler = Scheduler(BridgeConfig(fast_settings(db_url, NO_NATS)), Store(pool))

    assert await scheduler.run_once() == []  # nothing due
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "published"
        conn.execute(
            "UPDATE arm.periodic_task SET next_run_at = clock_timestamp() "
            "WHERE name = 'sweep_timeouts'"
        )
    assert await scheduler.run_once() == [TaskRun("sweep_timeouts", "1", None)]
    assert await scheduler.run_once() == []  # the next run is a period away

    with dict_conn(db_url) as conn:
        row = job(conn, up.job_id)
        assert (row["status"], row["error_code"]) == ("timeout", "TIMEOUT")
        assert stored_file(conn, up.file_id)["status"] == "ERROR"
        task = conn.execute(
            "SELECT run_count, last_result FROM arm.periodic_task WHERE name = 'sweep_timeouts'"
        ).fetchone()
    assert task == {"run_count": 1, "last_result": "1"}


async def test_the_first_tick_sets_the_sweep_period_only_when_it_was_given(
    db_url: str, pool: AsyncConnectionPool[Any]
) -> None:
    """TIMEOUT_SWEEP_SECONDS, when given, is the sweep's period in arm.periodic_task,
    written by the schedule's first tick; otherwise the period a DBA set there stands."""

    def period() -> float:
        with dict_conn(db_url) as conn:
            [row] = conn.execute(
                "SELECT extract(epoch FROM run_every) AS seconds FROM arm.periodic_task "
                "WHERE name = 'sweep_timeouts'"
            ).fetchall()
        return float(row["seconds"])

    with dict_conn(db_url) as conn:  # a DBA's period
        conn.execute(
            "UPDATE arm.periodic_task SET run_every = interval '45 s' WHERE name = 'sweep_timeouts'"
        )
    defaulted = fast_settings(db_url, NO_NATS)
    assert "TIMEOUT_SWEEP_SECONDS" not in defaulted.explicit
    await Scheduler(BridgeConfig(defaulted), Store(pool)).run_once()
    assert period() == 45
    given = Scheduler(
        BridgeConfig(fast_settings(db_url, NO_NATS, timeout_sweep_seconds=12)), Store(pool)
    )
    await given.run_once()
    assert period() == 12
    with dict_conn(db_url) as conn:  # set once: a later tick leaves a DBA's change alone
        conn.execute(
            "UPDATE arm.periodic_task SET run_every = interval '45 s' WHERE name = 'sweep_timeouts'"
        )
    await given.run_once()
    assert period() == 45


async def test_an_overdue_request_too_large_to_republish_is_dead_lettered_once(
    db_url: str,
    small_nats: EmbeddedNats,
    pool: AsyncConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every overdue job ends: at most OUTBOX_MAX_REPUBLISH republishes, then dlq. A job published
    before the server's max_payload was lowered cannot go out again: it is dead-lettered
    at its first overdue check (REQUEST_TOO_LARGE, file ERROR), logged once, while an
    overdue job that fits is republished in the same batch."""
    caplog.set_level(logging.INFO)
    with dict_conn(db_url) as conn:
        big = upload(conn, name="Ж" * 965 + ".xlsx")  # about 4 KB of request: it went out
        fits = upload(conn)  # when max_payload was 1 MB
        publish(conn)
        conn.execute("UPDATE arm.recognition_job SET last_published_at = now() - interval '1 hour'")
    async with publisher(db_url, small_nats.url(), pool, ack_timeout_seconds=1) as pub:
        first = await pub.run_once()
        again = await pub.run_once()
    assert [j.job_id for j in first.republished] == [fits.job_id]
    assert again.republished == () and again.dead_lettered == ()
    assert pub.counts["unpublishable"] == 1
    with dict_conn(db_url) as conn:
        row = job(conn, big.job_id)
        assert (row["status"], row["error_code"]) == ("dlq", "REQUEST_TOO_LARGE")
        assert "max_payload 3072" in row["error_message"] and row["finished_at"] is not None
        assert stored_file(conn, big.file_id)["status"] == "ERROR"
        assert job(conn, fits.job_id)["republish_count"] == 1
    said = [r for r in caplog.records if getattr(r, "reason", None) == "REQUEST_TOO_LARGE"]
    assert len(said) == 1 and said[0].levelno == logging.ERROR


async def test_the_schedule_hands_the_waits_the_steps_observed_to_the_database(
    db_url: str, nats_server: EmbeddedNats, pool: AsyncConnectionPool[Any]
) -> None:
    """The console's wait chart: the publisher's queued waits go, at the schedule's tick,
    to arm.record_waits as the bridge's login; nothing twice, and nothing lost when the
    database fails (kept for the next time)."""
    with dict_conn(db_url) as conn:
        for _ in range(3):
            upload(conn)
    async with publisher(db_url, nats_server.url(), pool, pacing="off") as pub:  # all three
        assert len((await pub.run_once()).published) == 3
    # The process's metrics, as a bridge hands them to both.
    scheduler = Scheduler(
        BridgeConfig(fast_settings(db_url, NO_NATS)), Store(pool), metrics=pub.metrics
    )
    stored = await scheduler.record_waits(force=True)
    assert stored is not None and set(stored) == {"queued"} and sum(stored["queued"]) == 3
    assert await scheduler.record_waits() is None  # not due again within WAIT_SAMPLE
    assert await scheduler.record_waits(force=True) == {}  # nothing new: no call
    with dict_conn(db_url) as conn:
        rows = conn.execute("SELECT phase, counts FROM arm.wait_sample").fetchall()
    assert [(r["phase"], sum(r["counts"])) for r in rows] == [("queued", 3)]

    scheduler.metrics.waited("ack", 0.2)
    await pool.close()  # the database is gone for this store
    assert await scheduler.record_waits(force=True) is None
    assert scheduler.metrics.waits.take() == {
        "ack": [0, 0, 0, 1] + [0] * 13
    }  # given back, in its bucket


async def test_the_timed_poll_alone_publishes_when_no_notify_wakes_the_publisher(
    db_url: str, nats_server: EmbeddedNats, pool: AsyncConnectionPool[Any]
) -> None:
    """NOTIFY is the wake-up, the poll every OUTBOX_POLL_SECONDS the backstop: with no
    listener at all (nothing sets `wake`), a job uploaded while the loop sleeps goes out
    at the loop's next timed cycle."""
    client = await nats_client(nats_server.url())
    try:
        seen = await receive(client, "files.tabular_uploaded")
        async with publisher(db_url, nats_server.url(), pool, outbox_poll_seconds=0.5) as pub:
            stopping = asyncio.Event()
            loop = asyncio.create_task(pub.run(stopping))
            try:
                await wait_for(lambda: pub.counts["cycles"] >= 1, 10, "the first cycle")
                with dict_conn(db_url) as conn:
                    up = upload(conn)  # its NOTIFY reaches nobody
                await wait_for(partial(published, db_url, up.job_id), 10, "a timed cycle")
                assert not pub.wake.is_set() and pub.counts["cycles"] >= 2
            finally:
                stopping.set()
                await loop
        assert len(await seen.take()) == 1 and seen.msg_ids() == [f"{up.job_id}:1"]
        seen.assert_valid_requests()
    finally:
        await client.close()


def published(db_url: str, job_id: uuid.UUID) -> bool:
    with dict_conn(db_url) as conn:
        return bool(job(conn, job_id)["status"] == "published")
