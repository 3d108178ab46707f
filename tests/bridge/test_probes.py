"""GET /livez and /readyz answer two questions: should this process be restarted (a loop
of the bridge failed or is stuck), and can it do its work now (the database, NATS, not
stopping). An unreachable database or NATS is never a reason to restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arm_core.bridge.listener import NOTIFY_CHANNEL
from arm_core.config import Settings
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import BRIDGE_LOGIN, SERVE_LOGIN, as_login, dict_conn
from arm_core.http.keys import SHUTDOWN
from arm_core.runtime import BRIDGE, bridge_app, create_app
from tests.support.bridge import LOOPS, fast_settings

pytestmark = pytest.mark.integration


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(app)) as http:
        yield http


async def probe(http: TestClient, path: str) -> tuple[int, dict[str, Any]]:
    resp = await http.get(path)
    return resp.status, await resp.json()


async def ready(http: TestClient) -> bool:
    return (await probe(http, "/readyz"))[0] == 200


def serve_settings(db_url: str, nats_url: str, **more: Any) -> Settings:
    return fast_settings(db_url, nats_url, database_url=as_login(db_url, SERVE_LOGIN), **more)


async def test_alive_and_ready_then_a_stuck_loop_is_not_alive_until_it_moves(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """A DBA's lock on arm.periodic_task holds the schedule's query: the loop does not come
    round, and past LIVENESS_STALL_SECONDS /livez says so (a restart would end the
    wait); once the lock goes it is alive again. Readiness does not ask the loops."""
    settings = serve_settings(db_url, nats_server.url(), liveness_stall_seconds=1.5)
    async with serving(create_app(settings)) as http:
        await wait_for(lambda: ready(http), 15, "ready")

        async def connected() -> bool:
            # Once connected the connecting loop's work is done; it ends a moment after
            # the connection that makes the process ready (later on a loaded machine).
            body = (await probe(http, "/livez"))[1]
            return body["loops"]["nats-connect"] == "stopped"

        await wait_for(connected, 15, "the nats-connect loop ended")
        status, body = await probe(http, "/livez")
        assert status == 200 and body["status"] == "alive"
        assert set(body["loops"]) == set(LOOPS)
        assert body["loops"]["publisher"] == "running"
        assert (await probe(http, "/readyz")) == (
            200,
            {"status": "ready", "db": "ok", "nats": "ok", "listen": "ok", "draining": False},
        )
        with dict_conn(db_url) as dba:
            dba.execute("BEGIN")
            dba.execute("LOCK TABLE arm.periodic_task IN ACCESS EXCLUSIVE MODE")

            async def stalled() -> bool:
                status, body = await probe(http, "/livez")
                return status == 503 and body["loops"]["schedule"] == "stalled"

            await wait_for(stalled, 15, "the schedule stalled")
            status, body = await probe(http, "/livez")
            assert body["status"] == "dead" and body["loops"]["publisher"] == "running"
            dba.execute("ROLLBACK")

        async def alive() -> bool:
            return (await probe(http, "/livez"))[0] == 200

        await wait_for(alive, 15, "alive again")


async def test_database_or_nats_away_is_not_ready_but_alive(
    db_url: str, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """The database cut off (a proxy refusing connections), then NATS stopped: /readyz 503
    naming what is missing, /livez 200 throughout — the process waits for them, and a
    restart would not bring them back. /healthcheck keeps its old answers."""
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    settings = fast_settings(proxied, nats_server.url(), db_pool_timeout_seconds=1)
    try:
        async with serving(bridge_app(settings)) as http:
            await wait_for(lambda: ready(http), 15, "ready")
            proxy.block()

            async def db_away() -> bool:
                status, body = await probe(http, "/readyz")
                return status == 503 and body["db"].startswith("unavailable")

            await wait_for(db_away, 15, "not ready: the database")
            assert (await probe(http, "/livez"))[0] == 200
            assert (await probe(http, "/healthcheck"))[0] == 503
            proxy.unblock()
            await wait_for(lambda: ready(http), 20, "ready again")
            nats_server.stop()

            async def nats_away() -> bool:
                status, body = await probe(http, "/readyz")
                return status == 503 and body["db"] == "ok" and body["nats"] != "ok"

            await wait_for(nats_away, 15, "not ready: NATS")
            status, body = await probe(http, "/livez")
            assert status == 200, body
    finally:
        await proxy.close()


async def test_without_its_listen_session_the_process_is_not_ready_until_it_is_back(
    db_url: str,
    pg_server: EmbeddedPostgres,
    nats_server: EmbeddedNats,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DATABASE_LISTEN_URL through a proxy that cuts it off, the pool direct: /readyz 503
    with `listen` reconnecting while the database and NATS are fine (jobs would wait for
    the poll), 200 once the listener is back; and a LISTEN session the server ends
    (pg_terminate_backend) is opened again. Its failed attempts are one outage of its
    own, logged once: the pool's answers meanwhile do not end it."""
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    listen_url = as_login(db_url, BRIDGE_LOGIN).replace(f":{pg_server.port}/", f":{proxy.port}/")
    settings = fast_settings(db_url, nats_server.url(), database_listen_url=listen_url)
    app = bridge_app(settings)
    try:
        async with serving(app) as http:
            await wait_for(lambda: ready(http), 15, "ready")
            assert (await probe(http, "/readyz"))[1]["listen"] == "ok"
            caplog.clear()
            proxy.block()

            async def listen_away() -> bool:
                status, body = await probe(http, "/readyz")
                return status == 503 and body["listen"] == "reconnecting"

            await wait_for(listen_away, 15, "not ready: the LISTEN session")
            body = (await probe(http, "/readyz"))[1]
            assert (body["db"], body["nats"], body["draining"]) == ("ok", "ok", False), body
            assert (await probe(http, "/livez"))[0] == 200
            listener = app[BRIDGE].listener
            await wait_for(lambda: listener.outage.count >= 3, 15, "three failed attempts")
            said = [r for r in caplog.records if r.getMessage().startswith("database unavailable")]
            assert len(said) == 1 and "listen: " in said[0].getMessage(), said
            proxy.unblock()
            await wait_for(lambda: ready(http), 20, "ready again")

            def listening() -> list[int]:
                with dict_conn(db_url) as dba:
                    rows = dba.execute(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE query = %s AND datname = current_database()",
                        (f"LISTEN {NOTIFY_CHANNEL}",),
                    ).fetchall()
                return [row["pid"] for row in rows]

            [before] = listening()
            with dict_conn(db_url) as dba:
                dba.execute("SELECT pg_terminate_backend(%s)", (before,))

            async def listening_again() -> bool:
                now = listening()
                return len(now) == 1 and now[0] != before and await ready(http)

            await wait_for(listening_again, 20, "LISTEN in place again after its session ended")
    finally:
        await proxy.close()


async def test_a_stopping_process_is_not_ready(db_url: str, nats_server: EmbeddedNats) -> None:
    app = create_app(serve_settings(db_url, nats_server.url()))
    async with serving(app) as http:
        await wait_for(lambda: ready(http), 15, "ready")
        app[SHUTDOWN].set()  # what SIGTERM sets: the drain begins
        status, body = await probe(http, "/readyz")
        assert status == 503 and body["draining"] is True
        assert (await probe(http, "/livez"))[0] == 200


async def test_without_a_bridge_alive_means_answering(db_url: str) -> None:
    settings = Settings(
        database_url=as_login(db_url, SERVE_LOGIN), nats_enabled=False, nats_urls=("nats://x:1",)
    )
    async with serving(create_app(settings)) as http:
        assert await probe(http, "/livez") == (200, {"status": "alive", "loops": {}})
        await wait_for(lambda: ready(http), 15, "ready")
        assert (await probe(http, "/readyz"))[1]["nats"] == "off"
