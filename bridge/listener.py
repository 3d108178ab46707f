"""LISTEN arm_recognition_job_queued on a dedicated autocommit connection and set the
publisher's wake-up event on every notification, and once LISTEN is (again) in place.
A wake-up only: if the connection drops, it reconnects with backoff while polling keeps
the publisher going."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from enum import StrEnum

import psycopg
from psycopg.conninfo import make_conninfo

from arm_core.bridge.service import Service, stopped_within
from arm_core.config import IDLE_IN_TRANSACTION_TIMEOUT_SECONDS
from arm_core.db import Outage, connection_options
from arm_core.redaction import mask_urls_in

log = logging.getLogger(__name__)

# What arm.job's insert trigger notifies (db/functions): a job was queued.
NOTIFY_CHANNEL = "arm_recognition_job_queued"


class ListenerState(StrEnum):
    """The LISTEN connection (GET /api/v1/status's bridge.listener)."""

    CONNECTING = "connecting"
    OK = "ok"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"


@dataclass(eq=False)
class Listener(Service):
    database_url: str
    wake: asyncio.Event
    # DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS, like every session of the process.
    idle_in_transaction: float = IDLE_IN_TRANSACTION_TIMEOUT_SECONDS
    # How often the wait for a notification looks whether it should stop.
    poll_seconds: float = 1.0
    backoff_max_seconds: float = 10.0
    state: ListenerState = ListenerState.CONNECTING
    # The process's (arm_core.instruments): a lost connection is part of its outage.
    outage: Outage = field(default_factory=Outage)
    name = "listen"

    def conninfo(self) -> str:
        """The LISTEN connection's: its URL with the options of every session."""
        options = connection_options(
            self.database_url, idle_in_transaction=self.idle_in_transaction
        )
        return make_conninfo(self.database_url, **options)

    async def run(self, stopping: asyncio.Event) -> None:
        backoff = 0.5
        while not stopping.is_set():
            self.beat()
            try:
                conninfo = self.conninfo()
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.wake.set()  # whatever was queued while we were not listening
                    if self.state is ListenerState.RECONNECTING:
                        log.info("LISTEN connection back", extra={"action": "listen"})
                    self.state = ListenerState.OK
                    self.outage.available()
                    backoff = 0.5
                    while not stopping.is_set():
                        self.beat()
                        async for _ in conn.notifies(timeout=self.poll_seconds):
                            self.wake.set()
            except psycopg.OperationalError as exc:
                # Logged once per loss; the outage itself is self.outage's to log.
                if self.state is not ListenerState.RECONNECTING:
                    log.warning(
                        "LISTEN connection lost, polling carries on: %s",
                        mask_urls_in(str(exc)),
                        extra={"action": "listen"},
                    )
                self.state = ListenerState.RECONNECTING
                self.outage.failed(f"listen: {mask_urls_in(str(exc))}")
                await stopped_within(stopping, backoff)
                backoff = min(backoff * 2, self.backoff_max_seconds)
