"""The outbox over a real nats-server (docs/behaviour.md#outbox, #ack): publish, NOTIFY
wake-up, NATS outages — among them the connection cut, or dropped and back, in the middle of
a batch — ack timeouts with republish and dead-lettering, a publish burst.

Most tests drive one publisher step (`Publisher.run_once`) and assert on the cycle it
returned, on what a real subscriber received and on the database. Three run the whole
bridge, because its loop is the point: NOTIFY waking the publisher, a job that joins a
busy queue found by the short poll, and a NATS outage noticed, logged and recovered from
on its own. The timed poll publishing alone, with no NOTIFY, is proved by a step test
(tests/bridge/test_steps.py) that runs the publisher's loop and nothing more."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from nats.aio.client import Client
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.publisher import Cycle
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import NatsProxy
from arm_core.devtools.testbed.services import collect, nats_client
from arm_core.devtools.testbed.sql import (
    dict_conn,
    fail_by_no_ack,
    job,
    publish,
    retry,
    scalar,
    stored_file,
    upload,
    upload_many,
)
from tests.support.bridge import fast_settings, running_bridge
from tests.support.steps import Received, publisher, receive, step_pool

pytestmark = pytest.mark.integration


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with step_pool(db_url) as pool:
        yield pool


@pytest.fixture
async def nats_proxy(nats_server: EmbeddedNats) -> AsyncIterator[NatsProxy]:
    """The publisher's way to nats-server, which counts the messages it publishes and
    can cut its connection at one of them; the test's own client connects directly."""
    assert nats_server.port is not None
    proxy = await NatsProxy(nats_server.port).start()
    try:
        yield proxy
    finally:
        await proxy.close()


def proxied(proxy: NatsProxy) -> str:
    return f"nats://127.0.0.1:{proxy.port}"


def jobs_by_id(db_url: str) -> dict[uuid.UUID, dict[str, Any]]:
    with dict_conn(db_url) as conn:
        rows = conn.execute(
            "SELECT id, status::text AS status, request_msg_id, published_at, republish_count "
            "FROM arm.recognition_job"
        ).fetchall()
    return {r["id"]: r for r in rows}


async def at_the_server(requests: Received, n: int) -> list[str]:
    """The Nats-Msg-Ids of what the server routed to `requests`, once there are `n`."""

    async def arrived() -> bool:
        await requests.take()
        return len(requests.messages) >= n

    await wait_for(arrived, 10, lambda: f"{n} requests at the server: {requests.msg_ids()}")
    await requests.take()
    return requests.msg_ids()


async def test_S_OUT_1_a_publisher_step_publishes_a_queued_xlsx_job(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """S-OUT-1: a message on files.tabular_uploaded passes the request schema, carries
    job_id, file_id, s3.key, reply_deadline, attempt 1; the row is published. One step
    does it (the loop runs one at least every OUTBOX_POLL_SECONDS, and at once on NOTIFY:
    test_notify_wakes_the_publisher_long_before_the_poll)."""
    requests = await receive(client)
    with dict_conn(db_url) as conn:
        up = upload(conn, "XLSX")
    async with publisher(db_url, nats_server.url(), pool) as pub:
        cycle = await pub.run_once()
    [sent] = cycle.published
    assert (sent.job_id, sent.file_id, sent.attempt) == (up.job_id, up.file_id, 1)
    assert (sent.msg_id, sent.subject) == (f"{up.job_id}:1", "files.tabular_uploaded")
    assert cycle.failed_batches == 0 and cycle.unpublishable == ()

    await requests.take()
    requests.assert_valid_requests()
    [body] = requests.bodies()
    assert body["job_id"] == str(up.job_id) and body["file_id"] == str(up.file_id)
    assert body["s3"]["key"] == up.key
    assert body["attempt"] == 1 and body["reply_deadline"]
    assert requests.msg_ids() == [f"{up.job_id}:1"]
    with dict_conn(db_url) as conn:
        row = job(conn, up.job_id)
    assert row["status"] == "published"
    assert row["request_msg_id"] == f"{up.job_id}:1"
    assert row["request_subject"] == "files.tabular_uploaded"


async def test_notify_wakes_the_publisher_long_before_the_poll(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """A plain INSERT wakes the publisher through NOTIFY; polling (here every 60 s) is
    only the backstop."""
    requests = await collect(client, "files.img_uploaded")
    settings = fast_settings(db_url, nats_server.url(), outbox_poll_seconds=60)
    async with running_bridge(settings) as bridge:
        await wait_for(lambda: bridge.publisher.counts["cycles"] > 0, 5)
        with dict_conn(db_url) as conn:
            up = upload(conn, "PNG")
            await wait_for(lambda: len(requests.messages) == 1, 10, "woken by NOTIFY")
            await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 10, "committed")
    requests.assert_valid_requests()


NO_NOTIFY = "ALTER TABLE arm.recognition_job DISABLE TRIGGER tg_recognition_job__inserted"


def disable_notify(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        conn.execute(NO_NOTIFY)


async def test_a_job_that_joins_the_queue_while_others_go_out_is_not_left_to_the_poll(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """A job committed while the publisher is busy with others sends no NOTIFY (the queue
    was not empty); the publisher's short polling after a cycle that claimed jobs
    finds it, long before the timed poll (here every 60 s)."""
    requests = await collect(client, "files.tabular_uploaded")
    # Unpaced: paced, the second job would wait for the first one's answer, not the poll.
    settings = fast_settings(db_url, nats_server.url(), outbox_poll_seconds=60, pacing="off")
    async with running_bridge(settings) as bridge:
        # Short polling for 30 s after a claim (1 s by default): the test's own steps
        # may take longer than a second on a loaded machine.
        bridge.publisher.config = replace(bridge.publisher.config, active_seconds=30)
        await wait_for(lambda: bridge.publisher.counts["cycles"] > 0, 5)
        with dict_conn(db_url) as conn:
            first = upload(conn)  # into an empty queue: NOTIFY wakes the publisher
            await wait_for(lambda: len(requests.messages) == 1, 10, "woken by NOTIFY")
            # What a job behind others gets: no notification. Off the event loop: the ALTER
            # waits for the publisher's open transaction, which needs the loop to commit.
            await asyncio.to_thread(disable_notify, db_url)
            second = upload(conn)
            await wait_for(lambda: len(requests.messages) == 2, 10, "found by the short poll")
            await wait_for(
                lambda: (
                    {job(conn, j)["status"] for j in (first.job_id, second.job_id)} == {"published"}
                ),
                10,
                "both committed",
            )
    requests.assert_valid_requests()


async def test_S_OUT_2_nats_down_jobs_stay_queued_then_publish(
    db_url: str, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """S-OUT-2: NATS unreachable → the job stays queued and the error is logged; when
    NATS returns, the next cycle publishes it (and never marked it published before)."""
    caplog.set_level(logging.INFO)
    settings = fast_settings(db_url, nats_server.url())
    async with running_bridge(settings) as bridge:
        bridge.publisher.config = replace(bridge.publisher.config, nats_grace_seconds=0.5)
        await asyncio.to_thread(nats_server.stop)
        await wait_for(lambda: not bridge.nats.is_connected, 10, "bridge saw NATS go")
        with dict_conn(db_url) as conn:
            up = upload(conn)
            cycles = bridge.publisher.counts["cycles"]
            # Several publisher cycles pass while NATS is down; the job stays queued.
            await wait_for(lambda: "NATS unreachable" in caplog.text, 10, "error logged")
            await wait_for(lambda: bridge.publisher.counts["cycles"] > cycles, 5)
            assert job(conn, up.job_id)["status"] == "queued"

            await asyncio.to_thread(nats_server.start)  # same port
            listener = await nats_client(nats_server.url())
            try:
                requests = await collect(listener, "files.tabular_uploaded")
                await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 15)
                await wait_for(lambda: len(requests.messages) >= 1, 5, "request after outage")
            finally:
                await listener.close()
    assert f"{up.job_id}:1" in requests.msg_ids()
    requests.assert_valid_requests()


async def test_S_OUT_2_nats_cut_after_part_of_a_batch_marks_none_of_it_published(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], nats_proxy: NatsProxy
) -> None:
    """S-OUT-2 where it matters: the publisher's connection to nats-server is cut after
    4 of a batch's 10 messages went out, and it cannot reconnect. The server has those
    4, but the publisher could not confirm the batch: the step reports it failed, and
    every job it claimed is still queued — none marked published, not even the 4 whose
    request arrived (they go out again with the same Nats-Msg-Id once NATS is back)."""
    requests = await receive(client)  # on nats-server itself, not through the proxy
    with dict_conn(db_url) as conn:
        upload_many(conn, 10)
    before = jobs_by_id(db_url)
    # Unpaced: one claim takes the whole batch (paced, nobody answers: the floor).
    async with publisher(
        db_url, proxied(nats_proxy), pool, outbox_batch_size=10, pacing="off"
    ) as pub:
        nats_proxy.cut_after(4)
        cycle = await pub.run_once()
        connected = pub.nats.is_connected
        counted = pub.counts

    assert cycle.failed_batches == 1
    assert cycle.published == cycle.unpublishable == ()
    assert not connected and counted["failed_batches"] == 1 and counted["published"] == 0
    assert nats_proxy.published == 4
    arrived = await at_the_server(requests, 4)
    assert len(arrived) == 4 and set(arrived) <= {f"{job_id}:1" for job_id in before}
    assert jobs_by_id(db_url) == before  # all queued, no msg id, never published
    assert {j["status"] for j in before.values()} == {"queued"}


async def test_S_OUT_2_connection_dropped_and_back_mid_batch_then_published_once_more(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], nats_proxy: NatsProxy
) -> None:
    """The connection drops after 4 of a batch's 10 messages and comes back at once
    (the publisher reconnects through the same way): the batch still fails — what it
    had sent before the drop cannot be confirmed on the new connection — and its jobs
    stay queued. The next step publishes all ten and marks them published; the 4 that
    reached the server twice carry the same Nats-Msg-Id both times, a repeat to the
    service."""
    requests = await receive(client)
    with dict_conn(db_url) as conn:
        upload_many(conn, 10)
    before = jobs_by_id(db_url)
    # Unpaced: one claim takes the whole batch (paced, nobody answers: the floor).
    async with publisher(
        db_url, proxied(nats_proxy), pool, outbox_batch_size=10, pacing="off"
    ) as pub:
        nats_proxy.cut_after(4, reconnect=True)
        failed = await pub.run_once()
        after_failure = jobs_by_id(db_url)
        await wait_for(lambda: pub.nats.is_connected, 15, "the publisher reconnected")
        reconnects = pub.nats.stats["reconnects"]
        again = await pub.run_once()

    assert failed.failed_batches == 1 and failed.published == ()
    assert after_failure == before
    # Once through the proxy; once more when the confirming PING went unanswered on the
    # cut connection (confirm() starts over rather than keep nats-py's stale PING).
    assert reconnects in (1, 2)
    assert again.failed_batches == 0 and len(again.published) == 10
    assert {p.job_id for p in again.published} == set(before)
    assert nats_proxy.published == 14
    arrived = Counter(await at_the_server(requests, 14))
    assert arrived.keys() == {p.msg_id for p in again.published}
    assert sorted(arrived.values()) == [1] * 6 + [2] * 4
    requests.assert_valid_requests()
    assert {(j["status"], j["request_msg_id"]) for j in jobs_by_id(db_url).values()} == {
        ("published", f"{p.job_id}:1") for p in again.published
    }


async def test_S_ACK_2_republished_every_ack_timeout_then_dlq(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """S-ACK-2: nobody acks → the request goes out again every ACK_TIMEOUT_SECONDS with
    the same Nats-Msg-Id and attempt, OUTBOX_MAX_REPUBLISH times; then dlq/NO_ACK,
    request_msg_id unchanged, file ERROR. A publisher with ACK_TIMEOUT_SECONDS=30 publishes
    and, the job not yet overdue, republishes nothing; then one with
    ACK_TIMEOUT_SECONDS=0 (the time has passed: every step checks, and the job is
    overdue again after every republish) takes it from there."""
    requests = await receive(client, "files.tabular_uploaded")
    with dict_conn(db_url) as conn:
        up = upload(conn)
    msg_id = f"{up.job_id}:1"

    def republish_count() -> int:
        with dict_conn(db_url) as conn:
            count: int = job(conn, up.job_id)["republish_count"]
        return count

    async with publisher(
        db_url, nats_server.url(), pool, ack_timeout_seconds=30, outbox_max_republish=3
    ) as pub:
        first = await pub.run_once()
    [published] = first.published
    assert published.msg_id == msg_id
    assert first.ack_checked and first.republished == first.dead_lettered == ()
    assert len(await requests.take()) == 1 and republish_count() == 0

    async with publisher(
        db_url, nats_server.url(), pool, ack_timeout_seconds=0, outbox_max_republish=3
    ) as pub:
        for n in (1, 2, 3):
            cycle = await pub.run_once()
            [again] = cycle.republished
            assert (again.job_id, again.msg_id, again.attempt) == (up.job_id, msg_id, 1)
            assert again.republish_count == n - 1  # before this republish
            assert again.request == published.request  # byte for byte the same request
            assert cycle.ack_checked and cycle.dead_lettered == () and cycle.published == ()
            assert republish_count() == n
            assert len(await requests.take()) == 1
        last = await pub.run_once()
        after = await pub.run_once()

    [dead] = last.dead_lettered
    assert (dead.job_id, dead.file_id, dead.attempt) == (up.job_id, up.file_id, 1)
    assert dead.republish_count == 3
    assert last.republished == () and last.published == ()
    assert after.dead_lettered == after.republished == after.published == ()
    assert await requests.take() == []  # nothing after the third republish
    assert requests.msg_ids() == [msg_id] * 4  # first publish + 3 republishes
    assert len({m.data for m in requests.messages}) == 1  # the same request every time
    requests.assert_valid_requests()
    with dict_conn(db_url) as conn:
        row, f = job(conn, up.job_id), stored_file(conn, up.file_id)
    assert (row["status"], row["error_code"]) == ("dlq", "NO_ACK")
    assert row["request_msg_id"] == msg_id
    assert row["republish_count"] == 3
    assert f["status"] == "ERROR"


async def test_S_RT_3_retry_while_nats_is_down_publishes_after_it_returns(
    db_url: str, nats_server: EmbeddedNats, pool: AsyncConnectionPool[Any]
) -> None:
    """S-RT-3: a retry accepted while NATS is down stays queued (a step without NATS
    tries nothing); once NATS is back the next step publishes it with a fresh deadline
    and a new Nats-Msg-Id."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        old = job(conn, up.job_id)
    async with publisher(db_url, nats_server.url(), pool) as pub:
        await asyncio.to_thread(nats_server.stop)
        await wait_for(lambda: not pub.nats.is_connected, 10, "the publisher saw NATS go")
        with dict_conn(db_url) as conn:
            new_id = retry(conn, up.file_id)["job_id"]
        down = await pub.run_once()
        assert down == Cycle(nats_connected=False)
        with dict_conn(db_url) as conn:
            assert job(conn, new_id)["status"] == "queued"

        await asyncio.to_thread(nats_server.start)  # same port
        await wait_for(lambda: pub.nats.is_connected, 15, "the publisher reconnected")
        listener = await nats_client(nats_server.url())
        try:
            requests = await receive(listener, "files.tabular_uploaded")
            back = await pub.run_once()
            await requests.take()
        finally:
            await listener.close()

    [sent] = back.published
    assert (sent.job_id, sent.attempt, sent.msg_id) == (new_id, 2, f"{new_id}:2")
    assert requests.msg_ids() == [f"{new_id}:2"]
    requests.assert_valid_requests()
    with dict_conn(db_url) as conn:
        new = job(conn, new_id)
    assert new["status"] == "published"
    assert new["request_msg_id"] == f"{new_id}:2" != old["request_msg_id"]
    assert new["reply_deadline"] > old["reply_deadline"]
    assert new["published_at"] > old["finished_at"]


async def test_publish_burst_arrives_exactly_once_in_few_transactions(
    db_url: str, nats_server: EmbeddedNats, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """3,000 queued jobs: one publisher step publishes them all, every request arrives
    exactly once, in batches of OUTBOX_BATCH_SIZE (one transaction each), not one
    transaction per job."""
    requests = await receive(client)
    n = 3000
    with dict_conn(db_url) as conn:
        upload_many(conn, n, mixed=True)
        queued = {r["id"] for r in conn.execute("SELECT id FROM arm.recognition_job")}
    # Unpaced: the step publishes every queued job (paced, nobody answers: the floor).
    async with publisher(
        db_url, nats_server.url(), pool, outbox_batch_size=500, pacing="off"
    ) as pub:
        cycle = await pub.run_once()
        again = await pub.run_once()
        batches, publishers = pub.counts["batches"], pub.config.settings.outbox_publishers

    assert cycle.failed_batches == 0 and cycle.unpublishable == ()
    assert {p.job_id for p in cycle.published} == queued and len(cycle.published) == n
    assert again.published == ()
    await requests.take()
    ids = Counter(requests.msg_ids())
    assert ids.keys() == {p.msg_id for p in cycle.published}
    assert set(ids.values()) == {1}
    # Full batches, plus at most one partial batch per publisher in flight.
    assert n // 500 <= batches <= n // 500 + publishers
    requests.assert_valid_requests()
    with dict_conn(db_url) as conn:
        assert (
            scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'published'") == n
        )
