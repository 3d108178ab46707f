"""The inbox (R-ACK-1, R-IN-1): envelopes from files.tabular_parsed, queue group arm-core.

The subscription callback only parses and enqueues; one worker applies envelopes in
arrival order through the SQL functions. Garbage is logged with a reason and dropped.
While the database is unreachable the worker keeps the envelope and retries with
backoff; later envelopes wait in a bounded queue (INBOX_BUFFER_SIZE). Only when that is
full is a message dropped, and that is logged as loudly as it deserves.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.envelope import Envelope, Rejected, parse_envelope
from arm_core.config import Settings
from arm_core.db import DatabaseUnavailable, query, wrap_db_errors

log = logging.getLogger(__name__)


def _fields(envelope: Envelope, action: str, **more: Any) -> dict[str, Any]:
    """The structured log fields of a line about an envelope."""
    return {"action": action, "job_id": envelope.job_id, "msg_id": envelope.msg_id, **more}


@dataclass
class InboxStats:
    received: int = 0
    applied: int = 0
    ignored: int = 0
    rejected: int = 0
    overflowed: int = 0
    db_retries: int = 0


@dataclass
class Inbox:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    queue: asyncio.Queue[Envelope] = field(init=False)
    stats: InboxStats = field(default_factory=InboxStats)

    def __post_init__(self) -> None:
        self.queue = asyncio.Queue(maxsize=self.settings.inbox_buffer_size)

    async def on_message(self, msg: Msg) -> None:
        """nats-py subscription callback: never raises, never blocks on the database."""
        self.stats.received += 1
        try:
            parsed = parse_envelope(msg.data, msg.headers, self.settings.inbox_max_payload_bytes)
        except Exception as exc:  # a bug here must not kill the subscription
            parsed = Rejected("parse_error", f"{type(exc).__name__}: {exc}")
        if isinstance(parsed, Rejected):
            self.stats.rejected += 1
            log.warning(
                "dropped a message from %s: %s",
                msg.subject,
                parsed.detail,
                extra={
                    "action": "inbox_drop",
                    "reason": parsed.reason,
                    "job_id": parsed.job_id,
                    "msg_id": parsed.msg_id,
                },
            )
            return
        try:
            self.queue.put_nowait(parsed)
        except asyncio.QueueFull:
            self.stats.overflowed += 1
            log.error(
                "inbox buffer full (%d): dropped an envelope; the database has been "
                "unreachable for too long",
                self.queue.maxsize,
                extra=_fields(parsed, "inbox_drop", reason="buffer_full", status=parsed.status),
            )

    async def run(self, stopping: asyncio.Event) -> None:
        """Applies queued envelopes until `stopping` is set and the queue is drained."""
        while not (stopping.is_set() and self.queue.empty()):
            try:
                envelope = await asyncio.wait_for(self.queue.get(), timeout=0.5)
            except TimeoutError:
                continue
            await self._apply_until_done(envelope, stopping)
            self.queue.task_done()

    async def _apply_until_done(self, envelope: Envelope, stopping: asyncio.Event) -> None:
        backoff = 0.2
        while True:
            try:
                await self.apply(envelope)
                return
            except DatabaseUnavailable as exc:
                self.stats.db_retries += 1
                log.warning(
                    "database unavailable, holding the envelope (%d more waiting): %s",
                    self.queue.qsize(),
                    exc,
                    extra=_fields(envelope, "inbox_hold"),
                )
                if stopping.is_set() and backoff > 5:
                    log.error(
                        "shutting down with the database unreachable: envelope not applied",
                        extra=_fields(envelope, "inbox_drop", reason="shutdown"),
                    )
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:
                log.exception(
                    "envelope could not be applied; dropped",
                    extra=_fields(envelope, "inbox_drop", reason="apply_error"),
                )
                return

    async def apply(self, envelope: Envelope) -> str:
        """Hands one envelope to apply_ack / apply_result and logs the outcome."""
        if envelope.is_ack:
            name, params = "apply_ack", envelope.ack_params()
        else:
            name, params = "apply_result", envelope.result_params()
            if params["metrics"] is not None:
                params["metrics"] = Jsonb(params["metrics"])
        with wrap_db_errors(name):
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(query(name), params)
                row = await cur.fetchone()
        assert row is not None
        outcome: str = row["outcome"]
        action = "ack" if envelope.is_ack else "result"
        extra = _fields(envelope, action, attempt=row["attempt"], status=envelope.status)
        if outcome == "applied":
            self.stats.applied += 1
            log.info("%s applied", extra["action"], extra=extra)
        else:
            self.stats.ignored += 1
            level = logging.INFO if outcome == "duplicate" else logging.WARNING
            log.log(
                level,
                "%s ignored: %s",
                extra["action"],
                outcome,
                extra={**extra, "reason": outcome, "outcome": outcome},
            )
        return outcome
