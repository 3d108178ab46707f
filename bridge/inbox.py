"""The inbox: the answers (envelopes) on RESULT_SUBJECT, received, buffered, and applied
in batches (docs/behaviour.md, "Inbox" and "The inbox buffer"; with RESULTS_STREAM,
docs/not-losing-answers.md, "The results stream").

The subscription callback (:meth:`Inbox.on_message`) parses and validates each message,
then puts the envelope in its worker's buffer — by job id, so a job's envelopes stay in
order. Each worker is a loop of its own under the process's supervisor (`inbox-<n>`);
one batch is one step, :meth:`Inbox.run_once`: what arrived since the last one, in one
`arm.apply_envelopes_v2` call and one transaction. A batch stays in the worker's hands
until its outcomes are known: when the loop crashes on something it does not expect (a
bug, an outcome a newer database returns to this older bridge), the batch is kept, and
after the restart it is applied one envelope at a time, so one that raises alone gets
its own outcome (`failed`) and never takes the others down with it.

With RESULTS_STREAM each message is settled with the server (`acks`) once its
envelope's outcome is final: acked after the transaction that applied it committed (or
the database said it changes nothing), terminated when it is garbage or raised even
alone. What the inbox will not apply it releases (:meth:`Inbox.release`): nacked back
to the stream, or dropped when it came by core NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from arm_core.bridge import events
from arm_core.bridge.buffer import Buffer, DropBursts
from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.envelope import Envelope, Rejected, parse_envelope
from arm_core.bridge.service import Loop, Service
from arm_core.db import DatabaseError, DatabasePoolExhausted, DatabaseUnavailable
from arm_core.instruments import Metrics
from arm_core.statuses import ApplyOutcome, JobStatus
from arm_core.store import Store

log = logging.getLogger(__name__)


# A message nacked back to the results stream is delivered again after this long: more
# than a fetch of this bridge's stays open at the server (bridge/stream_fetch.py waits
# 1 s), so that it goes to another bridge's fetch, not into one this bridge opened just
# before it paused — where it would sit, unread, until the consumer's ack wait.
NAK_DELAY_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class EnvelopeOutcome:
    """What became of one envelope of a batch: the database's outcome (or `failed`, or
    `busy` when it waits for an earlier envelope of its job), the job's attempt and its
    status after (both None when the database did not say)."""

    envelope: Envelope
    outcome: ApplyOutcome
    attempt: int | None = None
    status: JobStatus | None = None


@dataclass(eq=False)
class Inbox(Service):
    """Receives answers, buffers them, and applies them batch by batch (see the module's
    docstring)."""

    config: BridgeConfig
    store: Store
    counts: events.Counts = field(default_factory=events.Counts)
    # The process's counters (arm_core.instruments); a service made alone has its own.
    metrics: Metrics = field(default_factory=Metrics)
    name = "inbox"
    # One buffer and one worker per INBOX_WORKERS; a job's envelopes always share one
    # (by job id), so their order holds while the workers' batches run side by side.
    # Each holds its share of INBOX_BUFFER_SIZE envelopes and INBOX_BUFFER_BYTES.
    queues: list[Buffer] = field(init=False)
    # Set while the worker holds a batch because the database is unreachable.
    db_unreachable: bool = False
    # Per worker, the envelopes that lead its next batch, before anything in its buffer:
    # those that came back `busy`, or the one its loop waited for.
    _next_batch: list[list[Envelope]] = field(init=False)
    # True when the messages come from the results stream: each is settled with the
    # server once its envelope's outcome is final.
    acks: bool = False
    # Envelopes lost before the database saw them, told once per burst.
    drops: DropBursts = field(default_factory=DropBursts)
    # Set when a batch applied an answer: a job left the service's hands, so a paced
    # pipeline has room again (the runner hands the publisher's wake-up event here).
    answered: asyncio.Event | None = None
    # Per worker, the answers whose job was still queued, with the time they are applied
    # again, the soonest first.
    _snoozed: list[deque[tuple[float, Envelope]]] = field(init=False)
    # Per worker: its loop crashed with a batch in hand, which it applies one envelope at
    # a time once restarted.
    _one_at_a_time: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        s = self.config.settings
        n = s.inbox_workers
        self.queues = [
            Buffer(max(1, s.inbox_buffer_size // n), max(1, s.inbox_buffer_bytes // n))
            for _ in range(n)
        ]
        self._next_batch = [[] for _ in range(n)]
        self._snoozed = [deque() for _ in range(n)]
        self._one_at_a_time = [False] * n

    def worker_name(self, worker: int) -> str:
        return f"{self.name}-{worker}"

    def buffered(self) -> int:
        """Envelopes waiting in the buffers."""
        return sum(len(q) for q in self.queues)

    def held(self) -> int:
        """Envelopes received and not applied yet: in the buffers, or in a worker's hands
        (its batch, held while the database is away; those waiting for a busy job)."""
        in_hand = self._next_batch + self._snoozed
        return self.buffered() + sum(len(envelopes) for envelopes in in_hand)

    def room(self) -> tuple[int, int]:
        """How many more envelopes, and bytes, the buffers take now, all together."""
        rooms = [q.room() for q in self.queues]
        return sum(r[0] for r in rooms), sum(r[1] for r in rooms)

    def dropped(self) -> int:
        """Envelopes lost before the database saw them, whatever the reason."""
        return sum(n for key, n in self.counts.items() if key.startswith("dropped."))

    async def on_message(self, msg: Msg, settle: bool = True) -> None:
        """nats-py subscription callback: never raises. Waits for room in the buffer
        while the database is reachable and the worker runs; else releases the envelope.
        `settle=False`: a core NATS message replayed (bridge/replay.py)."""
        settle, limit = settle and self.acks, self.config.settings.inbox_max_payload_bytes
        self.counts["received"] += 1
        try:
            parsed = parse_envelope(msg.data, msg.headers, limit)
        except Exception as exc:  # a bug here must not kill the subscription
            parsed = Rejected("parse_error", f"{type(exc).__name__}: {exc}")
        if isinstance(parsed, Rejected):
            events.rejected(self, msg.subject, parsed)
            if settle:
                await self._settle(msg, terminate=True)
            return
        events.accepted(self, parsed)
        if settle:
            # Kept until acked: the message counts against the buffer as well as its row.
            parsed = dataclasses.replace(parsed, msg=msg, size=parsed.size + len(msg.data))
        worker = self._worker_of(parsed)
        queue = self.queues[worker]
        # While the database is unreachable, a message of the stream goes back at once:
        # another bridge may reach its database.
        while (parsed.msg is not None and self.db_unreachable) or not queue.put_nowait(parsed):
            if self.db_unreachable:
                await self.release([parsed], "buffer_full")
                return
            # Nobody will make room once the worker's loop has stopped (a loop never
            # started is a test stepping the inbox).
            supervisor = self.supervisor
            stopped = supervisor is not None and not supervisor.running(self.worker_name(worker))
            if self.tasks and stopped:
                await self.release([parsed], "shutdown")
                return
            # The database is there, the worker is only behind: wait for room.
            if await queue.put(parsed, self.config.full_recheck_seconds):
                break

    async def release(self, envelopes: list[Envelope], reason: str) -> None:
        """Envelopes this inbox will not apply (`reason`: buffer_full, shutdown): nacked
        when they came from the results stream, else lost before the database saw them."""
        s, why = self.config.settings, events.DROPPED_BECAUSE.get(reason, reason)
        why = why.format(size=s.inbox_buffer_size, bytes=s.inbox_buffer_bytes)
        for envelope in envelopes:
            if envelope.msg is None:
                self.drops.dropped(envelope, reason, why)
                events.dropped(self, envelope, reason)
            else:
                await self._settle(envelope.msg, nak=True)
        if returned := sum(e.msg is not None for e in envelopes):
            events.handed_back(self, returned, reason)

    async def probe(self, within: float = 2.0) -> bool:
        """Whether the database answers now (one cheap read, within `within` seconds);
        when it does, the inbox takes answers again."""
        try:
            async with asyncio.timeout(within):
                await self.store.answers(pool_timeout=within / 2)
        except (DatabaseError, TimeoutError):
            return False
        self.reachable()
        return True

    def reachable(self) -> None:
        """The database answered."""
        if self.db_unreachable:
            self.db_unreachable = False
            if self.acks:
                events.intake(self, None)
        self.drops.ended()

    async def stop(self, grace: float) -> None:
        await super().stop(grace)
        self.drops.ended()

    async def _settle(self, msg: Msg, terminate: bool = False, nak: bool = False) -> None:
        """Acks (or terminates, or nacks) a message of the results stream. A lost ack only
        means the message comes again: the database then calls it a duplicate."""
        try:
            if nak:
                await msg.nak(delay=NAK_DELAY_SECONDS)
                return
            await (msg.term() if terminate else msg.ack())
            events.settled(self, terminate)
        except Exception as exc:
            log.warning(
                "could not settle a message of the results stream (it comes again): %s",
                f"{type(exc).__name__}: {exc}",
                extra={"action": "stream_ack_failed"},
            )

    def loops(self) -> dict[str, Loop]:
        return {
            self.worker_name(w): functools.partial(self._work, w) for w in range(len(self.queues))
        }

    async def run_once(
        self, worker: int, stopping: asyncio.Event | None = None
    ) -> list[EnvelopeOutcome]:
        """One batch of `worker`: what leads its next batch, then what its buffer holds
        now, up to INBOX_BATCH_SIZE, in one arm.apply_envelopes_v2 call; every envelope's
        outcome, in the order applied. Holds the batch while the database is unreachable
        (dropping it only once `stopping` is set and the backoff has grown to its
        longest). Envelopes that come back `busy` are kept to lead the next batch."""
        queue, limit = self.queues[worker], self.config.settings.inbox_batch_size
        # The batch stays in `_next_batch` until its outcomes are known: a crash leaves it
        # there for the restarted loop. Answers waiting for their job to be published
        # again come first once their time has come.
        batch, snoozed, now = self._next_batch[worker], self._snoozed[worker], time.monotonic()
        due: list[Envelope] = []
        while snoozed and snoozed[0][0] <= now:
            due.append(snoozed.popleft()[1])
        batch[:0] = due
        while len(batch) < limit and queue:
            batch.append(queue.get_nowait())
        if not batch:
            return []
        stopping = stopping or asyncio.Event()
        if self._one_at_a_time[worker]:  # the loop crashed on this batch: one envelope at a time
            results = await self._one_by_one(batch, stopping, guarded=True)
            self._one_at_a_time[worker] = False
        else:
            results = await self._apply_until_done(batch, stopping)
        self._next_batch[worker] = [r.envelope for r in results if r.outcome is ApplyOutcome.BUSY]
        for r in results:
            if r.outcome is ApplyOutcome.NOT_PUBLISHED and self._patient(r.envelope):
                self.counts["not_published_waits"] += 1
                again = time.monotonic() + self.config.not_published_retry_seconds
                snoozed.append((again, r.envelope))
                if r.envelope.msg is not None:  # the stream must not give it to another
                    with contextlib.suppress(Exception):
                        await r.envelope.msg.in_progress()
            elif r.outcome is not ApplyOutcome.BUSY and r.envelope.msg is not None:
                await self._settle(r.envelope.msg, terminate=r.outcome is ApplyOutcome.FAILED)
        return results

    def _patient(self, envelope: Envelope) -> bool:
        """Whether an answer for a still-queued job is kept to be applied again: its
        request went out in a transaction that then rolled back, and the job is published
        again soon, with the same Nats-Msg-Id. Past the patience it is ignored."""
        age = time.monotonic() - envelope.received_at
        return age < self.config.not_published_patience_seconds

    async def _work(self, worker: int, stopping: asyncio.Event) -> None:
        """Applies the worker's buffer, batch by batch (run_once), until `stopping` is set
        and it is drained."""
        queue, leading, c = self.queues[worker], self._next_batch, self.config
        pause = c.busy_pause_seconds
        try:
            while not (stopping.is_set() and not queue and not leading[worker]):
                self.beat(self.worker_name(worker))
                if not leading[worker] and not queue:
                    first = await queue.get(0.5)
                    if first is not None:
                        leading[worker] = [first]
                results = await self.run_once(worker, stopping)
                if results and all(r.outcome is ApplyOutcome.BUSY for r in results):
                    # All waiting on others' commits: a publisher's takes milliseconds;
                    # a lock held longer (a DBA's open transaction) is asked less often.
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, c.busy_pause_max_seconds)
                else:
                    pause = c.busy_pause_seconds
        except asyncio.CancelledError:
            # Stopped past the shutdown grace: what waited here was never applied. (A
            # batch in flight may or may not have committed, and is not counted.)
            await self._release_held(worker)
            raise
        except Exception:
            # Unexpected: the supervisor logs it and starts this loop again, which then
            # applies the batch in hand one envelope at a time.
            self._one_at_a_time[worker] = bool(leading[worker])
            raise
        await self._release_held(worker)  # answers still waiting for their job's publish

    async def _release_held(self, worker: int) -> None:
        """Stopping: what the worker holds, or its buffer, goes (back)."""
        waiting, self._next_batch[worker] = self._next_batch[worker], []
        waiting += [e for _, e in self._snoozed[worker]]
        self._snoozed[worker].clear()
        await self.release(waiting + self.queues[worker].take(lambda e: True), "shutdown")

    async def _apply_until_done(
        self, batch: list[Envelope], stopping: asyncio.Event
    ) -> list[EnvelopeOutcome]:
        """Applies `batch`, holding it while the database is unreachable; a batch the
        database rejects is applied one envelope at a time. Returns the outcome of every
        envelope applied, in order; the others are released (with RESULTS_STREAM, as soon
        as the database is unreachable; core NATS ones at shutdown)."""
        c = self.config
        backoff = c.backoff_seconds
        while True:
            try:
                results = await self.apply(batch)
                self.reachable()
                return results
            except (DatabaseUnavailable, DatabasePoolExhausted) as exc:
                # Exhausted: the database is there, every connection busy; same batch again.
                unreachable = not isinstance(exc, DatabasePoolExhausted)
                if unreachable and not self.db_unreachable and self.acks:
                    events.intake(self, exc)
                self.db_unreachable = self.db_unreachable or unreachable
                events.held(self, len(batch), self.buffered(), exc)
                self.beat(self.worker_name(self._worker_of(batch[0])))
                if self.acks and unreachable:
                    # Pause: what the results stream keeps, of the batch and the buffers,
                    # goes back to it now, for a bridge that reaches its database; only
                    # core NATS answers are held.
                    back = [e for e in batch if e.msg is not None]
                    back += [e for q in self.queues for e in q.take(lambda e: e.msg is not None)]
                    await self.release(back, "buffer_full")
                    if not (batch := [e for e in batch if e.msg is None]):
                        return []
                if stopping.is_set() and backoff >= c.backoff_max_seconds:
                    await self.release(batch, "shutdown")
                    return []
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, c.backoff_max_seconds)
            except DatabaseError as exc:
                # A deadlock or serialization failure was tried again by the store
                # (arm_core.store) before it came here.
                self.reachable()
                if len(batch) > 1:
                    log.warning(
                        "a batch of %d envelopes failed as a whole; applying them one by one: %s",
                        len(batch),
                        exc,
                        extra={"action": "inbox_split", "count": len(batch)},
                    )
                    return await self._one_by_one(batch, stopping)
                events.outcome(self, batch[0], None, str(exc))
                return [EnvelopeOutcome(batch[0], ApplyOutcome.FAILED)]

    def _worker_of(self, envelope: Envelope) -> int:
        return envelope.job_id.int % len(self.queues)

    async def _one_by_one(
        self, batch: list[Envelope], stopping: asyncio.Event, guarded: bool = False
    ) -> list[EnvelopeOutcome]:
        """Applies each envelope of `batch` in a transaction of its own, in order; one
        whose job's earlier envelope came back `busy` waits with it. `guarded`: an
        envelope that raises anything but a database error is `failed` (logged with the
        error) instead of ending the loop."""
        results: list[EnvelopeOutcome] = []
        busy_jobs: set[uuid.UUID] = set()
        for envelope in batch:
            if envelope.job_id in busy_jobs:
                # Its job's earlier envelope waits: so does it.
                results.append(EnvelopeOutcome(envelope, ApplyOutcome.BUSY))
                continue
            try:
                alone = await self._apply_until_done([envelope], stopping)
            except Exception as exc:
                if not guarded:
                    raise
                events.outcome(self, envelope, None, f"{type(exc).__name__}: {exc}")
                alone = [EnvelopeOutcome(envelope, ApplyOutcome.FAILED)]
            results += alone
            if any(r.outcome is ApplyOutcome.BUSY for r in alone):
                busy_jobs.add(envelope.job_id)
        return results

    async def apply(self, batch: list[Envelope]) -> list[EnvelopeOutcome]:
        """Hands `batch` to arm.apply_envelopes_v2 in one transaction; records each
        outcome."""
        rows = await self.store.apply_envelopes(batch)
        for envelope, row in zip(batch, rows, strict=True):
            if row.outcome is ApplyOutcome.NOT_PUBLISHED and self._patient(envelope):
                continue  # applied again later (run_once): not an outcome yet
            events.outcome(self, envelope, row)
        events.applied_batch(self, Counter(row.outcome for row in rows))
        if self.answered is not None and any(r.outcome is ApplyOutcome.APPLIED for r in rows):
            self.answered.set()
        return [
            EnvelopeOutcome(envelope, row.outcome, row.attempt, row.status)
            for envelope, row in zip(batch, rows, strict=True)
        ]
