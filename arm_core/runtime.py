"""What `arm-core serve` and `arm-core bridge` share: the aiohttp lifecycle of the
connection pool and the bridge, and the health check."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.runner import Bridge
from arm_core.config import Settings

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", AsyncConnectionPool)
BRIDGE = web.AppKey("bridge", Bridge)


def make_pool(settings: Settings, max_size: int = 10) -> AsyncConnectionPool[Any]:
    return AsyncConnectionPool(
        settings.require_database_url(),
        open=False,
        min_size=1,
        max_size=max_size,
        timeout=settings.db_pool_timeout_seconds,
        kwargs={"autocommit": True},
        name="arm-core",
    )


async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
    pool = make_pool(app[SETTINGS])
    await pool.open(wait=False)  # a database that is down at start shows in /healthcheck
    app[POOL] = pool
    yield
    await pool.close()


async def bridge_ctx(app: web.Application) -> AsyncIterator[None]:
    """Starts the bridge's background tasks only when NATS_ENABLED=true (S-NATS-3)."""
    settings = app[SETTINGS]
    if not settings.nats_enabled:
        log.info("NATS_ENABLED=false: no bridge tasks", extra={"action": "bridge_off"})
        yield
        return
    bridge = Bridge(settings, app[POOL])
    await bridge.start()
    app[BRIDGE] = bridge
    yield
    await bridge.stop()


async def check_health(app: web.Application) -> tuple[int, dict[str, str]]:
    """200 while the process can serve; 503 with the reason when the database is down."""
    db = "ok"
    try:
        async with app[POOL].connection(
            timeout=min(2.0, app[SETTINGS].db_pool_timeout_seconds)
        ) as conn:
            await conn.execute("SELECT 1")
    except Exception as exc:
        db = f"unavailable: {type(exc).__name__}"
    if not app[SETTINGS].nats_enabled:
        nats = "off"
    elif BRIDGE in app:
        nats = app[BRIDGE].nats_state()
    else:
        nats = "starting"
    ok = db == "ok" and nats in ("ok", "off")
    return (200 if db == "ok" else 503), {
        "status": "ok" if ok else "degraded",
        "db": db,
        "nats": nats,
    }


async def healthcheck(request: web.Request) -> web.Response:
    status, body = await check_health(request.app)
    return web.json_response(body, status=status)


def bridge_app(settings: Settings) -> web.Application:
    """`arm-core bridge`: the bridge alone, with its own small health endpoint."""
    app = web.Application()
    app[SETTINGS] = settings
    app.cleanup_ctx.extend([pool_ctx, bridge_ctx])
    app.router.add_get("/healthcheck", healthcheck)
    return app
