"""Connecting to NATS (R-NATS-1): no credentials, an nkey seed, or a user JWT + seed.

No JetStream is used or required. The client reconnects forever; publishes while
disconnected raise at once (pending_size=0) instead of being buffered silently, so the
publisher never takes a buffered message for a delivered one.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.errors import SlowConsumerError

from arm_core.config import Settings, mask_urls_in, nats_keypair

log = logging.getLogger(__name__)

# The header that carries a message's id on every subject of the exchange (R-NATS-2):
# `<job_id>:<attempt>` on requests, set by the service on acks and results.
MSG_ID_HEADER = "Nats-Msg-Id"


async def confirm(nc: Client) -> None:
    """Returns once the server has read everything written on `nc` before the call:
    publishes and subscriptions alike.

    nats-py writes flush()'s PING straight to the socket, ahead of PUBs (and SUBs) still
    waiting for its flusher task: the first PONG proves nothing about them. The first
    flush hands them to the socket; the second PING follows them, so its PONG means the
    server has read them all."""
    await nc.flush(timeout=5)
    await nc.flush(timeout=5)


def auth_options(settings: Settings) -> dict[str, Any]:
    """nats.connect keyword arguments for the configured credentials.

    Settings.from_env has already checked them (arm-core stops at start, exit 2, on a
    seed or JWT that cannot work); the same check runs here for Settings built in code,
    so a bad seed is a ConfigError naming the variable, never a connection that retries
    forever."""
    seed, jwt = settings.nats_seed, settings.nats_jwt
    keypair = nats_keypair(seed, jwt)
    if keypair is None:
        return {}
    if not jwt:
        return {"nkeys_seed_str": seed}

    def user_jwt() -> bytearray:
        return bytearray(jwt.encode())

    def sign(nonce: str) -> bytes:
        return base64.b64encode(keypair.sign(nonce.encode()))

    return {"user_jwt_cb": user_jwt, "signature_cb": sign}


async def connect(
    client: Client,
    settings: Settings,
    name: str,
    on_state: Callable[[str], Awaitable[None]] | None = None,
    closing: Callable[[], bool] = lambda: False,
    **overrides: Any,
) -> None:
    """Connects `client`, retrying until the server is there, and logs state changes."""

    async def state(event: str) -> None:
        if on_state is not None:
            await on_state(event)

    async def disconnected() -> None:
        if not closing():
            log.warning("NATS disconnected", extra={"action": "nats_disconnected"})
        await state("disconnected")

    async def reconnected() -> None:
        log.info("NATS reconnected", extra={"action": "nats_reconnected"})
        await state("reconnected")

    last_error: dict[str, float] = {}

    async def error(exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):  # a message lost: count every one
            await state("slow_consumer")
        # While the server is down nats-py reports every failed attempt: log each kind of
        # error once per 30 s, not twice a second.
        text = mask_urls_in(f"{type(exc).__name__}: {exc}")  # a ws:// error names its URL
        now = time.monotonic()
        if not closing() and now - last_error.get(text, -1e9) >= 30:
            last_error[text] = now
            log.warning("NATS error: %s", text, extra={"action": "nats_error"})

    async def closed() -> None:
        await state("closed")

    options: dict[str, Any] = {
        "servers": list(settings.nats_urls),
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 2,
        "pending_size": 0,
        "disconnected_cb": disconnected,
        "reconnected_cb": reconnected,
        "error_cb": error,
        "closed_cb": closed,
        **auth_options(settings),
        **overrides,
    }
    await client.connect(**options)
