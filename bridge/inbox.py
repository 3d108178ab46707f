"""The inbox (R-ACK-1, R-IN-1): envelopes from files.tabular_parsed, queue group arm-core.

The subscription callback parses and validates; one worker applies what arrived since
its last call as ONE batch: one `arm.apply_envelopes` call, one transaction, envelopes
in arrival order (so per job in order). Under a burst batches grow up to
INBOX_BATCH_SIZE; when traffic is light a batch is one envelope and nothing waits.

Nothing is dropped while the database is reachable. When the worker falls behind, the
callback waits for room in the buffer (INBOX_BUFFER_SIZE) instead of dropping; the
messages meanwhile wait in nats-py's subscription queue. The buffer's other job is the
outage: while the database is unreachable the worker holds its batch and retries with
backoff, the buffer fills, and only once it is full are envelopes dropped — each one
counted (`stats.dropped`, by reason) and logged with its job id. Those jobs reach
`timeout` at their reply deadline and a retry recovers them.

A batch that the database rejects as a whole (one envelope raised inside it) is applied
again one envelope per transaction, so the one that cannot be applied gets its own
outcome (`failed`, logged with the error) and never fails the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from arm_core.bridge.envelope import Envelope, Rejected, parse_envelope
from arm_core.config import Settings
from arm_core.db import (
    DatabaseError,
    DatabaseUnavailable,
    is_transient,
    query,
    wrap_db_errors,
)

log = logging.getLogger(__name__)

# How long a full buffer makes the callback wait before it looks again whether the
# database has meanwhile become unreachable (then it drops instead of waiting).
_FULL_RECHECK_SECONDS = 0.5
# A batch that was all `busy` waits this long before it is tried again, doubling while
# it stays so, up to the maximum.
_BUSY_PAUSE_SECONDS = 0.005
_BUSY_PAUSE_MAX_SECONDS = 0.5


_DROPPED_BECAUSE = {
    "buffer_full": "the database has been unreachable for longer than INBOX_BUFFER_SIZE "
    "({size} envelopes) lasts",
    "shutdown": "the process stopped before it could apply it",
}


def _fields(envelope: Envelope, action: str, **more: Any) -> dict[str, Any]:
    """The structured log fields of a line about an envelope."""
    return {"action": action, "job_id": envelope.job_id, "msg_id": envelope.msg_id, **more}


def _dumps(value: Any) -> str:
    # allow_nan=False: envelope.storable() has replaced every non-finite number already;
    # should one slip through, this raises here instead of inside PostgreSQL.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@dataclass
class InboxStats:
    received: int = 0
    applied: int = 0
    # A valid envelope with nothing to change: duplicate, already_final, unknown_job, …
    ignored: int = 0
    # Garbage: not JSON, not schema-valid, no Nats-Msg-Id, too large.
    rejected: int = 0
    # Valid, but the database raised on it even alone (logged with the error).
    failed: int = 0
    # Schema-valid envelopes that were changed to be storable (NUL, NaN, …).
    made_storable: int = 0
    # Lost before the database saw them, by reason (buffer_full, slow_consumer, shutdown).
    dropped: Counter[str] = field(default_factory=Counter)
    # Every outcome the database returned, by name.
    outcomes: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    db_retries: int = 0


@dataclass
class Inbox:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    # One buffer and one worker per INBOX_WORKERS; a job's envelopes always share one
    # (by job id), so their order holds while the workers' batches run side by side.
    queues: list[asyncio.Queue[Envelope]] = field(init=False)
    stats: InboxStats = field(default_factory=InboxStats)
    # Set while the worker holds a batch because the database is unreachable.
    db_unreachable: bool = False

    def __post_init__(self) -> None:
        n = self.settings.inbox_workers
        size = max(1, self.settings.inbox_buffer_size // n)
        self.queues = [asyncio.Queue(maxsize=size) for _ in range(n)]

    def buffered(self) -> int:
        """Envelopes waiting in the buffers."""
        return sum(q.qsize() for q in self.queues)

    async def on_message(self, msg: Msg) -> None:
        """nats-py subscription callback: never raises. Waits for room in the buffer
        while the database is reachable; drops (counted, logged) only during an outage."""
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
        if parsed.made_storable:
            self.stats.made_storable += 1
            log.warning(
                "envelope made storable (NUL, NaN/Infinity or lone surrogates replaced): %s",
                ", ".join(parsed.made_storable)[:300],
                extra=_fields(parsed, "inbox_sanitize", status=parsed.status),
            )
        queue = self.queues[parsed.job_id.int % len(self.queues)]
        while True:
            try:
                queue.put_nowait(parsed)
                return
            except asyncio.QueueFull:
                if self.db_unreachable:
                    self.drop(parsed, "buffer_full")
                    return
            try:  # the database is there, the worker is only behind: wait for room
                await asyncio.wait_for(queue.put(parsed), _FULL_RECHECK_SECONDS)
                return
            except TimeoutError:
                continue

    def drop(self, envelope: Envelope, reason: str) -> None:
        """Counts and logs an envelope that is lost before the database saw it."""
        self.stats.dropped[reason] += 1
        why = _DROPPED_BECAUSE.get(reason, reason).format(size=self.settings.inbox_buffer_size)
        log.error(
            "dropped an envelope: %s; the job times out at its reply deadline unless the "
            "answer comes again",
            why,
            extra=_fields(envelope, "inbox_drop", reason=reason, status=envelope.status),
        )

    def slow_consumer(self) -> None:
        """nats-py dropped a message because its subscription queue was full."""
        self.stats.dropped["slow_consumer"] += 1

    async def run(self, stopping: asyncio.Event) -> None:
        """Runs one worker per buffer until `stopping` is set and the buffers are drained."""
        await asyncio.gather(*(self._work(q, stopping) for q in self.queues))

    async def _work(self, queue: asyncio.Queue[Envelope], stopping: asyncio.Event) -> None:
        """Applies the envelopes of `queue`, batch by batch, until `stopping` is set and
        it is drained. Envelopes the database calls `busy` (another transaction
        holds their job, e.g. a publisher about to commit the request they answer) lead
        the next batch, so they are applied before anything that arrived after them."""
        limit = self.settings.inbox_batch_size
        deferred: list[Envelope] = []
        pause = _BUSY_PAUSE_SECONDS
        try:
            while not (stopping.is_set() and queue.empty() and not deferred):
                batch, deferred = deferred, []
                if not batch:
                    try:
                        batch.append(await asyncio.wait_for(queue.get(), timeout=0.5))
                    except TimeoutError:
                        continue
                while len(batch) < limit and not queue.empty():
                    batch.append(queue.get_nowait())
                deferred = await self._apply_until_done(batch, stopping)
                if deferred and len(deferred) == len(batch):
                    # All waiting on others' commits: a publisher's takes milliseconds;
                    # a lock held longer (a DBA's open transaction) is asked less often.
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _BUSY_PAUSE_MAX_SECONDS)
                else:
                    pause = _BUSY_PAUSE_SECONDS
        except asyncio.CancelledError:
            # Stopped past the shutdown grace: what waited here was never applied. (A
            # batch in flight may or may not have committed, and is not counted.)
            while not queue.empty():
                deferred.append(queue.get_nowait())
            for envelope in deferred:
                self.drop(envelope, "shutdown")
            raise

    async def _apply_until_done(
        self, batch: list[Envelope], stopping: asyncio.Event
    ) -> list[Envelope]:
        """Applies `batch`, holding it while the database is unreachable. A batch the
        database rejects is split into single envelopes, each applied on its own.
        Returns the envelopes that came back `busy`, in order."""
        backoff = 0.2
        conflicts = 0
        while True:
            try:
                outcomes = await self.apply(batch)
                self.db_unreachable = False
                return [e for e, o in zip(batch, outcomes, strict=True) if o == "busy"]
            except DatabaseUnavailable as exc:
                self.db_unreachable = True
                self.stats.db_retries += 1
                log.warning(
                    "database unavailable, holding %d envelopes (%d more waiting): %s",
                    len(batch),
                    self.buffered(),
                    exc,
                    extra={"action": "inbox_hold", "count": len(batch)},
                )
                if stopping.is_set() and backoff > 5:
                    for envelope in batch:
                        self.drop(envelope, "shutdown")
                    return []
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except DatabaseError as exc:
                self.db_unreachable = False
                if is_transient(exc) and conflicts < 3:  # deadlock, serialization: again
                    conflicts += 1
                    await asyncio.sleep(0.05 * conflicts)
                    continue
                if len(batch) > 1:
                    log.warning(
                        "a batch of %d envelopes failed as a whole; applying them one by one: %s",
                        len(batch),
                        exc,
                        extra={"action": "inbox_split", "count": len(batch)},
                    )
                    busy: list[Envelope] = []
                    for envelope in batch:
                        if any(b.job_id == envelope.job_id for b in busy):
                            busy.append(envelope)  # its job's earlier envelope waits: so does it
                        else:
                            busy += await self._apply_until_done([envelope], stopping)
                    return busy
                self._record(batch[0], "failed", None, error=str(exc))
                return []

    async def apply(self, batch: list[Envelope]) -> list[str]:
        """Hands `batch` to arm.apply_envelopes in one transaction; logs and counts each
        outcome. Returns the outcomes in the batch's order."""
        payload = Jsonb([e.row() for e in batch], dumps=_dumps)
        with wrap_db_errors("apply_envelopes"):
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(query("apply_envelopes"), {"envelopes": payload})
                rows = await cur.fetchall()
        if len(rows) != len(batch):
            raise DatabaseError(f"apply_envelopes returned {len(rows)} rows for {len(batch)}")
        self.stats.batches += 1
        for envelope, row in zip(batch, rows, strict=True):
            self._record(envelope, row["outcome"], row["attempt"])
        outcomes = Counter(row["outcome"] for row in rows)
        if outcomes["applied"]:
            # One line per batch at INFO; one per envelope at DEBUG (a line per envelope
            # cost a fifth of the bridge's CPU in a burst).
            log.info(
                "applied %d envelopes in one transaction (%s)",
                outcomes["applied"],
                ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())),
                extra={"action": "inbox_batch", "count": outcomes["applied"]},
            )
        return [row["outcome"] for row in rows]

    def _record(
        self, envelope: Envelope, outcome: str, attempt: int | None, error: str | None = None
    ) -> None:
        self.stats.outcomes[outcome] += 1
        if outcome == "busy":  # not an outcome yet: it is applied again
            return
        action = "ack" if envelope.is_ack else "result"
        extra = _fields(envelope, action, attempt=attempt, status=envelope.status)
        if outcome == "applied":
            self.stats.applied += 1
            log.debug("%s applied", action, extra=extra)
        elif outcome == "failed":
            self.stats.failed += 1
            log.error(
                "%s could not be applied: %s",
                action,
                error,
                extra={**extra, "reason": "apply_error", "outcome": outcome},
            )
        else:
            self.stats.ignored += 1
            level = logging.INFO if outcome == "duplicate" else logging.WARNING
            log.log(
                level,
                "%s ignored: %s",
                action,
                outcome,
                extra={**extra, "reason": outcome, "outcome": outcome},
            )
