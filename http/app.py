"""The aiohttp application of `arm-core serve`: the HTTP API, plus the bridge's tasks
when NATS_ENABLED=true. Routes, middlewares and lifecycle in one place."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from arm_core.config import Settings
from arm_core.http import handlers
from arm_core.http.auth import auth_middleware
from arm_core.http.errors import error_middleware
from arm_core.runtime import SETTINGS, bridge_ctx, healthcheck, pool_ctx

OPENAPI_PATH = Path(__file__).with_name("openapi.json")


def create_app(settings: Settings) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(settings)],
        client_max_size=settings.http_max_body_bytes,
    )
    app[SETTINGS] = settings
    app[handlers.OPENAPI] = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    app.cleanup_ctx.extend([pool_ctx, bridge_ctx])
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_get("/api/v1/openapi.json", handlers.openapi)
    app.router.add_post("/api/v1/files/retry", handlers.retry_files)
    app.router.add_post("/api/v1/files/{file_id}/retry", handlers.retry_file)
    # "retry" is the batch route's, not a file id: GET /api/v1/files/retry is then a 405
    # with Allow: POST (and OPTIONS does not advertise GET) instead of a 400 on the id.
    app.router.add_get(r"/api/v1/files/{file_id:(?!retry$)[^{}/]+}", handlers.get_file)
    return app
