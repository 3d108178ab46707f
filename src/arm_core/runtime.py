"""How `arm-core serve` and `arm-core bridge` are put together: the application
arm_core.http builds, the process's one pool and one Store, and the bridge (handed to
the API as its BRIDGE_VIEW). The one module that knows both the API and the bridge."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from aiohttp import web
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.runner import Bridge
from arm_core.config import Settings
from arm_core.db import connection_options, pool_log_to, read_only, unclaimed_pool_name
from arm_core.http.app import api_app, health_app
from arm_core.http.keys import BRIDGE_VIEW, METRICS, SETTINGS, SHUTDOWN, STORE
from arm_core.instruments import Instruments
from arm_core.store import Store

log = logging.getLogger(__name__)

# The bridge the process runs (NATS_ENABLED=true), once started: the command reads why
# it stopped (its `fatal`).
BRIDGE = web.AppKey("bridge", Bridge)


def make_pool(
    settings: Settings, instruments: Instruments | None = None
) -> AsyncConnectionPool[Any]:
    """The process's pool (DATABASE_POOL_MAX_SIZE), with arm_core.db's timeouts and
    keepalives; a connection to a read-only server (a standby: the primary has moved) is
    discarded when taken, and a new one ends the instruments' outage. Through a
    transaction pooler each transaction may run on another server session: no statement
    is prepared and no startup option sent (docs/dbas.md#through-pgbouncer)."""
    url = settings.require_database_url()
    outage = (instruments or Instruments()).outage
    transaction = settings.transaction_pooler
    idle = 0.0 if transaction else settings.db_idle_in_transaction_timeout_seconds

    async def connected(conn: AsyncConnection[Any]) -> None:
        outage.available()  # every new connection: the database is reachable

    return AsyncConnectionPool(
        url,
        open=False,
        min_size=1,
        max_size=settings.pool_max_size(),
        timeout=settings.db_pool_timeout_seconds,
        kwargs={
            "autocommit": True,
            **({"prepare_threshold": None} if transaction else {}),
            **connection_options(url, idle_in_transaction=idle),
        },
        check=_writable,
        configure=connected,
        name=unclaimed_pool_name(),
    )


async def _writable(conn: AsyncConnection[Any]) -> None:
    """Closes a connection to a read-only server when taken: the pool takes another."""
    if read_only(conn):
        await conn.close()
        raise psycopg.errors.ReadOnlySqlTransaction("the server is read-only (a standby)")


async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
    instruments = app[METRICS].instruments
    pool = make_pool(app[SETTINGS], instruments)
    with pool_log_to(pool.name, instruments.outage):
        await pool.open(wait=False)  # a database that is down at start shows in /healthcheck
        app[STORE] = Store(pool, instruments)
        yield
        await pool.close()


async def bridge_ctx(app: web.Application) -> AsyncIterator[None]:
    """Starts the bridge's background tasks only when NATS_ENABLED=true."""
    settings = app[SETTINGS]
    if not settings.nats_enabled:
        log.info("NATS_ENABLED=false: no bridge tasks", extra={"action": "bridge_off"})
        yield
        return
    bridge = Bridge(BridgeConfig(settings), app[STORE], on_fatal=lambda _: app[SHUTDOWN].set())
    await bridge.start()
    app[BRIDGE] = app[BRIDGE_VIEW] = bridge
    yield
    await bridge.stop()


def create_app(settings: Settings) -> web.Application:
    """`arm-core serve`: the HTTP API, with the bridge when NATS_ENABLED=true."""
    app = api_app(settings)
    app.cleanup_ctx.extend([pool_ctx, bridge_ctx])
    return app


def bridge_app(settings: Settings) -> web.Application:
    """`arm-core bridge`: the bridge alone, with its own small health port."""
    app = health_app(settings)
    app.cleanup_ctx.extend([pool_ctx, bridge_ctx])
    return app
