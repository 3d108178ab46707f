"""The outbox publisher (R-OUT-1, R-ACK-2).

Each cycle, in one database transaction per batch:
claim queued jobs (FOR UPDATE SKIP LOCKED) → publish every request → confirm the server
has the batch (PING/PONG on a connection that never dropped meanwhile) → mark them
published → commit. If anything fails the transaction rolls back and the batch stays
queued for the next cycle: a job is never marked published unless its message reached
the server. (A batch that reached the server but could not be confirmed is published
again later with the same Nats-Msg-Id; services treat a repeated request as a repeat.)

Then overdue, unacked jobs are republished the same way with the same Nats-Msg-Id and
attempt, and jobs past OUTBOX_MAX_REPUBLISH are dead-lettered by the database.

Cycles run every OUTBOX_POLL_SECONDS and at once when a NOTIFY arrives (LISTEN is a
wake-up, polling is the backstop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.errors import MaxPayloadError
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from arm_core.config import Settings
from arm_core.db import DatabaseError, query, wrap_db_errors

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "arm_recognition_job_queued"
MSG_ID_HEADER = "Nats-Msg-Id"


class PublishFailed(Exception):
    """A batch could not be confirmed as received by NATS; it stays queued."""


@dataclass
class PublisherStats:
    published: int = 0
    republished: int = 0
    dead_lettered: int = 0
    # Dead-lettered at once because the request cannot be published (REQUEST_TOO_LARGE).
    unpublishable: int = 0
    failed_batches: int = 0
    batches: int = 0
    last_error: str | None = None
    last_cycle_at: float | None = None


@dataclass
class Publisher:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    nats: Client
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stats: PublisherStats = field(default_factory=PublisherStats)
    # NATS unreachable for longer than this is logged as an error (the first connect
    # at start-up takes a moment and is not an error).
    nats_grace_seconds: float = 5.0
    _nats_down_since: float | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _nats_down_logged: bool = False

    async def run(self, stopping: asyncio.Event) -> None:
        """Cycles until `stopping` is set; the batch in flight always finishes (commits
        or rolls back) and no new batch starts after that."""
        self._stopping = stopping
        while not stopping.is_set():
            try:
                await self.cycle()
            except DatabaseError as exc:
                self.stats.last_error = str(exc)
                log.warning("publisher cycle failed: %s", exc, extra={"action": "publish_cycle"})
            except Exception:
                log.exception("publisher cycle crashed", extra={"action": "publish_cycle"})
            await self._sleep(stopping)

    async def _sleep(self, stopping: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stopping.wait())]
        try:
            await asyncio.wait(
                waits, timeout=self.settings.outbox_poll_seconds, return_when="FIRST_COMPLETED"
            )
        finally:
            for w in waits:
                w.cancel()
        self.wake.clear()

    async def cycle(self) -> None:
        """One pass: publish everything queued, dead-letter, republish what is overdue."""
        self.stats.last_cycle_at = time.time()
        if not self.nats.is_connected:
            now = time.monotonic()
            self._nats_down_since = self._nats_down_since or now
            self.stats.last_error = "NATS not connected"
            if (
                not self._nats_down_logged
                and now - self._nats_down_since >= self.nats_grace_seconds
            ):
                log.error(
                    "NATS unreachable for %.0f s; queued jobs stay queued until it is back",
                    now - self._nats_down_since,
                    extra={"action": "publish", "reason": "nats_unavailable"},
                )
                self._nats_down_logged = True
            return
        if self._nats_down_logged:
            log.info("NATS is back; publishing", extra={"action": "publish"})
        self._nats_down_since, self._nats_down_logged = None, False
        await asyncio.gather(*(self._drain() for _ in range(self.settings.outbox_publishers)))
        if self._stopping.is_set():
            return
        await self._dead_letter()
        full = self.settings.outbox_batch_size
        while await self._republish_batch() == full and not self._stopping.is_set():
            pass

    async def _drain(self) -> None:
        """Publishes full batches until the queue is empty. OUTBOX_PUBLISHERS of these run
        at once: SKIP LOCKED gives each its own jobs, and while one batch waits for the
        server's confirmation or its commit, another is being claimed."""
        full = self.settings.outbox_batch_size
        while await self._publish_batch() == full and not self._stopping.is_set():
            pass

    async def _publish_batch(self) -> int:
        """Publishes one batch of queued jobs; returns how many were claimed (0 when the
        batch failed). Jobs whose request cannot be published are dead-lettered in the
        same transaction, so they never hold back the rest."""
        s = self.settings
        sent, unsendable = await self._claim_send_mark(
            "publish",
            "claim_queued_jobs",
            {
                "limit": s.outbox_batch_size,
                "tabular_timeout": s.tabular_reply_timeout_seconds,
                "image_timeout": s.image_reply_timeout_seconds,
            },
            lambda c: s.subject_for(c["pipeline"]),
            lambda sent, unsendable: [
                (
                    "mark_published",
                    {
                        "job_ids": [c["job_id"] for c in sent],
                        "subjects": [s.subject_for(c["pipeline"]) for c in sent],
                        "reply_deadlines": [c["reply_deadline"] for c in sent],
                    },
                ),
                (
                    "dead_letter_unpublishable",
                    {
                        "job_ids": [u.job["job_id"] for u in unsendable],
                        "error_codes": [u.code for u in unsendable],
                        "error_messages": [u.message for u in unsendable],
                    },
                ),
            ],
        )
        if sent:
            self.stats.published += len(sent)
            self.stats.batches += 1
            for c in sent:
                log.debug("published", extra=_job_extra("publish", c))
            log.info(
                "published %d jobs",
                len(sent),
                extra={"action": "publish", "count": len(sent)},
            )
        self.stats.unpublishable += len(unsendable)
        for u in unsendable:
            log.error(
                "dead-lettered: the request cannot be published: %s",
                u.message,
                extra={**_job_extra("dlq", u.job), "reason": u.code},
            )
        return len(sent) + len(unsendable)

    async def _republish_batch(self) -> int:
        """Republishes one batch of overdue unacked jobs; returns how many were claimed.
        A request that can no longer be published (the server's max_payload shrank) is
        left as it is and times out at its reply deadline."""
        s = self.settings
        sent, unsendable = await self._claim_send_mark(
            "republish",
            "claim_unacked_jobs",
            {
                "limit": s.outbox_batch_size,
                "ack_timeout": s.ack_timeout_seconds,
                "max_republish": s.outbox_max_republish,
            },
            lambda c: c["subject"],
            lambda sent, _: [("mark_republished", {"job_ids": [c["job_id"] for c in sent]})],
        )
        self.stats.republished += len(sent)
        for c in sent:
            log.info(
                "republished: no ack yet",
                extra={**_job_extra("republish", c), "count": c["republish_count"] + 1},
            )
        for u in unsendable:
            log.error(
                "cannot republish: %s",
                u.message,
                extra={**_job_extra("republish", u.job), "reason": u.code},
            )
        return len(sent) + len(unsendable)

    async def _claim_send_mark(
        self,
        action: str,
        claim: str,
        claim_params: dict[str, Any],
        subject_of: Callable[[dict[str, Any]], str],
        marks: Callable[[list[dict[str, Any]], list[Unsendable]], list[tuple[str, dict[str, Any]]]],
    ) -> tuple[list[dict[str, Any]], list[Unsendable]]:
        """In one transaction: claim a batch, publish and confirm it, mark what was sent
        and what could not be. Returns (sent, unsendable); both empty when there was
        nothing to do or the batch failed (then the transaction rolls back and the batch
        is untouched for the next cycle)."""
        try:
            with wrap_db_errors(action):
                async with self.pool.connection() as conn, conn.transaction():
                    cur = conn.cursor(row_factory=dict_row)
                    # The request goes out as PostgreSQL wrote it: no parse and re-dump.
                    cur.adapters.register_loader("jsonb", TextLoader)
                    await cur.execute(query(claim), claim_params)
                    claimed = await cur.fetchall()
                    if not claimed:
                        return [], []
                    unsendable = await self._send(
                        [(subject_of(c), c["msg_id"], c["request"]) for c in claimed], action
                    )
                    failed = {u.index for u in unsendable}
                    for u in unsendable:
                        u.job = claimed[u.index]
                    sent = [c for i, c in enumerate(claimed) if i not in failed]
                    for name, params in marks(sent, unsendable):
                        if params["job_ids"]:
                            await cur.execute(query(name), params)
                    return sent, unsendable
        except PublishFailed:
            return [], []

    async def _dead_letter(self) -> None:
        s = self.settings
        with wrap_db_errors("dead_letter_unacked"):
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    query("dead_letter_unacked"),
                    {"ack_timeout": s.ack_timeout_seconds, "max_republish": s.outbox_max_republish},
                )
                dead = await cur.fetchall()
        self.stats.dead_lettered += len(dead)
        for d in dead:
            log.warning(
                "dead-lettered: no ack after %d republishes",
                d["republish_count"],
                extra={
                    "action": "dlq",
                    "job_id": d["job_id"],
                    "attempt": d["attempt"],
                    "file_id": d["file_id"],
                    "reason": "NO_ACK",
                },
            )

    async def _send(
        self, messages: Sequence[tuple[str, str, Any]], action: str
    ) -> list[Unsendable]:
        """Publishes and confirms a batch. Returns the messages that cannot be published
        at all (larger than the server's max_payload, or refused one by one), which were
        left out; raises PublishFailed when the batch as a whole is not confirmed.

        Confirmed means: the connection was up before the first publish, nats-py did not
        reconnect in between (a reconnect can drop or replay buffered data), and the
        server answered a PING that went out after the last publish.
        """
        nc = self.nats
        unsendable: list[Unsendable] = []
        try:
            if not nc.is_connected:
                raise PublishFailed("NATS not connected")
            reconnects = nc.stats["reconnects"]
            try:
                for index, (subject, msg_id, body) in enumerate(messages):
                    payload = _dumps(body)
                    headers = {MSG_ID_HEADER: msg_id}
                    # The server counts the header block against max_payload too.
                    size = len(payload) + _header_bytes(headers)
                    if size > nc.max_payload:
                        unsendable.append(_too_large(index, size, nc.max_payload))
                        continue
                    try:
                        await nc.publish(subject, payload, headers=headers)
                    except MaxPayloadError:
                        unsendable.append(_too_large(index, size, nc.max_payload))
                    except (TypeError, ValueError) as exc:  # this message, not the link
                        unsendable.append(
                            Unsendable(index, "PUBLISH_FAILED", f"{type(exc).__name__}: {exc}")
                        )
                await confirm(nc)
            except Exception as exc:  # nats-py raises several unrelated types here
                raise PublishFailed(f"{type(exc).__name__}: {exc}") from exc
            if not nc.is_connected or nc.stats["reconnects"] != reconnects:
                raise PublishFailed("NATS connection dropped during the batch")
        except PublishFailed as exc:
            self.stats.failed_batches += 1
            self.stats.last_error = str(exc)
            log.error(
                "%s of %d jobs failed; they stay as they were: %s",
                action,
                len(messages),
                exc,
                extra={"action": action, "count": len(messages), "error": str(exc)},
            )
            raise
        return unsendable


@dataclass
class Unsendable:
    """A claimed job whose request cannot be published, and why (the job's error)."""

    index: int
    code: str
    message: str
    job: dict[str, Any] = field(default_factory=dict)


def _too_large(index: int, size: int, limit: int) -> Unsendable:
    return Unsendable(
        index,
        "REQUEST_TOO_LARGE",
        f"the request is {size} bytes; the NATS server accepts at most {limit} (max_payload)",
    )


def _header_bytes(headers: dict[str, str]) -> int:
    """Size of the NATS/1.0 header block nats-py sends for `headers`."""
    return len("NATS/1.0\r\n\r\n") + sum(len(f"{k}: {v}\r\n") for k, v in headers.items())


async def confirm(nc: Client) -> None:
    """Returns once the server has read everything published on `nc` before the call.

    nats-py writes flush()'s PING straight to the socket, ahead of PUBs (and SUBs) still
    waiting for its flusher task: the first PONG proves nothing about them. The first
    flush hands them to the socket; the second PING follows them, so its PONG means the
    server has read them all."""
    await nc.flush(timeout=5)
    await nc.flush(timeout=5)


def _job_extra(action: str, claimed: dict[str, Any]) -> dict[str, Any]:
    return {
        "action": action,
        "job_id": claimed["job_id"],
        "attempt": claimed["attempt"],
        "msg_id": claimed["msg_id"],
    }


def _dumps(body: Any) -> bytes:
    if isinstance(body, str):  # JSON text from the database
        return body.encode()
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
