"""The aiohttp applications: the API of `arm-core serve` and the health port of
`arm-core bridge`. Routes and middlewares in one place; the process's pool, store and
bridge are added by arm_core.runtime, which runs them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

import arm_core
from arm_core.config import Settings
from arm_core.http import file_list, handlers
from arm_core.http.auth import TOKEN_DIGESTS, auth_middleware, token_digests, warn_unlevelled_tokens
from arm_core.http.errors import error_middleware
from arm_core.http.health import install_health
from arm_core.http.keys import SETTINGS, SHUTDOWN

OPENAPI_PATH = Path(__file__).with_name("openapi.json")
# The operator console: static files, no build step. index.html at /, the rest
# at /console/<name>; only these names are served, read once when the app is built.
CONSOLE_DIR = Path(arm_core.__file__).with_name("console")
CONSOLE_TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".json": "application/json",  # messages.json: the console's texts, English and Russian
}
CONSOLE = web.AppKey("console", dict)
# The console's pages run only their own files: no inline script or style, no other
# origin (it runs offline), no framing; data only from this server's API.
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


async def console(request: web.Request) -> web.Response:
    """GET / (index.html) and GET /console/<name>: the operator console's files (the
    data comes from /api/v1/*)."""
    found = request.app[CONSOLE].get(request.match_info.get("name", "index.html"))
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(
        body=body,
        content_type=content_type,
        charset="utf-8",
        headers={
            "Content-Security-Policy": CONSOLE_CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


# What a request needs beyond the viewer's "read" (arm_core.access), by its handler.
PERMISSIONS: dict[Callable[..., object], str] = {
    handlers.retry_file: "retry",
    handlers.retry_files: "retry",
}


def _new_app(settings: Settings, **kwargs: Any) -> web.Application:
    """An application with its settings, shutdown event, metrics and health endpoints."""
    app = web.Application(**kwargs)
    app[SETTINGS] = settings
    app[SHUTDOWN] = asyncio.Event()
    install_health(app)
    return app


def health_app(settings: Settings) -> web.Application:
    """`arm-core bridge`'s own small health port (its errors JSON like the API's)."""
    return _new_app(settings, middlewares=[error_middleware])


def api_app(settings: Settings) -> web.Application:
    """`arm-core serve`'s API, console and health endpoints."""
    warn_unlevelled_tokens(settings)
    app = _new_app(
        settings,
        middlewares=[error_middleware, auth_middleware(settings, PERMISSIONS)],
        client_max_size=settings.http_max_body_bytes,
    )
    app[TOKEN_DIGESTS] = token_digests(settings.api_tokens)
    app[handlers.OPENAPI] = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    app[CONSOLE] = {
        path.name: (path.read_bytes(), CONSOLE_TYPES[path.suffix])
        for path in sorted(CONSOLE_DIR.iterdir())
        if path.suffix in CONSOLE_TYPES
    }
    app.router.add_get("/api/v1/status", handlers.status)
    app.router.add_get("/api/v1/status/series", handlers.status_series)
    app.router.add_get("/api/v1/openapi.json", handlers.openapi)
    app.router.add_get("/", console)
    app.router.add_get("/console/{name}", console)
    app.router.add_get("/api/v1/whoami", handlers.whoami)
    app.router.add_get("/api/v1/files", file_list.list_files)
    app.router.add_post("/api/v1/files/retry", handlers.retry_files)
    app.router.add_post("/api/v1/files/{file_id}/retry", handlers.retry_file)
    # "retry" is the batch route's, not a file id: GET /api/v1/files/retry is then a 405
    # with Allow: POST (and OPTIONS does not advertise GET) instead of a 400 on the id.
    app.router.add_get(r"/api/v1/files/{file_id:(?!retry$)[^{}/]+}", handlers.get_file)
    return app
