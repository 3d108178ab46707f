"""What `arm-core serve` and `arm-core bridge` share: the aiohttp lifecycle of the
process's one connection pool and one Store (every handler and the bridge get the
Store, nothing else gets the pool), the bridge, and the health check."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from aiohttp import web
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.listener import ListenerState
from arm_core.bridge.runner import Bridge, NatsState
from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.db import (
    DatabaseError,
    DatabasePoolExhausted,
    connection_options,
    pool_log_to,
    read_only,
    unclaimed_pool_name,
)
from arm_core.instruments import Instruments
from arm_core.metrics import METRICS, AppMetrics, BridgeState, metrics_handler
from arm_core.store import Store
from arm_core.tls import expires_at
from arm_core.version import installed

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
# The process's metrics, outage and pool exhaustion, handed to its Store and bridge.
INSTRUMENTS = web.AppKey("instruments", Instruments)
POOL = web.AppKey("pool", AsyncConnectionPool)
STORE = web.AppKey("store", Store)
BRIDGE = web.AppKey("bridge", Bridge)
# Set to stop the process (arm_core.http.server.run): by SIGINT or SIGTERM, or by the
# bridge when it cannot go on (its `fatal` then makes the command exit 2).
SHUTDOWN = web.AppKey("shutdown", asyncio.Event)


def new_app(settings: Settings, **kwargs: Any) -> web.Application:
    """An application of `arm-core serve` or `arm-core bridge`, with its settings, its
    instruments and its shutdown event."""
    app = web.Application(**kwargs)
    app[SETTINGS] = settings
    app[INSTRUMENTS] = Instruments()
    app[SHUTDOWN] = asyncio.Event()
    return app


def make_pool(
    settings: Settings, instruments: Instruments | None = None
) -> AsyncConnectionPool[Any]:
    """The process's pool, of settings.pool_max_size() connections at most (the
    bridge's loops and a reserve for the API: DATABASE_POOL_MAX_SIZE); connections
    with arm_core.db's timeouts and keepalives; one that finds its server read-only (a
    standby: the primary has moved) is discarded when taken, not reused; a new
    connection ends the instruments' outage (pool_ctx also routes the pool's failed
    attempts there). It is named `arm-core`, or `arm-core-2`, … while another pool of
    the process routes its failures under that name. (The bridge's LISTEN connection is
    its own.)

    Through a transaction pooler (DATABASE_POOLER=transaction) each transaction may run
    on another server session, so its connections prepare no statement (psycopg's
    prepare_threshold=None: a statement prepared on one session is unknown to the next)
    and send no startup options (the idle-in-transaction timeout is then the pooler's
    and the login's to set: docs/dbas.md#through-pgbouncer)."""
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
    """The pool's check, when a connection is taken: one to a read-only server is
    closed (the pool then discards it and connects anew) and another one taken."""
    if read_only(conn):
        await conn.close()
        raise psycopg.errors.ReadOnlySqlTransaction("the server is read-only (a standby)")


async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
    instruments = app[INSTRUMENTS]
    pool = make_pool(app[SETTINGS], instruments)
    with pool_log_to(pool.name, instruments.outage):
        await pool.open(wait=False)  # a database that is down at start shows in /healthcheck
        app[POOL] = pool
        app[STORE] = Store(pool, instruments)
        yield
        await pool.close()


async def bridge_ctx(app: web.Application) -> AsyncIterator[None]:
    """Starts the bridge's background tasks only when NATS_ENABLED=true (S-NATS-3)."""
    settings = app[SETTINGS]
    if not settings.nats_enabled:
        log.info("NATS_ENABLED=false: no bridge tasks", extra={"action": "bridge_off"})
        yield
        return
    shutdown = app[SHUTDOWN]
    bridge = Bridge(BridgeConfig(settings), app[STORE], on_fatal=lambda fatal: shutdown.set())
    await bridge.start()
    app[BRIDGE] = bridge
    yield
    await bridge.stop()


async def check_health(app: web.Application) -> tuple[int, dict[str, str]]:
    """200 while the process can serve; 503 with the reason when the database is down
    (`db: unavailable: …`) or no connection of the pool came free in time (`db: pool
    exhausted: …`).

    `outbox` says "stuck: …" when the oldest job ready to publish has waited longer than
    OUTBOX_STUCK_SECONDS although NATS is up (or this process runs no bridge and so
    cannot tell): a job the publisher cannot get out is then visible to any monitor. A
    job pacing holds back (its pipeline at its limit, or its service away) is not ready
    (arm.outbox_ready_age); a long burst is not stuck. `version`: the arm-core version
    the process runs."""
    settings = app[SETTINGS]
    db, outbox = "ok", "ok"
    age: float | None = None
    try:
        age = await app[STORE].outbox_ready_age(
            pool_timeout=min(2.0, settings.db_pool_timeout_seconds)
        )
    except DatabasePoolExhausted as exc:
        # The database answers: this process's connections are all busy (not an outage).
        db = f"pool exhausted: all {exc.figures.max_size} connections in use"
        outbox = "unknown"
    except Exception as exc:
        # The driver's error names the cause (the store wraps it in DatabaseUnavailable).
        cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ else exc
        db, outbox = f"unavailable: {type(cause).__name__}", "unknown"
    if not settings.nats_enabled:
        nats = "off"
    elif BRIDGE in app:
        nats = app[BRIDGE].nats_state()
    else:
        nats = "starting"
    if age is not None and age > settings.outbox_stuck_seconds and nats in (NatsState.OK, "off"):
        outbox = (
            f"stuck: the oldest job ready to publish has waited {age:.0f} s "
            f"(OUTBOX_STUCK_SECONDS={settings.outbox_stuck_seconds:g})"
        )
    ok = db == "ok" and nats in (NatsState.OK, "off") and outbox == "ok"
    return (200 if db == "ok" else 503), {
        "status": "ok" if ok else "degraded",
        "db": db,
        "nats": nats,
        "outbox": outbox,
        "version": installed(),
    }


async def healthcheck(request: web.Request) -> web.Response:
    status, body = await check_health(request.app)
    return web.json_response(body, status=status)


def check_live(app: web.Application) -> tuple[int, dict[str, Any]]:
    """GET /livez: 200 while the event loop answers (it does, to answer) and every loop
    of the bridge runs or is being restarted; 503 when one crashed past
    SERVICE_RESTART_LIMIT or has not come round for LIVENESS_STALL_SECONDS — what a
    restart of the process fixes. An unreachable database or NATS is not: the process
    waits for them, and says so in /readyz."""
    bridge = app.get(BRIDGE)
    if bridge is None:
        return 200, {"status": "alive", "loops": {}}
    ok, loops = bridge.supervisor.live()
    return (200 if ok else 503), {"status": "alive" if ok else "dead", "loops": loops}


async def livez(request: web.Request) -> web.Response:
    status, body = check_live(request.app)
    return web.json_response(body, status=status)


async def check_ready(app: web.Application) -> tuple[int, dict[str, Any]]:
    """GET /readyz: 200 when the process can do its work now — the database answers;
    when the bridge runs, NATS is connected and subscribed and its LISTEN session is in
    place (`listen`: without it the publisher still runs, but a job waits for the next
    OUTBOX_POLL_SECONDS poll instead of going out at once); and it is not stopping. 503
    with what is missing otherwise. Nothing a restart would fix."""
    settings = app[SETTINGS]
    try:
        await app[STORE].answers(pool_timeout=min(2.0, settings.db_pool_timeout_seconds))
        db = "ok"
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ else exc
        db = f"unavailable: {type(cause).__name__}"
    if not settings.nats_enabled:
        nats: str = "off"
        listen: str = "off"
    elif BRIDGE in app:
        nats = app[BRIDGE].nats_state()
        listen = app[BRIDGE].listener_status()
    else:
        nats = listen = "starting"
    draining = app[SHUTDOWN].is_set()
    ok = (
        db == "ok"
        and nats in (NatsState.OK, "off")
        and listen in (ListenerState.OK, "off")
        and not draining
    )
    body: dict[str, Any] = {"status": "ready" if ok else "not_ready", "db": db, "nats": nats}
    body["listen"] = listen
    body["draining"] = draining
    return (200 if ok else 503), body


async def readyz(request: web.Request) -> web.Response:
    status, body = await check_ready(request.app)
    return web.json_response(body, status=status)


def install_probes(app: web.Application) -> None:
    """GET /healthcheck (as it always was), /livez and /readyz on `app`."""
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)


def certificate_expiries(settings: Settings) -> dict[str, float]:
    """arm_tls_certificate_expiry_timestamp_seconds: when each certificate file expires
    first. The NATS and HTTPS files were checked at start (a bad one stops it); a file
    DATABASE_URL names is libpq's to judge, so one that cannot be read is left out, and
    logged."""
    found: dict[str, float] = {}
    for variable, path in settings.certificate_files().items():
        try:
            found[variable] = expires_at(variable, path).timestamp()
        except ConfigError as exc:
            log.warning("no expiry metric for %s", exc, extra={"action": "metrics"})
    return found


def install_metrics(app: web.Application) -> None:
    """GET /metrics on `app`: this process's counters, the bridge's state when it runs
    one, and the database's gauges (bounded and cached: src/arm_core/metrics.py)."""

    def bridge_state() -> BridgeState | None:
        return app[BRIDGE].metrics_state() if BRIDGE in app else None

    settings = app[SETTINGS]
    app[METRICS] = AppMetrics(
        store=lambda: app.get(STORE),
        bridge=bridge_state,
        instruments=app[INSTRUMENTS],
        ack_timeout=settings.ack_timeout_seconds,
        certificates=certificate_expiries(settings),
    )
    app.router.add_get("/metrics", metrics_handler)


def bridge_app(settings: Settings) -> web.Application:
    """`arm-core bridge`: the bridge alone, with its own small health endpoint (its
    errors JSON like the API's, served by arm_core.http.server like the API)."""
    from arm_core.http.errors import error_middleware

    app = new_app(settings, middlewares=[error_middleware])
    app.cleanup_ctx.extend([pool_ctx, bridge_ctx])
    install_probes(app)
    install_metrics(app)
    return app
