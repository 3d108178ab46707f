"""The inbox (R-ACK-1, R-IN-1): the answers (envelopes) on RESULT_SUBJECT, received,
buffered, and applied in batches.

The subscription callback (:meth:`Inbox.on_message`) parses and validates each message,
then puts the envelope in its worker's buffer — by job id, so a job's envelopes stay in
order. One worker applies what arrived since its last call as ONE batch: one
`arm.apply_envelopes_v2` call, one transaction, envelopes in arrival order. Under a
burst batches grow up to INBOX_BATCH_SIZE; when traffic is light a batch is one envelope
and nothing waits.

Nothing is dropped while the database is reachable. When the worker falls behind, the
callback waits for room in the buffer (INBOX_BUFFER_SIZE, INBOX_BUFFER_BYTES) instead of
dropping; the messages meanwhile wait in nats-py's subscription queue. The buffer's other
job is the outage: while the database is unreachable the worker holds its batch and
retries with backoff, the buffer fills, and only once it is full are envelopes dropped —
each one counted (`counts`, `dropped.<reason>`) and logged with its job id, the drops
told once per burst (bridge/buffer.py DropBursts). Those jobs reach `timeout` at their
reply deadline and a retry recovers them.

A batch that the database rejects as a whole (one envelope raised inside it) is applied
again one envelope per transaction, so the one that cannot be applied gets its own
outcome (`failed`, logged with the error) and never fails the others.

With RESULTS_STREAM the messages come from a JetStream consumer (bridge/stream_fetch.py)
and the inbox settles each one with the server (`acks`): a message is acked only once its
envelope's outcome is final — after the transaction that applied it committed, or once
the database said it changes nothing (duplicate, already_final, …); garbage and an
envelope the database raised on even alone are terminated (`term`: never delivered
again); `busy` ones wait for their next batch. What the inbox will not apply it releases
(:meth:`Inbox.release`): a message of the stream is nacked, delivered again within
seconds to whichever bridge fetches; any other is dropped. While its database is
unreachable the inbox pauses (:meth:`Inbox.pause`): it nacks what its buffers hold and
the fetch loop fetches nothing until :meth:`Inbox.probe` finds the database again.

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
import dataclasses
import functools
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from arm_core.bridge import events
from arm_core.bridge.buffer import Buffer, DropBursts, Snoozed
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


@dataclass(frozen=True)
class InboxStep:
    """What one :meth:`Inbox.run_once` did: every envelope it took, with its outcome, in
    the order applied; those that came back `busy` and lead the worker's next batch; and
    those it released without an outcome: nacked back to the results stream while the
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
    # Per worker, the answers whose job was still queued, to be applied again later.
    _snoozed: list[Snoozed] = field(init=False)
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
        self._snoozed = [Snoozed() for _ in range(n)]
        self._one_at_a_time = [False] * n

    def worker_name(self, worker: int) -> str:
        return f"{self.name}-{worker}"

    def worker_running(self, worker: int) -> bool:
        """Whether the worker's loop runs, or will again after a restart (True for an
        inbox whose loops were never started: a test steps it)."""
        supervisor = self.supervisor
        return not self.tasks or supervisor is None or supervisor.running(self.worker_name(worker))

    def buffered(self) -> int:
        """Envelopes waiting in the buffers."""
        return sum(q.qsize() for q in self.queues)

    def held(self) -> int:
        """Envelopes received and not applied yet: in the buffers, or in a worker's hands
        (its batch, held while the database is away; those waiting for a busy job)."""
        held = sum(len(batch) for batch in self._next_batch)
        return self.buffered() + held + sum(len(w) for w in self._snoozed)

    def room(self) -> tuple[int, int]:
        """How many more envelopes, and bytes, the buffers take now, all together."""
        rooms = [q.room() for q in self.queues]
        return sum(r[0] for r in rooms), sum(r[1] for r in rooms)

    def dropped(self) -> int:
        """Envelopes lost before the database saw them, whatever the reason."""
        return sum(n for key, n in self.counts.items() if key.startswith("dropped."))

    async def on_message(self, msg: Msg, settle: bool = True) -> None:
        """nats-py subscription callback: never raises. Waits for room in the buffer
        while the database is reachable and the buffer's worker runs (or restarts);
        drops (counted, logged) during an outage, and once the worker has stopped.
        `settle=False`: a core NATS message handed in while the answers come from the
        results stream (bridge/replay.py), with nothing to acknowledge."""
        settle = settle and self.acks
        self.counts["received"] += 1
        try:
            parsed = parse_envelope(
                msg.data, msg.headers, self.config.settings.inbox_max_payload_bytes
            )
        except Exception as exc:  # a bug here must not kill the subscription
            parsed = Rejected("parse_error", f"{type(exc).__name__}: {exc}")
        if isinstance(parsed, Rejected):
            events.rejected(self, msg.subject, parsed)
            if settle:
                await self._settle(msg, terminate=True)
            return
        if parsed.made_storable:
            events.made_storable(self, parsed)
        if parsed.msg_id_derived:
            events.ack_without_msg_id(self, parsed)
        if parsed.truncated:
            events.truncated(self, parsed)
        if settle:
            # Kept until acked: the message counts against the buffer as well as its row.
            parsed = dataclasses.replace(parsed, msg=msg, size=parsed.size + len(msg.data))
        worker = self._worker_of(parsed)
        queue = self.queues[worker]
        if parsed.msg is not None and self.db_unreachable:
            await self.release([parsed], "buffer_full")  # another bridge may reach it
            return
        while not queue.put_nowait(parsed):
            if self.db_unreachable:
                await self.release([parsed], "buffer_full")
                return
            if not self.worker_running(worker):  # nobody will make room
                await self.release([parsed], "shutdown")
                return
            # The database is there, the worker is only behind: wait for room.
            if await queue.put(parsed, self.config.full_recheck_seconds):
                break

    async def release(self, envelopes: list[Envelope], reason: str) -> None:
        """Envelopes this inbox will not apply (`reason`: buffer_full, shutdown). Those
        from the results stream are nacked (the stream delivers them again after
        NAK_DELAY_SECONDS, to whichever bridge fetches — one that reaches its database);
        the others are lost before the database saw them: counted, logged once per
        burst."""
        returned = [e for e in envelopes if e.msg is not None]
        for envelope in envelopes:
            if envelope.msg is None:
                s, why = self.config.settings, events.DROPPED_BECAUSE.get(reason, reason)
                said = why.format(size=s.inbox_buffer_size, bytes=s.inbox_buffer_bytes)
                self.drops.dropped(envelope, reason, said)
                events.dropped(self, envelope, reason)
        for envelope in returned:
            assert envelope.msg is not None
            await self._settle(envelope.msg, nak=True)
        if returned:
            events.handed_back(self, len(returned), reason)

    async def pause(self) -> int:
        """The database is unreachable: nacks every message of the results stream the
        buffers hold (core NATS ones stay: nothing would deliver them again); returns
        how many. The fetch loop fetches nothing more until :meth:`probe` succeeds."""
        returned = [e for q in self.queues for e in q.take(lambda e: e.msg is not None)]
        if returned:
            await self.release(returned, "buffer_full")
        return len(returned)

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
                events.intake_resumed(self)
        if self.drops:
            self.drops.ended()

    async def stop(self, grace: float) -> None:
        await super().stop(grace)
        if self.drops:
            self.drops.ended()

    def slow_consumer(self) -> None:
        """nats-py dropped a message because its subscription queue was full."""
        events.slow_consumer(self)

    async def _settle(self, msg: Msg, terminate: bool = False, nak: bool = False) -> None:
        """Acks (or terminates, or nacks) a message of the results stream. A
        lost ack only means the message comes again: the database then calls it a
        duplicate."""
        try:
            if nak:
                await msg.nak(delay=NAK_DELAY_SECONDS)
                return
            if terminate:
                await msg.term()
            else:
                await msg.ack()
            events.settled(self, terminate)
        except Exception as exc:
            log.warning(
                "could not settle a message of the results stream (it comes again): %s",
                f"{type(exc).__name__}: {exc}",
                extra={"action": "stream_ack_failed"},
            )

    def loops(self) -> dict[str, Loop]:
        """One loop per worker: inbox-0, inbox-1, …"""
        return {
            self.worker_name(w): functools.partial(self._work, w) for w in range(len(self.queues))
        }

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
        # The batch stays in `_next_batch` until its outcomes are known: a crash leaves it
        # there for the restarted loop. Answers waiting for their job to be published
        # again come first once their time has come.
        batch = self._next_batch[worker]
        batch[:0] = self._snoozed[worker].due(time.monotonic())
        while len(batch) < limit and not queue.empty():
            batch.append(queue.get_nowait())
        if not batch:
            return InboxStep()
        stopping = stopping or asyncio.Event()
        if self._one_at_a_time[worker]:  # the loop crashed on this batch: one envelope at a time
            results, dropped = await self._one_by_one(batch, stopping, guarded=True)
            self._one_at_a_time[worker] = False
        else:
            results, dropped = await self._apply_until_done(batch, stopping)
        deferred = [r.envelope for r in results if r.outcome is ApplyOutcome.BUSY]
        self._next_batch[worker] = deferred
        for r in results:
            if r.outcome is ApplyOutcome.NOT_PUBLISHED and self._patient(r.envelope):
                await self._snooze(worker, r.envelope)
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

    async def _snooze(self, worker: int, envelope: Envelope) -> None:
        self.counts["not_published_waits"] += 1
        self._snoozed[worker].add(
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
        queue, leading, c = self.queues[worker], self._next_batch, self.config
        pause = c.busy_pause_seconds
        name = self.worker_name(worker)
        try:
            while not (stopping.is_set() and queue.empty() and not leading[worker]):
                self.beat(name)
                if not leading[worker] and queue.empty():
                    first = await queue.get(0.5)
                    if first is not None:
                        leading[worker] = [first]
                    elif not self._snoozed[worker].ready(time.monotonic()):
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
            await self.release(self._snoozed[worker].take_all(), "shutdown")
        except asyncio.CancelledError:
            # Stopped past the shutdown grace: what waited here was never applied. (A
            # batch in flight may or may not have committed, and is not counted.)
            waiting, leading[worker] = leading[worker], []
            waiting += self._snoozed[worker].take_all()
            while not queue.empty():
                waiting.append(queue.get_nowait())
            await self.release(waiting, "shutdown")
            raise
        except Exception:
            # Unexpected: the supervisor logs it and starts this loop again, which then
            # applies the batch in hand one envelope at a time.
            self._one_at_a_time[worker] = bool(leading[worker])
            raise

    async def _apply_until_done(
        self, batch: list[Envelope], stopping: asyncio.Event
    ) -> tuple[list[EnvelopeOutcome], list[Envelope]]:
        """Applies `batch`, holding it while the database is unreachable. A batch the
        database rejects is split into single envelopes, each applied on its own.
        Returns every envelope's outcome in the batch's order (`busy` ones are applied
        again later), and the envelopes released: with RESULTS_STREAM, its messages are
        nacked as soon as the database is unreachable (the inbox pauses,
        bridge/stream_fetch.py stops fetching); the others are dropped at shutdown."""
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
                    # Pause: what the results stream keeps goes back to it now, for
                    # a bridge that reaches its database; only core NATS answers are held.
                    returned = [e for e in batch if e.msg is not None]
                    await self.release(returned, "buffer_full")
                    await self.pause()
                    batch, gone = [e for e in batch if e.msg is None], gone + returned
                    if not batch:
                        return [], gone
                if stopping.is_set() and backoff >= c.backoff_max_seconds:
                    await self.release(batch, "shutdown")
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
