"""Connecting to NATS (R-NATS-1): no credentials, an nkey seed, or a user JWT + seed.

No JetStream is used or required, unless RESULTS_STREAM asks for the capture of answers
(bridge/stream_setup.py). The client reconnects forever; publishes while disconnected
raise at once (pending_size=0) instead of being buffered silently, so the publisher
never takes a buffered message for a delivered one.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.errors import FlushTimeoutError, SlowConsumerError

from arm_core.config import CONFIRM_FLUSH_SECONDS, Settings
from arm_core.nats_credentials import nats_keypair
from arm_core.redaction import mask_urls_in

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
    server has read them all. The publisher waits for it inside its transaction: the
    sessions' idle_in_transaction_session_timeout is above the two flushes' bound
    (arm_core.config.PUBLISH_CONFIRM_SECONDS).

    A flush that times out makes the connection start over (force_reconnect): nats-py
    leaves the timed-out PING's future in its queue, and the server's late PONG then ends
    its read loop without a word — the connection still says connected, sends, and never
    receives again (a server paused for seconds did it: the bridge's fetches from the
    results stream went unanswered for good). A reconnect gives a new read loop and an
    empty queue."""
    try:
        await nc.flush(timeout=CONFIRM_FLUSH_SECONDS)
        await nc.flush(timeout=CONFIRM_FLUSH_SECONDS)
    except FlushTimeoutError:
        log.warning(
            "NATS did not answer a PING within %g s: connecting again",
            CONFIRM_FLUSH_SECONDS,
            extra={"action": "nats_reconnect"},
        )
        with contextlib.suppress(Exception):
            await nc.force_reconnect()
        raise


def refusal(nc: Client, before: Exception | None, what: str) -> Exception | None:
    """The server's refusal of `what` ("publish", 'subscription to "<subject>"') since
    nc.last_error was `before`, if any. A user's publish or SUB that is not allowed is
    dropped by the server, which keeps the connection and sends -ERR ahead of confirm()'s
    PONG; nats-py only hands it to the error callback and keeps it as last_error."""
    error = nc.last_error
    refused = f"permissions violation for {what}".lower() in str(error).lower()
    return error if error is not None and error is not before and refused else None


def auth_options(settings: Settings) -> dict[str, Any]:
    """nats.connect keyword arguments for the configured credentials. nats_keypair checks
    them again for Settings built in code: a bad seed is a ConfigError naming the
    variable, never a connection that retries forever."""
    seed, jwt = settings.nats_seed.get_secret_value(), settings.nats_jwt.get_secret_value()
    keypair = nats_keypair(seed, jwt)
    if keypair is None:
        return {}
    if not jwt:
        return {"nkeys_seed_str": seed}
    return {
        "user_jwt_cb": lambda: bytearray(jwt.encode()),
        "signature_cb": lambda nonce: base64.b64encode(keypair.sign(nonce.encode())),
    }


async def connect(
    client: Client,
    settings: Settings,
    name: str,
    on_reconnect: Callable[[], None] = lambda: None,
    on_slow_consumer: Callable[[], None] = lambda: None,
    closing: Callable[[], bool] = lambda: False,
    **overrides: Any,
) -> None:
    """Connects `client`, retrying until the server is there, and logs state changes;
    `on_slow_consumer` hears of each message lost because its subscription's queue was
    full."""

    async def disconnected() -> None:
        if not closing():
            log.warning("NATS disconnected", extra={"action": "nats_disconnected"})

    async def reconnected() -> None:
        log.info("NATS reconnected", extra={"action": "nats_reconnected"})
        on_reconnect()

    last_error: dict[str, float] = {}

    async def error(exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            on_slow_consumer()
        # While the server is down nats-py reports every failed attempt: log each kind of
        # error once per 30 s, not twice a second.
        text = mask_urls_in(f"{type(exc).__name__}: {exc}")  # a ws:// error names its URL
        now = time.monotonic()
        if not closing() and now - last_error.get(text, -1e9) >= 30:
            last_error[text] = now
            log.warning("NATS error: %s", text, extra={"action": "nats_error"})

    async def lame_duck() -> None:
        # The server is going away (a planned restart: nats-server --signal ldm) and will
        # close this connection within seconds. A connection the server closes can lose
        # what was in flight on it; one the client closes loses nothing it sent. So move
        # now, when the pool holds another server; with only this one, stay until it
        # closes (there is nowhere to go).
        others = len(client.servers) > 1
        log.info(
            "NATS server entering lame-duck mode: %s",
            "moving to another server" if others else "staying until it closes (no other)",
            extra={"action": "nats_lame_duck"},
        )
        if others:
            await client.force_reconnect()

    # The one SSL context of arm_core.tls, when NATS TLS is configured. nats-py speaks TLS
    # when the server's first message (INFO) says it requires it, which anyone in the
    # middle could not say; with NATS_TLS_HANDSHAKE_FIRST the handshake comes first.
    tls = settings.nats_tls_context()
    options: dict[str, Any] = {
        "servers": list(settings.nats_urls),
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "pending_size": 0,
        "disconnected_cb": disconnected,
        "reconnected_cb": reconnected,
        "error_cb": error,
        "lame_duck_mode_cb": lame_duck,
        **auth_options(settings),
        **({"tls": tls, "tls_handshake_first": settings.nats_tls_handshake_first} if tls else {}),
        **overrides,
    }
    await client.connect(**options)
