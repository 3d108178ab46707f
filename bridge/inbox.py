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
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from arm_core.bridge import events
from arm_core.bridge.config import InboxConfig
from arm_core.bridge.envelope import Envelope, Rejected, parse_envelope
from arm_core.bridge.service import Service
from arm_core.db import DatabaseError, DatabasePoolExhausted, DatabaseUnavailable, is_transient
from arm_core.statuses import ApplyOutcome, JobStatus
from arm_core.store import Store

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
    those dropped because the process stopped while the database was unreachable."""

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
class Inbox(Service):
    config: InboxConfig
    store: Store
    counts: events.Counts = field(default_factory=events.Counts)
    name = "inbox"
    # One buffer and one worker per INBOX_WORKERS; a job's envelopes always share one
    # (by job id), so their order holds while the workers' batches run side by side.
    queues: list[asyncio.Queue[Envelope]] = field(init=False)
    # Set while the worker holds a batch because the database is unreachable.
    db_unreachable: bool = False
    # Per worker, the envelopes that lead its next batch, before anything in its buffer:
    # those that came back `busy`, or the one its loop waited for.
    _leading: list[list[Envelope]] = field(init=False)
    # True when the messages come from the results stream: each is settled with the
    # server once its envelope's outcome is final.
    acks: bool = False
    # JetStream: the message each envelope in the inbox came in, by id(envelope).
    _unsettled: dict[int, Msg] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.config.workers
        size = max(1, self.config.buffer_size // n)
        self.queues = [asyncio.Queue(maxsize=size) for _ in range(n)]
        self._leading = [[] for _ in range(n)]

    def buffered(self) -> int:
        """Envelopes waiting in the buffers."""
        return sum(q.qsize() for q in self.queues)

    def dropped(self) -> int:
        """Envelopes lost before the database saw them, whatever the reason."""
        return sum(n for key, n in self.counts.items() if key.startswith("dropped."))

    async def on_message(self, msg: Msg, settle: bool = True) -> None:
        """nats-py subscription callback: never raises. Waits for room in the buffer
        while the database is reachable; drops (counted, logged) only during an outage.
        `settle=False`: a core NATS message handed in while the answers come from the
        results stream (bridge/replay.py), with nothing to acknowledge."""
        settle = settle and self.acks
        self.counts["received"] += 1
        try:
            parsed = parse_envelope(msg.data, msg.headers, self.config.max_payload_bytes)
        except Exception as exc:  # a bug here must not kill the subscription
            parsed = Rejected("parse_error", f"{type(exc).__name__}: {exc}")
        if isinstance(parsed, Rejected):
            events.rejected(self.counts, msg.subject, parsed)
            if settle:
                await self._settle(msg, terminate=True)
            return
        if parsed.made_storable:
            events.made_storable(self.counts, parsed)
        if parsed.msg_id_derived:
            events.ack_without_msg_id(self.counts, parsed)
        if parsed.truncated:
            events.truncated(self.counts, parsed)
        queue = self.queues[parsed.job_id.int % len(self.queues)]
        if settle:
            self._unsettled[id(parsed)] = msg
        while True:
            try:
                queue.put_nowait(parsed)
                return
            except asyncio.QueueFull:
                if self.db_unreachable:
                    self.drop(parsed, "buffer_full")
                    return
            try:  # the database is there, the worker is only behind: wait for room
                await asyncio.wait_for(queue.put(parsed), self.config.full_recheck_seconds)
                return
            except TimeoutError:
                continue

    def drop(self, envelope: Envelope, reason: str) -> None:
        """Counts and logs an envelope that is lost before the database saw it. (From the
        results stream it is not acked: the server delivers it again after ack_wait.)"""
        self._unsettled.pop(id(envelope), None)
        events.dropped(self.counts, envelope, reason, self.config.buffer_size)

    def slow_consumer(self) -> None:
        """nats-py dropped a message because its subscription queue was full."""
        events.slow_consumer(self.counts)

    async def run(self, stopping: asyncio.Event) -> None:
        """Runs one worker per buffer until `stopping` is set and the buffers are drained."""
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
        queue, limit = self.queues[worker], self.config.batch_size
        batch, self._leading[worker] = self._leading[worker], []
        while len(batch) < limit and not queue.empty():
            batch.append(queue.get_nowait())
        if not batch:
            return InboxStep()
        results, dropped = await self._apply_until_done(batch, stopping or asyncio.Event())
        deferred = [r.envelope for r in results if r.outcome is ApplyOutcome.BUSY]
        self._leading[worker] = deferred
        if self._unsettled:
            for r in results:
                if r.outcome is not ApplyOutcome.BUSY:
                    msg = self._unsettled.pop(id(r.envelope), None)
                    if msg is not None:
                        await self._settle(msg, terminate=r.outcome is ApplyOutcome.FAILED)
        return InboxStep(tuple(results), tuple(deferred), tuple(dropped))

    async def _work(self, worker: int, stopping: asyncio.Event) -> None:
        """Applies the envelopes of the worker's buffer, batch by batch (run_once), until
        `stopping` is set and it is drained. Envelopes the database calls `busy` (another
        transaction holds their job, e.g. a publisher about to commit the request they
        answer) lead the next batch, so they are applied before anything that arrived
        after them."""
        queue, leading, c = self.queues[worker], self._leading, self.config
        pause = c.busy_pause_seconds
        try:
            while not (stopping.is_set() and queue.empty() and not leading[worker]):
                if not leading[worker] and queue.empty():
                    try:
                        leading[worker] = [await asyncio.wait_for(queue.get(), timeout=0.5)]
                    except TimeoutError:
                        continue
                step = await self.run_once(worker, stopping)
                if step.deferred and len(step.deferred) == len(step.results):
                    # All waiting on others' commits: a publisher's takes milliseconds;
                    # a lock held longer (a DBA's open transaction) is asked less often.
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, c.busy_pause_max_seconds)
                else:
                    pause = c.busy_pause_seconds
        except asyncio.CancelledError:
            # Stopped past the shutdown grace: what waited here was never applied. (A
            # batch in flight may or may not have committed, and is not counted.)
            waiting, leading[worker] = leading[worker], []
            while not queue.empty():
                waiting.append(queue.get_nowait())
            for envelope in waiting:
                self.drop(envelope, "shutdown")
            raise

    async def _apply_until_done(
        self, batch: list[Envelope], stopping: asyncio.Event
    ) -> tuple[list[EnvelopeOutcome], list[Envelope]]:
        """Applies `batch`, holding it while the database is unreachable. A batch the
        database rejects is split into single envelopes, each applied on its own.
        Returns every envelope's outcome in the batch's order (`busy` ones are applied
        again later), and the envelopes dropped at shutdown."""
        c = self.config
        backoff = c.backoff_seconds
        conflicts = 0
        while True:
            try:
                results = await self.apply(batch)
                self.db_unreachable = False
                return results, []
            except (DatabaseUnavailable, DatabasePoolExhausted) as exc:
                # Exhausted: the database is there, every connection busy; same batch again.
                self.db_unreachable = not isinstance(exc, DatabasePoolExhausted)
                events.held(self.counts, len(batch), self.buffered(), exc)
                if stopping.is_set() and backoff >= c.backoff_max_seconds:
                    for envelope in batch:
                        self.drop(envelope, "shutdown")
                    return [], batch
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, c.backoff_max_seconds)
            except DatabaseError as exc:
                self.db_unreachable = False
                if (
                    is_transient(exc) and conflicts < c.conflict_retries
                ):  # deadlock, serialization: again
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
                    results, dropped = [], []
                    busy_jobs: set[uuid.UUID] = set()
                    for envelope in batch:
                        if envelope.job_id in busy_jobs:
                            # Its job's earlier envelope waits: so does it.
                            results.append(EnvelopeOutcome(envelope, ApplyOutcome.BUSY))
                            continue
                        alone, lost = await self._apply_until_done([envelope], stopping)
                        results += alone
                        dropped += lost
                        if any(r.outcome is ApplyOutcome.BUSY for r in alone):
                            busy_jobs.add(envelope.job_id)
                    return results, dropped
                events.outcome(self.counts, batch[0], ApplyOutcome.FAILED, None, error=str(exc))
                return [EnvelopeOutcome(batch[0], ApplyOutcome.FAILED)], []

    async def _settle(self, msg: Msg, terminate: bool = False) -> None:
        """Acks (or terminates) a message of the results stream. A lost ack only means
        the message comes again: the database then calls it a duplicate."""
        try:
            if terminate:
                await msg.term()
            else:
                await msg.ack()
            events.settled(self.counts, terminate)
        except Exception as exc:
            log.warning(
                "could not settle a message of the results stream (it comes again): %s",
                f"{type(exc).__name__}: {exc}",
                extra={"action": "stream_ack_failed"},
            )

    async def apply(self, batch: list[Envelope]) -> list[EnvelopeOutcome]:
        """Hands `batch` to arm.apply_envelopes_v2 in one transaction; records each
        outcome. Returns the outcomes in the batch's order."""
        rows = await self.store.apply_envelopes(batch)
        for envelope, row in zip(batch, rows, strict=True):
            events.outcome(
                self.counts, envelope, row.outcome, row.attempt, row.status, row.wait_seconds
            )
        events.applied_batch(self.counts, Counter(row.outcome for row in rows))
        return [
            EnvelopeOutcome(envelope, row.outcome, row.attempt, row.status)
            for envelope, row in zip(batch, rows, strict=True)
        ]
