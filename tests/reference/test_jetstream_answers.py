"""Answers through JetStream publish where a stream captures the result subject (issue
19's contract): each answer is stored once the stream acknowledged it; while the stream
cannot answer ("no responders": no leader, or gone) the answers wait in the service's
queue and are tried again with back-off, none dropped, none stored twice; where no
stream captures the subject the service publishes with core NATS as before."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js.api import StreamConfig

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.reference import NATS_OPTIONS, TABULAR, ReferenceConfig, ReferenceService
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import nats_client

RESULTS = "files.tabular_parsed"
REQUESTS = "files.tabular_uploaded"
STREAM = StreamConfig(name="ANSWERS", subjects=[RESULTS])


def request() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[2] / "docs/contracts/examples/request-tabular.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    file_id = str(uuid.uuid4())
    body.update(
        job_id=str(uuid.uuid4()), file_id=file_id, attempt=1, reply_deadline="2099-01-01T00:00:00Z"
    )
    body["s3"]["key"] = f"uploads/{file_id}/{body['original_name']}"
    return body


async def send(client: Client, body: dict[str, Any]) -> None:
    await client.publish(
        REQUESTS, json.dumps(body).encode(), headers={"Nats-Msg-Id": f"{body['job_id']}:1"}
    )
    await client.flush()


async def stored(client: Client) -> Counter[str]:
    """The Nats-Msg-Id of every message the stream holds."""
    js = client.jetstream()
    info = await js.stream_info(STREAM.name or "")
    ids: Counter[str] = Counter()
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(STREAM.name or "", seq)
        ids[(msg.headers or {}).get("Nats-Msg-Id", "")] += 1
    return ids


async def test_answers_wait_for_the_stream_and_are_stored_once(
    js_server: EmbeddedNats, tmp_path: Path
) -> None:
    client = await nats_client(js_server.url())
    js = client.jetstream()
    await js.add_stream(STREAM)
    nc = await nats.connect(js_server.url(), **NATS_OPTIONS)
    service = ReferenceService(
        nc, ReferenceConfig(TABULAR, delay_seconds=0.05, results_dir=tmp_path / "bucket")
    )
    try:
        await service.start()
        assert service.stream == "ANSWERS"
        first = request()
        await send(client, first)
        await wait_for(lambda: service.stats.sent == 2 and service.pending == 0, 10, "answered")
        # The stream goes away (its leader lost, say): answers wait in the queue.
        await js.delete_stream(STREAM.name or "")
        later = [request() for _ in range(5)]
        for body in later:
            await send(client, body)
        # All ten answers (an ack and a result each) queued and tried again, with
        # back-off, more than once on the whole: nothing dropped meanwhile.
        await wait_for(
            lambda: service.pending == 10 and service.stats.resent >= 20,
            20,
            lambda: f"publishes not acknowledged, tried again: {service.stats}",
        )
        assert service.pending == 10 and service.stats.pending_dropped == 0
        await js.add_stream(STREAM)
        await wait_for(lambda: service.pending == 0, 15, "the queue sent once the stream is back")
        ids = await stored(client)
        expected = {f"{kind}:{b['job_id']}:1" for b in later for kind in ("ack", "result")}
        assert set(ids) == expected and set(ids.values()) == {1}, ids
        # A repeat of a request is acked again with the same Nats-Msg-Id: the stream
        # answers "duplicate", which is a success (nothing stored twice, nothing waits).
        await send(client, later[0])
        await wait_for(
            lambda: service.stats.reacked == 1 and service.stats.sent == 13,
            10,
            lambda: f"the repeat acked again: {service.stats}",
        )
        assert (await stored(client)) == ids
    finally:
        await service.stop(grace=0)
        await nc.close()
        await client.close()


async def test_without_a_stream_answers_go_by_core_nats(
    js_server: EmbeddedNats, tmp_path: Path
) -> None:
    client = await nats_client(js_server.url())
    received: list[str] = []

    async def on_answer(msg: Any) -> None:
        received.append((msg.headers or {}).get("Nats-Msg-Id", ""))

    await client.subscribe(RESULTS, cb=on_answer)
    await client.flush()
    nc = await nats.connect(js_server.url(), **NATS_OPTIONS)
    service = ReferenceService(
        nc, ReferenceConfig(TABULAR, delay_seconds=0.05, results_dir=tmp_path / "bucket")
    )
    try:
        await service.start()
        assert service.stream is None
        body = request()
        await send(client, body)
        await wait_for(lambda: len(received) == 2, 10, "ack and result by core NATS")
        assert received == [f"ack:{body['job_id']}:1", f"result:{body['job_id']}:1"]
    finally:
        await service.stop(grace=0)
        await nc.close()
        await client.close()


async def test_reference_publish_core_answers_by_core_nats_even_with_a_stream(
    js_server: EmbeddedNats, tmp_path: Path
) -> None:
    """REFERENCE_PUBLISH=core: a service that has not adopted JetStream publish. With a
    stream capturing the subject it still publishes with core NATS — and with the
    stream gone its answers leave at once, waiting for nobody (lost)."""
    client = await nats_client(js_server.url())
    js = client.jetstream()
    await js.add_stream(STREAM)
    nc = await nats.connect(js_server.url(), **NATS_OPTIONS)
    config = ReferenceConfig(
        TABULAR, delay_seconds=0.05, results_dir=tmp_path / "bucket", publish="core"
    )
    service = ReferenceService(nc, config)
    try:
        await service.start()
        assert service.stream is None
        await send(client, request())
        await wait_for(lambda: service.stats.sent == 2, 10, "answered")
        assert len(await stored(client)) == 2  # captured by the stream all the same
        await js.delete_stream(STREAM.name or "")
        await send(client, request())
        await wait_for(lambda: service.stats.sent == 4, 10, "answered into the void")
        assert service.pending == 0 and service.stats.resent == 0
    finally:
        await service.stop(grace=0)
        await nc.close()
        await client.close()
