"""GET /metrics (src/arm_core/metrics.py) on both ports: the bridge's health port
(`arm-core bridge`) and `arm-core serve`. A job through the real bridge moves the
transition, envelope and batch counters and the three wait histograms of the bridge's
process (serve, another process, counts its own); the API's retries
are counted by outcome; arm_jobs equals a real COUNT(*); and /metrics still answers,
without the database's gauges, while the database is unreachable."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import envelope, instant_service, nats_client, send
from arm_core.devtools.testbed.sql import dict_conn, fail_by_no_ack, job, publish, scalar, upload
from arm_core.http.keys import METRICS
from arm_core.runtime import bridge_app, create_app
from tests.support.api import api_settings
from tests.support.bridge import fast_settings

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(http: TestClient) -> Samples:
    resp = await http.get("/metrics")
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestClient]:
    app[METRICS].cache_seconds = 0  # each scrape reads the database again
    async with TestClient(TestServer(app)) as http:
        yield http


async def test_a_job_through_the_bridge_moves_its_counters_and_both_ports_show_the_gauges(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    url = nats_server.url()
    service = await instant_service(url)
    client = await nats_client(url)
    try:
        async with (
            serving(bridge_app(fast_settings(db_url, url))) as bridge_http,
            serving(create_app(api_settings(db_url))) as api_http,
        ):
            await wait_for(
                lambda: _connected(bridge_http), 10, "arm_nats_connected 1 on the health port"
            )
            before = await scrape(bridge_http)
            with dict_conn(db_url) as conn:
                up = upload(conn)
                await wait_for(lambda: job(conn, up.job_id)["status"] == "done", 10)
                # The same result again, and garbage: a duplicate and a rejected envelope.
                again = envelope(up.job_id, up.file_id, "done")
                await send(client, again, f"result:{up.job_id}:1")
                await send(client, b"not json at all", "garbage:1")
                await wait_for(
                    lambda: _moved(bridge_http, before, "duplicate", "rejected"),
                    10,
                    "the duplicate and the garbage counted",
                )
                done = scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE status='done'")
            # The bridge's counters are its process's (its app's Instruments): the
            # health port shows them moved; serve, another process, counted nothing.
            after = await scrape(bridge_http)

            def moved(name: str, **labels: str) -> float:
                return sample(after, name, **labels) - sample(before, name, **labels)

            for to in ("published", "processing", "done"):
                assert moved("arm_job_transitions_total", to=to) >= 1, to
            for phase in ("queued", "ack", "processing"):
                assert moved("arm_job_wait_seconds_count", phase=phase) >= 1, phase
            assert moved("arm_inbox_envelopes_total", outcome="applied") >= 2
            assert moved("arm_inbox_envelopes_total", outcome="duplicate") >= 1
            assert moved("arm_inbox_envelopes_total", outcome="rejected") >= 1
            assert moved("arm_publish_batches_total", result="ok") >= 1
            api = await scrape(api_http)
            assert sample(api, "arm_job_transitions_total", to="published") == 0
            assert ("arm_job_transitions_total", frozenset({("to", "done")})) in api
            # The database's gauges are the same on both ports.
            for samples in (after, api):
                assert sample(samples, "arm_jobs", status="done") == done
                assert sample(samples, "arm_database_up") == 1
                assert sample(samples, "arm_outbox_oldest_queued_age_seconds") == 0
                # The alerts' gauges (deploy/prometheus/arm-core-rules.yml): nothing
                # overdue here.
                for gauge in ("arm_jobs_unacked_overdue", "arm_jobs_past_deadline_unswept"):
                    assert (gauge, frozenset()) in samples and sample(samples, gauge) == 0
                # Each pipeline's pacing (PACING=auto, the default: a limit between the
                # floor and the ceiling, nothing held back).
                for pipeline in ("tabular", "image"):
                    assert sample(samples, "arm_pipeline_answering", pipeline=pipeline) == 1
                    assert sample(samples, "arm_pipeline_held_back", pipeline=pipeline) == 0
                    limit = sample(samples, "arm_pipeline_in_flight_limit", pipeline=pipeline)
                    assert 1 <= limit <= 1000, (pipeline, limit)
            bridge_after = await scrape(bridge_http)
            api_after = await scrape(api_http)
            assert sample(bridge_after, "arm_nats_connected") == 1
            assert ("arm_inbox_buffered", frozenset()) in bridge_after
            # serve without NATS runs no bridge: no bridge gauges there.
            assert ("arm_nats_connected", frozenset()) not in api_after
    finally:
        await client.close()
        await service.client.close()


async def _connected(http: TestClient) -> bool:
    return sample(await scrape(http), "arm_nats_connected") == 1


async def _moved(http: TestClient, before: Samples, *outcomes: str) -> bool:
    now = await scrape(http)
    return all(
        sample(now, "arm_inbox_envelopes_total", outcome=o)
        > sample(before, "arm_inbox_envelopes_total", outcome=o)
        for o in outcomes
    )


async def test_the_api_counts_retries_by_outcome(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        failed = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        live = upload(conn)
    async with serving(create_app(api_settings(db_url))) as http:
        before = await scrape(http)
        assert (await http.post(f"/api/v1/files/{failed.file_id}/retry")).status == 201
        assert (await http.post(f"/api/v1/files/{uuid.uuid4()}/retry")).status == 404
        batch = {"file_ids": [str(live.file_id), str(uuid.uuid4())]}
        assert (await http.post("/api/v1/files/retry", json=batch)).status == 200
        after = await scrape(http)
    for outcome, n in (("retried", 1), ("not_found", 2), ("not_retryable", 1)):
        delta = sample(after, "arm_retries_total", outcome=outcome) - sample(
            before, "arm_retries_total", outcome=outcome
        )
        assert delta == n, outcome


async def test_metrics_answer_without_the_database_gauges_while_the_database_is_down(
    db_url: str, pg_server: EmbeddedPostgres
) -> None:
    """A proxy that refuses every connection: /metrics answers within its bound (1 s for
    the database, the test allows 10) with arm_database_up 0 and no arm_jobs; the status
    view is a JSON 503. Then the database is back and so are the gauges."""
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    down_url = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    try:
        proxy.block()
        app = create_app(api_settings(down_url, db_pool_timeout_seconds=0.5))
        async with serving(app) as http:
            app[METRICS].status_cache_seconds = 0
            async with asyncio.timeout(10):
                samples = await scrape(http)
                status = await http.get("/api/v1/status")
            assert sample(samples, "arm_database_up") == 0
            assert not [key for key in samples if key[0] == "arm_jobs"]
            assert ("arm_job_transitions_total", frozenset({("to", "done")})) in samples
            assert status.status == 503
            assert (await status.json())["error"]["code"] == "DATABASE_UNAVAILABLE"
            proxy.unblock()

            async def back() -> bool:
                return sample(await scrape(http), "arm_database_up") == 1

            await wait_for(back, 15, "arm_database_up back to 1")
            assert ("arm_jobs", frozenset({("status", "queued")})) in await scrape(http)
    finally:
        await proxy.close()
