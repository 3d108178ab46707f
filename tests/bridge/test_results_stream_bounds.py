"""RESULTS_STREAM's bounds, on a real nats-server with JetStream and a real PostgreSQL:
the stream holds only the answers not yet applied (interest retention), refuses new
ones when RESULTS_STREAM_MAX_BYTES is reached (discard new) instead of removing one,
lets a service's re-ack to a republished request through (a duplicate window shorter
than ACK_TIMEOUT_SECONDS), and an existing stream is brought to those limits or its
differences are reported."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck, StorageType, StreamConfig
from nats.js.errors import ServiceUnavailableError

from arm_core.bridge.stream_setup import ensure_results_stream, results_consumer
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import envelope, nats_client
from arm_core.devtools.testbed.sql import dict_conn, scalar
from tests.support.bridge import logged, running_bridge
from tests.support.stream import STREAM, published_jobs, stream_settings

pytestmark = pytest.mark.integration

SUBJECT = "files.tabular_parsed"
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "contracts" / "examples"
PROCESSING = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
# As an arm-core before the bounds created its stream: limits retention (answers kept
# for the maximum age, applied or not), no byte limit, a 120 s duplicate window.
UNBOUNDED = StreamConfig(
    name=STREAM,
    subjects=[SUBJECT],
    storage=StorageType.FILE,
    num_replicas=1,
    max_age=7 * 24 * 3600.0,
    duplicate_window=120.0,
)


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
            # Its batch waits for a connection the pool cannot make (up to its timeout).
            await wait_for(lambda: bridge.inbox.counts["db_retries"] >= 1, 30, "a retry")
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


async def test_an_unbounded_stream_an_earlier_arm_core_made_is_bounded_in_place(
    db_url: str, js_server: EmbeddedNats, js_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream has limits retention and no byte limit, with answers applied long ago
    (acked by the durable consumer) and three not applied yet; the byte limit configured
    is below what those three take. The bridge sets the retention, discard policy, byte
    limit and duplicate window to the configuration, one INFO line each: the applied
    answers go at once (interest retention), the three stay though over the limit
    (discard new removes nothing, it refuses new messages), are applied, and then the
    stream is empty and takes new answers again."""
    js = js_client.jetstream()
    await js.add_stream(UNBOUNDED)
    jobs = published_jobs(db_url, 9)
    settings = stream_settings(db_url, js_server.url(), results_stream_max_bytes=512)
    earlier = await results_consumer(js, settings)  # the consumer as arm-core makes it
    for row in jobs[:8]:
        await js_ack(js, row)
    for msg in await earlier.fetch(5, timeout=5):  # applied by the earlier arm-core
        await msg.ack_sync()
    await earlier.unsubscribe()
    assert await stored(js) == 8  # limits retention: applied or not, kept
    caplog.set_level(logging.INFO)
    await ensure_results_stream(js_client, settings)  # what a bridge does first at start
    info = await js.stream_info(STREAM)
    assert (info.config.retention, info.config.discard) == ("interest", "new")
    assert (info.config.max_bytes, info.config.duplicate_window) == (512, 10.0)
    assert info.config.max_age == 7 * 24 * 3600.0
    assert info.state.messages == 3 and info.state.bytes > 512
    with pytest.raises(ServiceUnavailableError, match="maximum bytes exceeded"):
        await js_ack(js, jobs[8])
    updated = [r.getMessage() for r in logged(caplog.records, action="stream_updated")]
    assert updated == [
        f"updated JetStream stream {STREAM}: retention from limits to interest",
        f"updated JetStream stream {STREAM}: discard from old to new",
        f"updated JetStream stream {STREAM}: max_bytes from unlimited to 512",
        f"updated JetStream stream {STREAM}: duplicate_window from 120 to 10",
    ]
    async with running_bridge(settings) as bridge:
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, PROCESSING) == 3, 30, "the three applied")

            async def emptied() -> bool:
                return await stored(js) == 0

            await wait_for(emptied, 30, "the stream holds nothing applied")
            await js_ack(js, jobs[8])
            await wait_for(lambda: scalar(conn, PROCESSING) == 4, 30, "a new answer applied")
        # Each message is acked to the stream after its outcome committed: a moment later.
        await wait_for(
            lambda: bridge.inbox.counts["acked"] == 4, 30, lambda: f"{bridge.inbox.counts}"
        )
    assert len(logged(caplog.records, action="stream_updated")) == 4  # nothing more to do
    assert logged(caplog.records, action="stream_differs") == []


# Where the 4 MB for streams are: the server's file store, an account's (its user
# a:a), the server's memory store. (storage, the server's reason for the byte limit)
SMALL_STORES = {
    "server": ("jetstream { max_file_store: 4MB, store_dir: STORE }", StorageType.FILE),
    "account": (
        "jetstream { store_dir: STORE }\n"
        "accounts { A: { jetstream: { max_file: 4MB }, users: [{user: a, password: a}] } }",
        StorageType.FILE,
    ),
    "memory": ("jetstream { max_memory_store: 4MB, store_dir: STORE }", StorageType.MEMORY),
}


@pytest.mark.parametrize("where", sorted(SMALL_STORES))
async def test_what_the_server_refuses_or_arm_core_does_not_change_is_reported(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """4 MB for streams, on the server or for the account, and the default 1 GiB byte
    limit: the server cannot reserve it, so the update in one goes refused and the bridge
    makes the changes one by one — retention, discard and duplicate window are made, the
    byte limit is reported with the server's reason (and a storage other than file, which
    the server cannot change) — and the stream is used as it is."""
    text, storage = SMALL_STORES[where]
    config_file = tmp_path / "small.conf"
    config_file.write_text(text.replace("STORE", f'"{tmp_path / "js-small"}"') + "\n")
    server = EmbeddedNats(log_dir=tmp_path / "nats-small", extra_args=["-c", str(config_file)])
    server.start()
    url = server.url().replace("nats://", "nats://a:a@" if where == "account" else "nats://")
    client = await nats_client(url)
    try:
        js = client.jetstream()
        await js.add_stream(dataclasses.replace(UNBOUNDED, storage=storage))
        jobs = published_jobs(db_url, 2)
        caplog.set_level(logging.INFO)
        async with running_bridge(stream_settings(db_url, url)) as bridge:
            config = (await js.stream_info(STREAM)).config
            assert (config.retention, config.discard, config.duplicate_window) == (
                "interest",
                "new",
                10.0,
            )
            assert (config.max_bytes, config.storage) == (-1, storage.value)
            for row in jobs:
                await js_ack(js, row)
            await wait_for(lambda: bridge.inbox.counts["acked"] == 2, 30, "the stream is used")
    finally:
        await client.close()
        server.stop()
    changed = [
        r.getMessage().split(": ")[1] for r in logged(caplog.records, action="stream_updated")
    ]
    assert changed == [
        "retention from limits to interest",
        "discard from old to new",
        "duplicate_window from 120 to 10",
    ]
    (line,) = logged(caplog.records, action="stream_differs")
    said = line.getMessage()
    assert f"max_bytes unlimited (arm-core would use {1 << 30}): the server refused" in said
    kind = "memory" if storage is StorageType.MEMORY else "storage"
    assert f"insufficient {kind} resources available" in said
    assert ("storage memory (arm-core would use file)" in said) is (storage is StorageType.MEMORY)


async def test_a_stream_capturing_more_subjects_is_used_as_it_is(
    db_url: str, js_server: EmbeddedNats, js_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's stream over files.>: interest retention or a byte limit would act
    on the other subjects' messages too, so arm-core changes none of its limits and
    logs how it differs."""
    js = js_client.jetstream()
    await js.add_stream(dataclasses.replace(UNBOUNDED, subjects=["files.>"]))
    caplog.set_level(logging.INFO)
    async with running_bridge(stream_settings(db_url, js_server.url())):
        config = (await js.stream_info(STREAM)).config
    assert (config.retention, config.discard, config.max_bytes) == ("limits", "old", -1)
    assert logged(caplog.records, action="stream_updated") == []
    (line,) = logged(caplog.records, action="stream_differs")
    said = line.getMessage()
    assert f"captures more than {SUBJECT}, so arm-core uses it as it is" in said
    assert "retention limits (arm-core would use interest)" in said
    assert f"max_bytes unlimited (arm-core would use {1 << 30})" in said


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


async def test_other_consumers_of_the_stream_are_warned_about(
    db_url: str, js_server: EmbeddedNats, js_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """With interest retention a consumer that reads nothing (here the one an earlier
    NATS_QUEUE_GROUP made) keeps every answer until the stream is full: the bridge
    says so at start."""
    earlier = stream_settings(db_url, js_server.url(), nats_queue_group="old-group")
    nc = await nats_client(js_server.url())
    try:
        js = await ensure_results_stream(nc, earlier)
        await results_consumer(js, earlier)
    finally:
        await nc.close()
    caplog.set_level(logging.INFO)
    async with running_bridge(stream_settings(db_url, js_server.url())):
        pass
    (line,) = logged(caplog.records, action="stream_consumers")
    assert "has 1 consumer(s) besides arm-core" in line.getMessage()


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
