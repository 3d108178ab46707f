"""Running the real aiohttp app (real sockets) against a real PostgreSQL, connected as a
login of arm_api (and of arm_bridge too when the app runs the bridge: `serve` with
NATS_ENABLED=true)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from arm_core.config import Settings
from arm_core.devtools.testbed.sql import API_LOGIN, SERVE_LOGIN, as_login
from arm_core.runtime import create_app


def api_settings(db_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"database_url": db_url, "nats_enabled": False}
    values.update(overrides)
    login = SERVE_LOGIN if values["nats_enabled"] else API_LOGIN
    values["database_url"] = as_login(values["database_url"], login)
    return Settings(**values)


@contextlib.asynccontextmanager
async def running_api(settings: Settings) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(settings))) as http:
        yield http
