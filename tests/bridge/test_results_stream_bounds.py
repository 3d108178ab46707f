"""RESULTS_STREAM's bounds, on a real nats-server with JetStream and a real PostgreSQL:
the stream holds only the answers not yet applied (interest retention), refuses new
ones when RESULTS_STREAM_MAX_BYTES is reached (discard new) instead of removing one,
and lets a service's re-ack to a republished request through (a duplicate window
shorter than ACK_TIMEOUT_SECONDS)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck, StreamConfig
from nats.js.errors import ServiceUnavailableError

from arm_core.bridge.nats_client import ensure_results_stream, results_consumer
from arm_core.config import Settings
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from tests.support.bridge import (
    TcpProxy,
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
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "contracts" / "examples"
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


async def stored(js: JetStreamContext) -> int:
    return (await js.stream_info(STREAM)).state.messages


async def test_the_stream_is_bounded_and_keeps_only_what_is_not_applied(
    db_url: str, js_server: EmbeddedNats, js_client: Client
) -> None:
    """Created with RESULTS_STREAM_MAX_BYTES, discard new, interest retention and the
    duplicate window derived from ACK_TIMEOUT_SECONDS; an applied answer and a
    terminated one leave the stream."""
    jobs = published_jobs(db_url, 20)
    settings = stream_settings(db_url, js_server.url(), results_stream_max_bytes=8 << 20)
    async with running_bridge(settings) as bridge:
        js = js_client.jetstream()
        config = (await js.stream_info(STREAM)).config
        assert (config.retention, config.discard, config.max_bytes) == (
            "interest",
            "new",
            8 << 20,
        )
        assert config.duplicate_window == 10.0  # a third of ACK_TIMEOUT_SECONDS (30)
        for row in jobs:
            await js_ack(js, row)
        await js.publish(SUBJECT, b"not json", headers={"Nats-Msg-Id": "garbage:1"})
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, PROCESSING) == 20, 30, "acks applied")
        await wait_for(lambda: bridge.inbox.counts["terminated"] == 1, 30, "garbage terminated")

        async def emptied() -> bool:
            return await stored(js) == 0

        await wait_for(emptied, 30, "applied and terminated answers gone from the stream")
        assert bridge.inbox.counts["acked"] == 20


async def test_a_full_stream_refuses_jetstream_publishes_and_loses_nothing(
    db_url: str, pg_server: EmbeddedPostgres, js_server: EmbeddedNats, js_client: Client
) -> None:
    """The database is unreachable, so no answer is applied and the stream fills up to
    its RESULTS_STREAM_MAX_BYTES: the next JetStream publish is refused ("maximum bytes
    exceeded", a 503 the service retries), a core NATS publish is not stored (and its
    job goes without that answer). Once the database is back every stored answer is
    applied, the stream empties, and the refused answer, sent again, is stored and
    applied: nothing the stream accepted is lost."""
    jobs = published_jobs(db_url, 200)
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    settings = stream_settings(proxied, js_server.url(), results_stream_max_bytes=16 * 1024)
    try:
        async with running_bridge(settings) as bridge:
            js = js_client.jetstream()
            proxy.block()
            accepted: list[dict[str, Any]] = []
            refused: ServiceUnavailableError | None = None
            for row in jobs:
                try:
                    await js_ack(js, row)
                except ServiceUnavailableError as exc:
                    refused = exc
                    break
                accepted.append(row)
            assert refused is not None, "the stream took every answer: no byte limit"
            assert "maximum bytes exceeded" in str(refused)
            assert 10 < len(accepted) < len(jobs) - 2
            refused_row, core_row = jobs[len(accepted)], jobs[len(accepted) + 1]
            data, headers = ack(core_row)
            await js_client.publish(SUBJECT, data, headers=headers)  # core NATS
            await js_client.flush()
            assert await stored(js) == len(accepted)
            with dict_conn(db_url) as conn:  # direct, not through the proxy
                assert scalar(conn, PROCESSING) == 0
            assert bridge.inbox.counts["db_retries"] >= 1
            proxy.unblock()
            with dict_conn(db_url) as conn:
                await wait_for(
                    lambda: scalar(conn, PROCESSING) == len(accepted),
                    60,
                    lambda: f"{len(accepted)} stored acks applied ({scalar(conn, PROCESSING)})",
                )

                async def emptied() -> bool:
                    return await stored(js) == 0

                await wait_for(emptied, 30, "the applied answers gone from the stream")
                stored_again = await js_ack(js, refused_row)  # the service's retry
                assert not stored_again.duplicate
                await wait_for(
                    lambda: scalar(conn, PROCESSING) == len(accepted) + 1,
                    30,
                    "the retried ack applied",
                )
                status = "SELECT status FROM arm.recognition_job WHERE id = %s"
                assert scalar(conn, status, (core_row["job_id"],)) == "published"
    finally:
        await proxy.close()


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


async def test_a_jobs_answers_take_under_a_kibibyte_of_the_stream(
    js_server: EmbeddedNats, js_client: Client
) -> None:
    """docs/capacity.md sizes the stream at 1 KiB a job: the contract's example ack and
    `done` result, as compact JSON with their Nats-Msg-Id, take less as the stream
    counts bytes."""
    js = js_client.jetstream()
    await js.add_stream(StreamConfig(name="SIZES", subjects=[SUBJECT]))
    total = 0
    for name, kind in (("result-processing.json", "ack"), ("result-done.json", "result")):
        body = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Nats-Msg-Id": f"{kind}:{body['job_id']}:1"}
        await js.publish(SUBJECT, data, headers=headers)
        total = (await js.stream_info("SIZES")).state.bytes
    assert 0 < total < 1024, total
