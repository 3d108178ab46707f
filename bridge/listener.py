"""LISTEN arm_recognition_job_queued on a dedicated autocommit connection and set the
publisher's wake-up event on every notification. A wake-up only: if the connection
drops, it reconnects with backoff while polling keeps the publisher going."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from arm_core.bridge.publisher import NOTIFY_CHANNEL

log = logging.getLogger(__name__)


async def listen_for_queued_jobs(
    database_url: str,
    wake: asyncio.Event,
    stopping: asyncio.Event,
    poll: float = 1.0,
    on_state: Callable[[str], None] = lambda state: None,
) -> None:
    """`on_state` hears "ok" once LISTEN is in place and "reconnecting" when the
    connection is lost (GET /api/v1/status's bridge.listener)."""
    backoff = 0.5
    while not stopping.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                wake.set()  # whatever was queued while we were not listening
                on_state("ok")
                backoff = 0.5
                while not stopping.is_set():
                    async for _ in conn.notifies(timeout=poll):
                        wake.set()
        except psycopg.OperationalError as exc:
            on_state("reconnecting")
            log.warning(
                "LISTEN connection lost, polling carries on: %s",
                exc,
                extra={"action": "listen", "error": str(exc)},
            )
            try:
                await asyncio.wait_for(stopping.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(backoff * 2, 10)
