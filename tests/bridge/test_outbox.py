"""The outbox over a real nats-server (SPEC §5, §6): publish, NOTIFY wake-up, NATS
outages, ack timeouts with republish and dead-lettering, a publish burst."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from nats.aio.client import Client

from arm_core.devtools.embedded import EmbeddedNats
from tests.support.bridge import collect, fast_settings, running_bridge, wait_for
from tests.support.sql import (
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

pytestmark = pytest.mark.integration


async def test_S_OUT_1_queued_xlsx_job_is_published_within_10_s(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """S-OUT-1: a message on files.tabular_uploaded passes the request schema, carries
    job_id, file_id, s3.key, reply_deadline, attempt 1; the row is published."""
    requests = await collect(client, "files.tabular_uploaded")
    async with running_bridge(fast_settings(db_url, nats_server.url())):
        with dict_conn(db_url) as conn:
            up = upload(conn, "XLSX")
            await wait_for(lambda: len(requests.messages) == 1, 10, "request published")
            await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 5)
            row = job(conn, up.job_id)
    requests.assert_valid_requests()
    [body] = requests.bodies()
    assert body["job_id"] == str(up.job_id) and body["file_id"] == str(up.file_id)
    assert body["s3"]["key"] == up.key
    assert body["attempt"] == 1 and body["reply_deadline"]
    assert requests.msg_ids() == [f"{up.job_id}:1"]
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
        await wait_for(lambda: bridge.publisher.stats.last_cycle_at is not None, 5)
        with dict_conn(db_url) as conn:
            up = upload(conn, "PNG")
            await wait_for(lambda: len(requests.messages) == 1, 10, "woken by NOTIFY")
            assert job(conn, up.job_id)["status"] == "published"
    requests.assert_valid_requests()


async def test_S_OUT_2_nats_down_jobs_stay_queued_then_publish(
    db_url: str, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """S-OUT-2: NATS unreachable → the job stays queued and the error is logged; when
    NATS returns, the next cycle publishes it (and never marked it published before)."""
    caplog.set_level(logging.INFO)
    settings = fast_settings(db_url, nats_server.url())
    async with running_bridge(settings) as bridge:
        bridge.publisher.nats_grace_seconds = 0.5
        nats_server.stop()
        await wait_for(lambda: not bridge.nats.is_connected, 10, "bridge saw NATS go")
        with dict_conn(db_url) as conn:
            up = upload(conn)
            cycles = bridge.publisher.stats.last_cycle_at
            # Several publisher cycles pass while NATS is down; the job stays queued.
            await wait_for(lambda: "NATS unreachable" in caplog.text, 10, "error logged")
            await wait_for(lambda: bridge.publisher.stats.last_cycle_at != cycles, 5)
            assert job(conn, up.job_id)["status"] == "queued"

            nats_server.start()  # same port
            from tests.support.bridge import nats_client

            listener = await nats_client(nats_server.url())
            try:
                requests = await collect(listener, "files.tabular_uploaded")
                await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 15)
                await wait_for(lambda: len(requests.messages) >= 1, 5, "request after outage")
            finally:
                await listener.close()
    assert f"{up.job_id}:1" in requests.msg_ids()
    requests.assert_valid_requests()


async def test_S_ACK_2_republished_every_ack_timeout_then_dlq(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """S-ACK-2: nobody acks → the request goes out again every ACK_TIMEOUT_SECONDS with
    the same Nats-Msg-Id and attempt, OUTBOX_MAX_REPUBLISH times; then dlq/NO_ACK,
    request_msg_id unchanged, file ERROR."""
    requests = await collect(client, "files.tabular_uploaded")
    settings = fast_settings(
        db_url,
        nats_server.url(),
        ack_timeout_seconds=0.4,
        outbox_max_republish=3,
        outbox_poll_seconds=0.1,
    )
    async with running_bridge(settings):
        with dict_conn(db_url) as conn:
            up = upload(conn)
            await wait_for(lambda: job(conn, up.job_id)["status"] == "dlq", 15, "dead-lettered")
            row, f = job(conn, up.job_id), stored_file(conn, up.file_id)
    assert requests.msg_ids() == [f"{up.job_id}:1"] * 4  # first publish + 3 republishes
    assert len({m.data for m in requests.messages}) == 1  # the same request every time
    requests.assert_valid_requests()
    assert row["error_code"] == "NO_ACK"
    assert row["request_msg_id"] == f"{up.job_id}:1"
    assert row["republish_count"] == 3
    assert f["status"] == "ERROR"


async def test_S_RT_3_retry_while_nats_is_down_publishes_after_it_returns(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """S-RT-3: a retry accepted while NATS is down stays queued; once NATS is back it is
    published with a fresh deadline and a new Nats-Msg-Id."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        old = job(conn, up.job_id)
    settings = fast_settings(db_url, nats_server.url())
    async with running_bridge(settings) as bridge:
        nats_server.stop()
        await wait_for(lambda: not bridge.nats.is_connected, 10)
        with dict_conn(db_url) as conn:
            new_id = retry(conn, up.file_id)["job_id"]
            cycles = bridge.publisher.stats.last_cycle_at
            await wait_for(lambda: bridge.publisher.stats.last_cycle_at != cycles, 5)
            assert job(conn, new_id)["status"] == "queued"

            nats_server.start()
            await wait_for(lambda: job(conn, new_id)["status"] == "published", 15)
            new = job(conn, new_id)
    assert new["request_msg_id"] == f"{new_id}:2" != old["request_msg_id"]
    assert new["reply_deadline"] > old["reply_deadline"]
    assert new["published_at"] > old["finished_at"]


async def test_publish_burst_arrives_exactly_once_in_few_transactions(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """3,000 queued jobs: every request arrives exactly once, in batches of
    OUTBOX_BATCH_SIZE (one transaction each), not one transaction per job."""
    tabular = await collect(client, "files.tabular_uploaded")
    image = await collect(client, "files.img_uploaded")
    n = 3000
    with dict_conn(db_url) as conn:
        upload_many(conn, n, mixed=True)
    settings = fast_settings(db_url, nats_server.url(), outbox_batch_size=500)
    async with running_bridge(settings) as bridge:
        with dict_conn(db_url) as conn:
            await wait_for(
                lambda: (
                    scalar(
                        conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'published'"
                    )
                    == n
                ),
                60,
                "all published",
            )
        await wait_for(lambda: len(tabular.messages) + len(image.messages) >= n, 10)
        await client.flush()
        batches = bridge.publisher.stats.batches
    ids = Counter(tabular.msg_ids() + image.msg_ids())
    assert len(ids) == n
    assert set(ids.values()) == {1}
    # Full batches, plus at most one partial batch per publisher in flight.
    assert n // 500 <= batches <= n // 500 + settings.outbox_publishers
    tabular.assert_valid_requests()
    image.assert_valid_requests()
