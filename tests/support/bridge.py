"""A bridge in the test's own event loop, with short periods (fast_settings,
running_bridge), and its log records by field.

The bridge under test connects as a login of arm_bridge (arm_core.devtools.testbed.sql),
not as the superuser the test's own connections use: fast_settings and running_bridge
turn the superuser's URL into that login's, so every bridge path runs with the role's
privileges."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.runner import Bridge
from arm_core.config import Settings
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import BRIDGE_LOGIN, as_login
from arm_core.store import Store

# The supervised loops of a bridge with the default settings and core NATS (two inbox
# workers; RESULTS_STREAM adds `stream` and `replay`).
LOOPS = ("publisher", "inbox-0", "inbox-1", "listen", "schedule", "nats-connect")


def fast_settings(db_url: str, nats_url: str, **overrides: Any) -> Settings:
    """Settings with short periods so the tests wait seconds, not minutes; the database
    as the bridge's login."""
    values: dict[str, Any] = {
        "database_url": as_login(db_url, BRIDGE_LOGIN),
        "nats_urls": (nats_url,),
        "outbox_poll_seconds": 0.2,
        "schedule_tick_seconds": 0.2,
        "ack_timeout_seconds": 30.0,
    }
    values.update(overrides)
    return Settings(**values)


def new_bridge(settings: Settings, pool: AsyncConnectionPool[Any], **kwargs: Any) -> Bridge:
    """A bridge as arm_core.runtime makes one: its config from `settings`, a Store on
    `pool`."""
    return Bridge(BridgeConfig(settings), Store(pool), **kwargs)


@contextlib.asynccontextmanager
async def running_bridge(settings: Settings, pool_url: str | None = None) -> AsyncIterator[Bridge]:
    """A bridge in this event loop, connected and subscribed before the body runs; its
    pool connects as the bridge's login."""
    pool = AsyncConnectionPool(
        as_login(pool_url or settings.require_database_url(), BRIDGE_LOGIN),
        open=False,
        min_size=1,
        max_size=5,
        timeout=5,
        kwargs={"autocommit": True},
    )
    await pool.open(wait=False)
    bridge = new_bridge(settings, pool)
    await bridge.start()
    try:
        await wait_for(lambda: bridge.nats_state() == "ok", 10, "bridge connected to NATS")
        yield bridge
    finally:
        await bridge.stop()
        await pool.close()


def logged(records: list[Any], **fields: Any) -> list[Any]:
    """Log records whose structured fields (extra=) match all of `fields`."""
    return [
        r for r in records if all(str(getattr(r, k, None)) == str(v) for k, v in fields.items())
    ]
