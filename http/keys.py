"""What an application of `arm-core serve` or `arm-core bridge` holds, under aiohttp's
typed keys (arm_core.runtime puts the store and the bridge in). The API does not import
the bridge: it sees it as a :class:`BridgeView`."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web

from arm_core.config import Settings
from arm_core.metrics import AppMetrics, BridgeState
from arm_core.store import Store


class Liveness(Protocol):
    def live(self) -> tuple[bool, dict[str, str]]: ...


class BridgeView(Protocol):
    """What the API reads of its process's bridge (arm_core.bridge.runner.Bridge)."""

    name: str

    @property
    def supervisor(self) -> Liveness: ...

    def nats_state(self) -> str: ...

    def listener_status(self) -> str: ...

    def metrics_state(self) -> BridgeState: ...


SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
# The bridge this process runs, from its start on (absent: none, or not started yet).
BRIDGE_VIEW: web.AppKey[BridgeView] = web.AppKey("bridge_view")
# The gauges of GET /metrics, the cached status of GET /api/v1/status, and the process's
# instruments (its counters, outage and pool exhaustion), handed to its Store and bridge.
METRICS = web.AppKey("metrics", AppMetrics)
# Set to stop the process (arm_core.http.server.run): by SIGINT or SIGTERM, or by the
# bridge when it cannot go on (its `fatal` then makes the command exit 2).
SHUTDOWN = web.AppKey("shutdown", asyncio.Event)
