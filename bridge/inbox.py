"""The inbox (R-ACK-1, R-IN-1): envelopes from files.tabular_parsed, queue group arm-core.

The subscription callback parses and validates; one worker applies what arrived since
its last call as ONE batch: one `arm.apply_envelopes_v2` call, one transaction, envelopes
in arrival order (so per job in order). Under a burst batches grow up to
INBOX_BATCH_SIZE; when traffic is light a batch is one envelope and nothing waits.

Nothing is dropped while the database is reachable. When the worker falls behind, the
callback waits for room in the buffer (INBOX_BUFFER_SIZE) instead of dropping; the
messages meanwhile wait in nats-py's subscription queue. The buffer's other job is the
outage: while the database is unreachable the worker holds its batch and retries with
backoff, the buffer fills, and only once it is full are envelopes dropped — each one
counted (`counts`, `dropped.<reason>`) and logged with its job id. Those jobs reach
`timeout` at their reply deadline and a retry recovers them.

A batch that the database rejects as a whole (one envelope raised inside it) is applied
again one envelope per transaction, so the one that cannot be applied gets its own
outcome (`failed`, logged with the error) and never fails the others.

With RESULTS_STREAM the messages come from a JetStream consumer (bridge/runner.py) and
the inbox settles each one with the server (`acks`): a message is acked only once its
envelope's outcome is final — after the transaction that applied it committed, or once
the database said it changes nothing (duplicate, already_final, …); garbage and an
envelope the database raised on even alone are logged, counted and terminated (`term`:
never delivered again); `busy` ones wait for their next batch. A dropped one (buffer
full, shutdown) is not acked, so the stream delivers it again.

One batch is one step, :meth:`Inbox.run_once`: it applies what a worker has buffered now
and returns every envelope's outcome. The workers' loops call it; so can a test.

Each worker is a loop of its own under the process's supervisor (bridge/service.py,
`inbox-<n>`). A batch stays in the worker's hands until its outcomes are known: when the
loop crashes on something it does not expect (a bug, an outcome a newer database returns
to this older bridge), the batch is kept, and after the restart it is applied again one
envelope at a time, so an envelope that raises alone gets its own outcome (`failed`) and
never takes the others, or the process, down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from arm_core.bridge import events
from arm_core.bridge.envelope import Envelope
from arm_core.bridge.intake import Intake
from arm_core.bridge.service import Loop
from arm_core.db import DatabaseError, DatabasePoolExhausted, DatabaseUnavailable
from arm_core.statuses import ApplyOutcome, JobStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EnvelopeOutcome:
    """What became of one envelope of a batch: the database's outcome (or `failed`, or
    `busy` when it waits for an earlier envelope of its job), the job's attempt and its
    status after (both None when the database did not say)."""

    envelope: Envelope
    outcome: ApplyOutcome
    attempt: int | None = None
    status: JobStatus | None = None


@dataclass(frozen=True)
class InboxStep:
    """What one :meth:`Inbox.run_once` did: every envelope it took, with its outcome, in
    the order applied; those that came back `busy` and lead the worker's next batch; and
    those it let go without an outcome: handed back to the results stream while the
    database was unreachable, or dropped because the process stopped meanwhile."""

    results: tuple[EnvelopeOutcome, ...] = ()
    deferred: tuple[Envelope, ...] = ()
    dropped: tuple[Envelope, ...] = ()

    def outcomes(self) -> Counter[ApplyOutcome]:
        return Counter(r.outcome for r in self.results)

    def __add__(self, other: InboxStep) -> InboxStep:
        return InboxStep(
            self.results + other.results,
            self.deferred + other.deferred,
            self.dropped + other.dropped,
        )


@dataclass(eq=False)
class Inbox(Intake):
    """Applies what the intake buffered, batch by batch (see the module's docstring)."""

    def loops(self) -> dict[str, Loop]:
        """One loop per worker: inbox-0, inbox-1, …"""
        return {
            self.worker_name(w): functools.partial(self._work, w) for w in range(len(self.queues))
        }

    async def run(self, stopping: asyncio.Event) -> None:
        """Runs one worker per buffer until `stopping` is set and the buffers are drained
        (unsupervised: start() runs each worker as a loop of its own)."""
        await asyncio.gather(*(self._work(w, stopping) for w in range(len(self.queues))))

    async def run_once(
        self, worker: int | None = None, stopping: asyncio.Event | None = None
    ) -> InboxStep:
        """One batch of `worker` (of every worker, one after the other, when None): what
        leads its next batch, then what its buffer holds now, up to INBOX_BATCH_SIZE, in
        one arm.apply_envelopes_v2 call. Holds the batch while the database is unreachable
        (dropping it only once `stopping` is set and the backoff has grown past 5 s).
        Envelopes that come back `busy` are kept to lead the worker's next batch."""
        if worker is None:
            step = InboxStep()
            for w in range(len(self.queues)):
                step += await self.run_once(w, stopping)
            return step
        queue, limit = self.queues[worker], self.config.settings.inbox_batch_size
        # The batch stays in `_leading` until its outcomes are known: a crash leaves it
        # there for the restarted loop. Answers waiting for their job to be published
        # again come first once their time has come.
        batch = self._leading[worker]
        batch[:0] = self._waiting[worker].due(time.monotonic())
        while len(batch) < limit and not queue.empty():
            batch.append(queue.get_nowait())
        if not batch:
            return InboxStep()
        self.fault("inbox")
        stopping = stopping or asyncio.Event()
        if self._suspect[worker]:  # the loop crashed on this batch: one envelope at a time
            results, dropped = await self._one_by_one(batch, stopping, guarded=True)
            self._suspect[worker] = False
        else:
            results, dropped = await self._apply_until_done(batch, stopping)
        deferred = [r.envelope for r in results if r.outcome is ApplyOutcome.BUSY]
        self._leading[worker] = deferred
        for r in results:
            if r.outcome is ApplyOutcome.NOT_PUBLISHED and self._patient(r.envelope):
                await self._wait_for_publish(worker, r.envelope)
            elif r.outcome is not ApplyOutcome.BUSY and r.envelope.msg is not None:
                await self._settle(r.envelope.msg, terminate=r.outcome is ApplyOutcome.FAILED)
        return InboxStep(tuple(results), tuple(deferred), tuple(dropped))

    def _patient(self, envelope: Envelope) -> bool:
        """Whether an answer for a still-queued job is kept to be applied again: its
        request went out in a transaction that then rolled back (its publisher lost the
        database, or was killed, between the send and the commit), and the job is
        published again soon, with the same Nats-Msg-Id and attempt. Past the patience
        it is ignored, as the database said."""
        age = time.monotonic() - envelope.received_at
        return age < self.config.not_published_patience_seconds

    async def _wait_for_publish(self, worker: int, envelope: Envelope) -> None:
        self.counts["not_published_waits"] += 1
        self._waiting[worker].add(
            envelope, time.monotonic() + self.config.not_published_retry_seconds
        )
        if envelope.msg is not None:  # the stream must not give it to another meanwhile
            with contextlib.suppress(Exception):
                await envelope.msg.in_progress()

    async def _work(self, worker: int, stopping: asyncio.Event) -> None:
        """Applies the envelopes of the worker's buffer, batch by batch (run_once), until
        `stopping` is set and it is drained. Envelopes the database calls `busy` (another
        transaction holds their job, e.g. a publisher about to commit the request they
        answer) lead the next batch, so they are applied before anything that arrived
        after them."""
        queue, leading, c = self.queues[worker], self._leading, self.config
        pause = c.busy_pause_seconds
        name = self.worker_name(worker)
        try:
            while not (stopping.is_set() and queue.empty() and not leading[worker]):
                self.beat(name)
                if not leading[worker] and queue.empty():
                    first = await queue.get(0.5)
                    if first is not None:
                        leading[worker] = [first]
                    elif not self._waiting[worker].ready(time.monotonic()):
                        continue
                step = await self.run_once(worker, stopping)
                if step.deferred and len(step.deferred) == len(step.results):
                    # All waiting on others' commits: a publisher's takes milliseconds;
                    # a lock held longer (a DBA's open transaction) is asked less often.
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, c.busy_pause_max_seconds)
                else:
                    pause = c.busy_pause_seconds
            # Stopping: answers still waiting for their job's publish go (back).
            await self.let_go(self._waiting[worker].take_all(), "shutdown")
        except asyncio.CancelledError:
            # Stopped past the shutdown grace: what waited here was never applied. (A
            # batch in flight may or may not have committed, and is not counted.)
            waiting, leading[worker] = leading[worker], []
            waiting += self._waiting[worker].take_all()
            while not queue.empty():
                waiting.append(queue.get_nowait())
            await self.let_go(waiting, "shutdown")
            raise
        except Exception:
            # Unexpected: the supervisor logs it and starts this loop again, which then
            # applies the batch in hand one envelope at a time.
            self._suspect[worker] = bool(leading[worker])
            raise

    async def _apply_until_done(
        self, batch: list[Envelope], stopping: asyncio.Event
    ) -> tuple[list[EnvelopeOutcome], list[Envelope]]:
        """Applies `batch`, holding it while the database is unreachable. A batch the
        database rejects is split into single envelopes, each applied on its own.
        Returns every envelope's outcome in the batch's order (`busy` ones are applied
        again later), and the envelopes let go: with RESULTS_STREAM, its messages are
        handed back to it as soon as the database is unreachable (the inbox steps
        aside, bridge/stream.py stops fetching); the others are dropped at shutdown."""
        c = self.config
        backoff = c.backoff_seconds
        gone: list[Envelope] = []
        while True:
            try:
                results = await self.apply(batch)
                self.reachable()
                return results, gone
            except (DatabaseUnavailable, DatabasePoolExhausted) as exc:
                # Exhausted: the database is there, every connection busy; same batch again.
                unreachable = not isinstance(exc, DatabasePoolExhausted)
                if unreachable and not self.db_unreachable and self.acks:
                    events.intake_paused(self, exc)
                self.db_unreachable = self.db_unreachable or unreachable
                events.held(self, len(batch), self.buffered(), exc)
                self.beat(self.worker_name(self._worker_of(batch[0])))
                if self.acks and unreachable:
                    # Step aside: what the results stream keeps goes back to it now, for
                    # a bridge that reaches its database; only core NATS answers are held.
                    returned = [e for e in batch if e.msg is not None]
                    await self.let_go(returned, "buffer_full")
                    await self.step_aside()
                    batch, gone = [e for e in batch if e.msg is None], gone + returned
                    if not batch:
                        return [], gone
                if stopping.is_set() and backoff >= c.backoff_max_seconds:
                    await self.let_go(batch, "shutdown")
                    return [], gone + batch
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, c.backoff_max_seconds)
            except DatabaseError as exc:
                # A deadlock or serialization failure was tried again by the store
                # (arm_core.pooled) before it came here.
                self.reachable()
                if len(batch) > 1:
                    log.warning(
                        "a batch of %d envelopes failed as a whole; applying them one by one: %s",
                        len(batch),
                        exc,
                        extra={"action": "inbox_split", "count": len(batch)},
                    )
                    results, lost = await self._one_by_one(batch, stopping)
                    return results, gone + lost
                events.outcome(self, batch[0], ApplyOutcome.FAILED, None, error=str(exc))
                return [EnvelopeOutcome(batch[0], ApplyOutcome.FAILED)], gone

    def _worker_of(self, envelope: Envelope) -> int:
        return envelope.job_id.int % len(self.queues)

    async def _one_by_one(
        self, batch: list[Envelope], stopping: asyncio.Event, guarded: bool = False
    ) -> tuple[list[EnvelopeOutcome], list[Envelope]]:
        """Applies each envelope of `batch` in a transaction of its own, in order; one
        whose job's earlier envelope came back `busy` waits with it. `guarded`: an
        envelope that raises anything but a database error is `failed` (logged with the
        error) instead of ending the loop."""
        results: list[EnvelopeOutcome] = []
        dropped: list[Envelope] = []
        busy_jobs: set[uuid.UUID] = set()
        for envelope in batch:
            if envelope.job_id in busy_jobs:
                # Its job's earlier envelope waits: so does it.
                results.append(EnvelopeOutcome(envelope, ApplyOutcome.BUSY))
                continue
            try:
                alone, lost = await self._apply_until_done([envelope], stopping)
            except Exception as exc:
                if not guarded:
                    raise
                error = f"{type(exc).__name__}: {exc}"
                events.outcome(self, envelope, ApplyOutcome.FAILED, None, error=error)
                alone, lost = [EnvelopeOutcome(envelope, ApplyOutcome.FAILED)], []
            results += alone
            dropped += lost
            if any(r.outcome is ApplyOutcome.BUSY for r in alone):
                busy_jobs.add(envelope.job_id)
        return results, dropped

    async def apply(self, batch: list[Envelope]) -> list[EnvelopeOutcome]:
        """Hands `batch` to arm.apply_envelopes_v2 in one transaction; records each
        outcome. Returns the outcomes in the batch's order."""
        rows = await self.store.apply_envelopes(batch)
        for envelope, row in zip(batch, rows, strict=True):
            if row.outcome is ApplyOutcome.NOT_PUBLISHED and self._patient(envelope):
                continue  # applied again later (run_once): not an outcome yet
            events.outcome(self, envelope, row.outcome, row.attempt, row.status, row.wait_seconds)
        events.applied_batch(self, Counter(row.outcome for row in rows))
        if self.answered is not None and any(r.outcome is ApplyOutcome.APPLIED for r in rows):
            self.answered.set()
        return [
            EnvelopeOutcome(envelope, row.outcome, row.attempt, row.status)
            for envelope, row in zip(batch, rows, strict=True)
        ]
