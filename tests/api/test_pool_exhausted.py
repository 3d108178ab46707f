"""A pool whose every connection is in use is its own condition, not an outage: the API
answers 503 DATABASE_POOL_EXHAUSTED, the log says `db_pool_exhausted` (never
`db_outage`) and arm_db_pool_exhausted_total moves. The same request with the database
really unreachable stays 503 DATABASE_UNAVAILABLE and `db_outage` — even once the pool's
own figures look full (its broken connections being opened again count in its size)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import API_LOGIN, dict_conn, scalar, upload
from arm_core.http.keys import STORE
from tests.support.api import api_settings, running_api
from tests.support.bridge import logged

pytestmark = pytest.mark.integration

POOL_SIZE = 2
WAITING_ON_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND usename = %s AND wait_event_type = 'Lock'"
)


@pytest.fixture
async def proxy(pg_server: EmbeddedPostgres) -> AsyncIterator[TcpProxy]:
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def metric(http: TestClient, name: str, **labels: str) -> float:
    """One sample of GET /metrics (0 when absent)."""
    resp = await http.get("/metrics")
    assert resp.status == 200, await resp.text()
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


async def test_a_starved_pool_is_exhausted_and_an_unreachable_database_an_outage(
    db_url: str, pg_server: EmbeddedPostgres, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="arm_core.db")
    with dict_conn(db_url) as conn:
        file_id = upload(conn).file_id
    url = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    settings = api_settings(url, db_pool_max_size=POOL_SIZE, db_pool_timeout_seconds=0.5)
    path = f"/api/v1/files/{file_id}"
    async with running_api(settings) as http:
        app = http.app
        assert (await http.get(path)).status == 200
        assert await metric(http, "arm_db_pool_exhausted_total") == 0  # this process's own

        # Every connection held: the test locks the table each request reads, and as
        # many requests as the pool has connections wait on the lock, each on its own.
        with dict_conn(db_url) as locker:
            locker.execute("BEGIN")
            locker.execute("LOCK TABLE arm.stored_file IN ACCESS EXCLUSIVE MODE")
            held = [asyncio.ensure_future(http.get(path)) for _ in range(POOL_SIZE)]
            with dict_conn(db_url) as watcher:
                await wait_for(
                    lambda: scalar(watcher, WAITING_ON_A_LOCK, (API_LOGIN.name,)) == POOL_SIZE,
                    10,
                    "every connection of the pool waits on the lock",
                )
            assert app[STORE].pool_figures.in_use == POOL_SIZE

            async with asyncio.timeout(10):  # a connection to spare would wait on the lock
                starved = await http.get(path)
            assert starved.status == 503
            body = await starved.json()
            assert body["error"]["code"] == "DATABASE_POOL_EXHAUSTED", body
            assert f"DATABASE_POOL_MAX_SIZE={POOL_SIZE}" in body["error"]["message"]
            health = await http.get("/healthcheck")
            assert health.status == 503
            assert (await health.json())["db"].startswith("pool exhausted")
            # A scrape meanwhile: the pool's gauges, and the counter has moved.
            assert await metric(http, "arm_db_pool_connections", state="in_use") == POOL_SIZE
            assert await metric(http, "arm_db_pool_max") == POOL_SIZE
            assert await metric(http, "arm_db_pool_exhausted_total") > 0
            locker.execute("COMMIT")
            assert [r.status for r in await asyncio.gather(*held)] == [200] * POOL_SIZE

        assert (await http.get(path)).status == 200
        exhausted = logged(caplog.records, action="db_pool_exhausted")
        assert [r.state for r in exhausted] == ["started", "ended"]
        started = exhausted[0]
        assert started.levelno == logging.WARNING
        assert (started.in_use, started.max) == (POOL_SIZE, POOL_SIZE)
        assert "DATABASE_POOL_MAX_SIZE" in started.getMessage()
        assert not logged(caplog.records, action="db_outage")

        # The database unreachable, the same request: an outage. The pool grew to its
        # maximum above; its broken connections are being opened again, so psycopg_pool
        # counts them in its size with none available, while none is in use.
        caplog.clear()
        counted = await metric(http, "arm_db_pool_exhausted_total")
        proxy.block()
        answers: list[str] = []

        async def looks_full_and_is_down() -> bool:
            resp = await http.get(path)
            answers.append((await resp.json()).get("error", {}).get("code", str(resp.status)))
            stats = app[STORE].pool.get_stats()
            return stats["pool_size"] == POOL_SIZE and stats["pool_available"] == 0

        await wait_for(looks_full_and_is_down, 20, "the pool's figures look full")
        final = await http.get(path)
        answers.append((await final.json()).get("error", {}).get("code", str(final.status)))
        assert set(answers) == {"DATABASE_UNAVAILABLE"}, answers
        assert app[STORE].pool_figures.in_use == 0
        assert app[STORE].pool_figures.connecting == POOL_SIZE
        health = await http.get("/healthcheck")
        assert (await health.json())["db"].startswith("unavailable")
        assert [r.state for r in logged(caplog.records, action="db_outage")][:1] == ["started"]
        assert not logged(caplog.records, action="db_pool_exhausted")
        assert await metric(http, "arm_db_pool_exhausted_total") == counted
