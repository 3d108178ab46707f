"""How a reference recognition service (:mod:`arm_core.devtools.reference`) sends its
answers: :class:`AnswerSender`, the half of ReferenceService that queues, publishes and
confirms them.

Every answer — ack or result — goes through the service's own bounded queue, in order,
with its Nats-Msg-Id fixed when the answer is made. An answer leaves the queue only once two
PING/PONGs on the same connection showed that the server read it; while NATS is
unreachable answers wait there and are sent after the reconnect, a possible resend of
an answer the server did read carrying the same Nats-Msg-Id (the core counts it as a
duplicate). REFERENCE_PENDING_MAX bounds the queue: when it is full the OLDEST answer
is dropped — logged (action ref_pending_drop) and counted (stats.pending_dropped) —
because the oldest job is the nearest to its reply deadline, and a lost ack is
recovered anyway (the core republishes, the service acks again).

Where a JetStream stream captures the result subject (RESULTS_STREAM), answers go
through JetStream publish instead: each waits for the stream's acknowledgement (PubAck),
with the same Nats-Msg-Id on every try; a timeout, "no responders" (the stream has no
leader: its node died, the others are electing one) or an API error leaves the answer
and those after it in the queue, tried again with a back-off of 0.25 s doubling to 2 s
for as long as it takes; a PubAck marked duplicate is a success (the stream had it).
A core publish on the stream's subject is captured only while the stream has a leader;
a JetStream publish is either stored or retried. Whether a stream captures the subject
is asked at start and, while none does, every STREAM_CHECK_SECONDS.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from arm_core.bridge.nats_client import confirm
from arm_core.devtools.reference_config import ReferenceConfig
from arm_core.devtools.reference_contract import MSG_ID, Job

# The reference services' one logger, whichever module writes the line: `arm-core dev`
# sends it to its own file (devtools/stack.py REFERENCE_LOGGER).
log = logging.getLogger("arm_core.devtools.reference")

SEND_BATCH = 500  # answers published before one confirmation
RETRY_SECONDS = 0.2  # while NATS is unreachable, how often the sender looks again
JS_BACKOFF = (0.25, 2.0)  # JetStream publish not acknowledged: first and longest wait
JS_TIMEOUT = 2.0  # seconds a JetStream publish waits for its PubAck
STREAM_CHECK_SECONDS = 30.0  # while no stream captures the result subject, ask again


@dataclass
class ReferenceStats:
    received: int = 0  # every message on the request subject
    acked: int = 0  # first acks of new jobs
    reacked: int = 0  # acks repeated for a job already in work or done
    processed: int = 0  # results (done or error) made for acked jobs, queued to send
    schema_mismatch: int = 0  # SCHEMA_MISMATCH results made (no ack before them)
    dropped: int = 0  # messages given no answer at all
    sent: int = 0  # answers the server confirmed it read
    resent: int = 0  # answers put back in the queue after an unconfirmed publish
    pending_dropped: int = 0  # answers dropped from the full queue (REFERENCE_PENDING_MAX)
    # Seconds the workers spent on files (REFERENCE_WORKERS): busy ÷ (workers × elapsed)
    # is the service's utilisation.
    busy_seconds: float = 0.0


@dataclass(frozen=True)
class Answer:
    """One ack or result, made once: a resend is the same bytes and Nats-Msg-Id."""

    msg_id: str
    data: bytes
    kind: str  # ack | result
    job_id: str
    attempt: int


class AnswerSender:
    """The answers of one service: made once (:meth:`_send`), queued, published in order
    by the task :meth:`_send_loop` runs, and forgotten once confirmed. ReferenceService
    is one; it starts that task and stops it."""

    def __init__(self, nc: Client, config: ReferenceConfig) -> None:
        self.nc = nc
        self.config = config
        self.stats = ReferenceStats()
        self._pending: deque[Answer] = deque()  # made, waiting to be published; oldest first
        self._inflight: list[Answer] = []  # published, waiting for the confirmation
        self._more = asyncio.Event()  # set when _pending has something
        self._drained = asyncio.Event()  # set when nothing is pending or in flight
        self._drained.set()
        self._sender: asyncio.Task[None] | None = None
        self.stream: str | None = None  # the stream that captures the result subject
        self._stream_checked = float("-inf")
        self._core_said = False

    @property
    def pending(self) -> int:
        """Answers not yet confirmed sent: waiting, or published and not yet confirmed."""
        return len(self._pending) + len(self._inflight)

    async def _find_stream(self) -> None:
        """Which stream, if any, captures the result subject: answers then go through
        JetStream publish. No JetStream, no such stream, or no answer: core NATS."""
        self._stream_checked = time.monotonic()
        found: str | None
        if self.config.publish == "core":
            if not self._core_said:
                self._core_said = True
                log.info(
                    "%s: answers go through core NATS (REFERENCE_PUBLISH=core)",
                    self.config.service,
                    extra={"action": "ref_stream", "stream": None},
                )
            return
        try:
            found = await self.nc.jetstream().find_stream_name_by_subject(
                self.config.result_subject
            )
        except NotFoundError:  # JetStream answered: no stream captures it (any more)
            found = None
        except Exception as exc:  # no JetStream, no answer: as before (core at start)
            log.debug("no stream found for %s: %s", self.config.result_subject, exc)
            return
        if found != self.stream:
            self.stream = found
            log.info(
                "%s: answers go through %s",
                self.config.service,
                f"JetStream (stream {found})" if found else "core NATS (no stream captures them)",
                extra={"action": "ref_stream", "stream": found},
            )

    async def _send(self, job: Job, status: str, reason: str = "", **fields: Any) -> None:
        """Queues an ack (status processing) or a result for `job`; the sender publishes
        it. Never waits for NATS."""
        cfg = self.config
        body = {
            "schema_version": "1.0",
            "job_id": job.job_id,
            "file_id": job.file_id,
            "status": status,
            "service": {"name": cfg.service, "version": cfg.version},
            **fields,
        }
        kind = "ack" if status == "processing" else "result"
        answer = Answer(
            f"{kind}:{job.job_id}:{job.attempt}",
            json.dumps(body).encode(),
            kind,
            job.job_id,
            job.attempt,
        )
        if len(self._pending) >= cfg.pending_max:
            self._drop_oldest()
        self._pending.append(answer)
        self._more.set()
        self._drained.clear()
        extra = {"action": f"ref_{kind}", "job_id": job.job_id, "attempt": job.attempt}
        log.info(
            "%s: %s %s", cfg.service, kind, reason or status, extra={**extra, "status": status}
        )

    def _drop_oldest(self) -> None:
        lost = self._pending.popleft()
        self.stats.pending_dropped += 1
        log.warning(
            "%s: %d answers wait for NATS (REFERENCE_PENDING_MAX): dropped the oldest, %s",
            self.config.service,
            self.config.pending_max,
            lost.msg_id,
            extra={
                "action": "ref_pending_drop",
                "job_id": lost.job_id,
                "attempt": lost.attempt,
                "kind": lost.kind,
                "dropped": self.stats.pending_dropped,
            },
        )

    async def _send_loop(self) -> None:
        """Publishes the queued answers in order, a batch at a time, and forgets a batch
        only when the server has read it: connected before and after, no reconnect in
        between (nats-py drops what it had written to a dead socket), two PONGs back."""
        outage = False
        backoff = JS_BACKOFF[0]
        while True:
            await self._more.wait()
            if not self._pending:
                self._more.clear()
                continue
            if not self.nc.is_connected:
                if not outage and not self.nc.is_closed:
                    outage = True
                    log.warning(
                        "%s: NATS unreachable, %d answers wait",
                        self.config.service,
                        len(self._pending),
                        extra={"action": "ref_waiting", "count": len(self._pending)},
                    )
                await asyncio.sleep(RETRY_SECONDS)
                continue
            # While no stream captures the subject, or while the one that did stays
            # silent: is there one (still)?
            if (self.stream is None or outage) and time.monotonic() - self._stream_checked > (
                STREAM_CHECK_SECONDS
            ):
                await self._find_stream()
            batch = self._inflight = [
                self._pending.popleft() for _ in range(min(SEND_BATCH, len(self._pending)))
            ]
            confirmed = await self._publish(batch)
            self._inflight = []
            self.stats.sent += confirmed
            if confirmed == len(batch):
                backoff = JS_BACKOFF[0]
                if not self._pending:
                    self._drained.set()
                if outage:
                    outage = False
                    log.info(
                        "%s: NATS back, answers flowing again (%d still queued)",
                        self.config.service,
                        len(self._pending),
                        extra={"action": "ref_resumed", "count": len(self._pending)},
                    )
            else:  # the unconfirmed back to the front, in order; the bound holds again
                unconfirmed = batch[confirmed:]
                self._pending.extendleft(reversed(unconfirmed))
                if not outage and not self.nc.is_closed:
                    outage = True
                    log.warning(
                        "%s: NATS did not confirm, %d answers wait",
                        self.config.service,
                        len(self._pending),
                        extra={"action": "ref_waiting", "count": len(self._pending)},
                    )
                while len(self._pending) > self.config.pending_max:
                    self._drop_oldest()
                self.stats.resent += len(unconfirmed)
                if self.stream is None:
                    await asyncio.sleep(RETRY_SECONDS)
                else:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, JS_BACKOFF[1])

    async def _publish(self, batch: list[Answer]) -> int:
        """Publishes `batch` in order; returns how many of its first answers are
        confirmed (all or none for core NATS)."""
        if self.stream is not None:
            return await self._publish_js(batch)
        nc = self.nc
        reconnects = nc.stats["reconnects"]
        try:
            for answer in batch:
                await nc.publish(
                    self.config.result_subject, answer.data, headers={MSG_ID: answer.msg_id}
                )
            await confirm(nc)
        except Exception as exc:  # disconnected, timed out, closed: all sent again
            log.debug("publish not confirmed: %s: %s", type(exc).__name__, exc)
            return 0
        ok = nc.is_connected and nc.stats["reconnects"] == reconnects
        return len(batch) if ok else 0

    async def _publish_js(self, batch: list[Answer]) -> int:
        """JetStream publish, one answer after another, each once its PubAck came (a
        duplicate is one: the stream has it); stops at the first that is not."""
        js = self.nc.jetstream()
        for done, answer in enumerate(batch):
            try:
                await js.publish(
                    self.config.result_subject,
                    answer.data,
                    timeout=JS_TIMEOUT,
                    headers={MSG_ID: answer.msg_id},
                )
            except Exception as exc:  # timeout, no responders, 503, disconnected
                log.debug("JetStream publish not acknowledged: %s: %s", type(exc).__name__, exc)
                return done
        return len(batch)
