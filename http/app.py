"""The aiohttp application of `arm-core serve`: the HTTP API, plus the bridge's tasks
when NATS_ENABLED=true."""

from __future__ import annotations

from aiohttp import web

from arm_core.config import Settings
from arm_core.runtime import SETTINGS, bridge_ctx, healthcheck, pool_ctx


def create_app(settings: Settings) -> web.Application:
    app = web.Application()
    app[SETTINGS] = settings
    app.cleanup_ctx.extend([pool_ctx, bridge_ctx])
    app.router.add_get("/healthcheck", healthcheck)
    return app
