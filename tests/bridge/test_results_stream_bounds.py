"""RESULTS_STREAM's duplicate window and republished requests, on a real nats-server
with JetStream and a real PostgreSQL: a service's re-ack to a republished request keeps
the first ack's Nats-Msg-Id, and the window is shorter than ACK_TIMEOUT_SECONDS, so the
stream stores it and the core applies it or calls it a duplicate."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck

from arm_core.bridge.nats_client import ensure_results_stream, results_consumer
from arm_core.config import Settings
from arm_core.devtools.embedded_nats import EmbeddedNats
from tests.support.bridge import (
    envelope,
    fast_settings,
    nats_client,
    running_bridge,
    wait_for,
)
from tests.support.sql import dict_conn, publish, scalar, upload_many

pytestmark = pytest.mark.integration

STREAM = "ARM_RESULTS"
SUBJECT = "files.tabular_parsed"
PROCESSING = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"


@pytest.fixture
async def js_client(js_server: EmbeddedNats) -> AsyncIterator[Client]:
    nc = await nats_client(js_server.url())
    try:
        yield nc
    finally:
        await nc.close()


def stream_settings(db_url: str, url: str, **more: Any) -> Settings:
    return fast_settings(db_url, url, results_stream=STREAM, **more)


def published_jobs(db_url: str, n: int) -> list[dict[str, Any]]:
    with dict_conn(db_url) as conn:
        upload_many(conn, n)
        assert len(publish(conn)) == n
        return conn.execute(
            "SELECT id AS job_id, file_id FROM arm.recognition_job ORDER BY id"
        ).fetchall()


def ack(row: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """A job's ack as a service sends it: the body and its Nats-Msg-Id."""
    body = envelope(row["job_id"], row["file_id"], "processing")
    return json.dumps(body).encode(), {"Nats-Msg-Id": f"ack:{row['job_id']}:1"}


async def js_ack(js: JetStreamContext, row: dict[str, Any]) -> PubAck:
    """The ack published through JetStream, as the service contract asks."""
    data, headers = ack(row)
    return await js.publish(SUBJECT, data, headers=headers, timeout=5)


async def test_a_re_ack_after_the_duplicate_window_is_stored_and_called_duplicate(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    """A service acks a republished request with the first ack's Nats-Msg-Id. Within
    the duplicate window the stream drops it; once the window has passed (1 s here,
    shorter than ACK_TIMEOUT_SECONDS as the settings require) it stores it, and the
    core calls the second copy `duplicate`."""
    [row] = published_jobs(db_url, 1)
    settings = stream_settings(db_url, js_server.url(), results_stream_duplicate_window_seconds=1.0)
    async with running_bridge(settings) as bridge:
        js = js_client.jetstream()
        assert not (await js_ack(js, row)).duplicate
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, PROCESSING) == 1, 30, "the first ack applied")
        # The re-ack, sent again until the stream stores it (a PubAck not a duplicate).
        acks: list[PubAck] = []

        async def re_ack_stored() -> bool:
            acks.append(await js_ack(js, row))
            return not acks[-1].duplicate

        await wait_for(re_ack_stored, 30, "a re-ack with the same Nats-Msg-Id stored")
        await wait_for(lambda: bridge.inbox.counts["duplicate"] == 1, 30, "called duplicate")
        assert bridge.inbox.counts["acked"] == 2


async def test_a_re_ack_reaches_the_core_while_the_first_copy_is_held_elsewhere(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    """The production case: the first ack sits unacked with another bridge (here the
    test, fetching from the shared durable consumer and holding the message). The
    service's re-ack to the republished request, after the window, is stored and the
    running bridge applies it at once — it does not wait for the first copy to come
    back after the consumer's ack wait."""
    [row] = published_jobs(db_url, 1)
    settings = stream_settings(db_url, js_server.url(), results_stream_duplicate_window_seconds=1.0)
    nc = await nats_client(js_server.url())
    try:
        js = await ensure_results_stream(nc, settings)
        other_bridge = await results_consumer(js, settings)
        assert not (await js_ack(js, row)).duplicate
        [held] = await other_bridge.fetch(1, timeout=5)
        async with running_bridge(settings) as bridge:

            async def re_ack_stored() -> bool:
                return not (await js_ack(js, row)).duplicate

            await wait_for(re_ack_stored, 30, "a re-ack with the same Nats-Msg-Id stored")
            with dict_conn(db_url) as conn:
                await wait_for(lambda: scalar(conn, PROCESSING) == 1, 30, "the re-ack applied")
            assert bridge.inbox.counts["applied"] == 1
            assert bridge.inbox.counts["redelivered"] == 0  # not the first copy again
        assert held.metadata.num_delivered == 1
        await held.ack_sync()
    finally:
        await nc.close()
