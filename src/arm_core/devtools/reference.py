"""A REFERENCE recognition service: the service side of the contract (docs/behaviour.md#contracts).

It stands in for tabular-parser and scan-gateway in the demo (`arm-core dev`) and in
end-to-end tests. It recognises nothing: it acks a valid request at once, waits a moment,
writes a result file that says plainly that no recognition was done, then publishes
`done`. Modes and per-file markers in `original_name` make it misbehave on purpose:
"[fail]" → error, "[fail-once]" → error on the first attempt only (a retry is done),
"[noack]" → no answer at all, "[silent]" → ack only.

It is also the model of a conforming service for the NATS side (docs/service-teams.md,
"For service teams"): it connects with NATS_OPTIONS (reconnect forever, no client-side
buffer) and every answer — ack or result — goes through its own bounded queue, in order,
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
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jsonschema.exceptions import best_match
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from arm_core.bridge.contracts import (
    CONTRACT_MAJOR,
    REQUEST_SCHEMA,
    RESULT_SCHEMA,
    other_major,
    schema,
    validator,
)
from arm_core.bridge.nats_client import MSG_ID_HEADER, confirm, connect
from arm_core.config import Settings, env_var, number, one_of, read_env
from arm_core.config_error import ConfigError

log = logging.getLogger(__name__)

TABULAR = "tabular-parser"
SCAN = "scan-gateway"
MODES = ("normal", "fail", "never_ack", "never_answer")
PIPELINES = {TABULAR: "tabular", SCAN: "image"}
DEFAULT_SUBJECTS = {TABULAR: "files.tabular_uploaded", SCAN: "files.img_uploaded"}
MARKERS = (("[noack]", "never_ack"), ("[silent]", "never_answer"), ("[fail]", "fail"))
# Fails the first attempt only: what a retry recovers.
FAIL_ONCE = "[fail-once]"
NOTE = "reference service: the file was not read or recognised"
FAIL_MESSAGE = "reference service: failing on purpose (REFERENCE_MODE=fail or [fail] in the name)"
MSG_ID = MSG_ID_HEADER
# Jobs kept for duplicate detection, oldest forgotten first: a repeat of a request comes
# within its ack timeout's republishes (two minutes with the defaults), so a job is kept
# REMEMBER_SECONDS, and at most REMEMBERED_JOBS of them. A job forgotten and asked for
# again is answered again, with the same Nats-Msg-Ids: the core calls that a duplicate.
# The time bound keeps the memory flat after a few minutes of a steady flow: an hour's
# soak saw the count bound alone still filling (and the RSS growing) after its 10-minute
# warm-up at 33 jobs a second per service.
REMEMBER_SECONDS = 300.0
REMEMBERED_JOBS = 20_000
SEND_BATCH = 500  # answers published before one confirmation
RETRY_SECONDS = 0.2  # while NATS is unreachable, how often the sender looks again
JS_BACKOFF = (0.25, 2.0)  # JetStream publish not acknowledged: first and longest wait
JS_TIMEOUT = 2.0  # seconds a JetStream publish waits for its PubAck
STREAM_CHECK_SECONDS = 30.0  # while no stream captures the result subject, ask again

# The nats-py connect options docs/service-teams.md recommends to service teams ("For
# service teams"; tests/reference checks that the page shows exactly these). Servers, name,
# credentials and the callbacks come on top.
NATS_OPTIONS: dict[str, Any] = {
    "allow_reconnect": True,
    "max_reconnect_attempts": -1,  # reconnect forever, the first connect included
    "reconnect_time_wait": 0.5,
    "connect_timeout": 2,
    "ping_interval": 10,  # a dead connection is noticed within ~30 s, not minutes
    "max_outstanding_pings": 3,
    "pending_size": 0,  # no silent client buffer: answers wait in the service's queue
}

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


# The `error.code` values the result schema allows.
ERROR_CODES = tuple(schema(RESULT_SCHEMA)["properties"]["error"]["properties"]["code"]["enum"])


def _path(name: str, raw: str) -> Path:
    return Path(raw.strip())


def _bucket(name: str, raw: str) -> str:
    value = raw.strip()
    if len(value) > 63 or any(c.isspace() or c == "/" for c in value):
        raise ConfigError(f"{name}: not an S3 bucket name: {raw!r}")
    return value


@dataclass(frozen=True)
class ReferenceConfig:
    """One service's configuration; REFERENCE_* variables are read by config.read_env,
    the parser of Settings too."""

    service: str  # tabular-parser | scan-gateway
    version: str = "0.1.0-reference"
    # normal | fail | never_ack | never_answer
    mode: str = env_var("REFERENCE_MODE", one_of(MODES), "normal")
    # Between the ack and the result ("reading S3, recognising").
    delay_seconds: float = env_var("REFERENCE_DELAY_SECONDS", number(float, 0), 0.5)
    # error.code in mode fail and for "[fail]" files.
    fail_code: str = env_var(
        "REFERENCE_FAIL_CODE", one_of(ERROR_CODES, str.upper), "UNSUPPORTED_FORMAT"
    )
    # The local stand-in for the results bucket.
    results_dir: Path = env_var("REFERENCE_RESULTS_DIR", _path, Path(".dev/results"))
    results_bucket: str = env_var("REFERENCE_RESULTS_BUCKET", _bucket, "arm-ka")
    # Answers kept while NATS is unreachable; when full the oldest is dropped (logged).
    pending_max: int = env_var("REFERENCE_PENDING_MAX", number(int, 1), 5000)
    # auto: JetStream publish where a stream captures the result subject, else core NATS;
    # core: always core NATS, as a service that has not adopted JetStream publish (make
    # chaos measures what such a service loses).
    publish: str = env_var("REFERENCE_PUBLISH", one_of(("auto", "core")), "auto")
    request_subject: str | None = None  # default by service
    result_subject: str = "files.tabular_parsed"
    queue_group: str | None = None  # default: the service name

    def __post_init__(self) -> None:
        if self.service not in PIPELINES:
            raise ValueError(f"service: expected {TABULAR} or {SCAN}, got {self.service!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")

    @property
    def subject(self) -> str:
        return self.request_subject or DEFAULT_SUBJECTS[self.service]

    @property
    def queue(self) -> str:
        return self.queue_group or self.service

    @classmethod
    def from_env(cls, service: str, environ: Mapping[str, str] | None = None) -> ReferenceConfig:
        """REFERENCE_MODE, _DELAY_SECONDS, _FAIL_CODE, _RESULTS_DIR, _RESULTS_BUCKET,
        _PENDING_MAX."""
        if service not in PIPELINES:
            raise ConfigError(f"REFERENCE_SERVICES: expected {TABULAR} or {SCAN}, got {service!r}")
        values, _given = read_env(cls, os.environ if environ is None else environ)
        return cls(service=service, **values)


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


@dataclass(frozen=True, slots=True)
class _Job:
    job_id: str
    file_id: str
    attempt: int
    acked: bool
    seen_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Answer:
    """One ack or result, made once: a resend is the same bytes and Nats-Msg-Id."""

    msg_id: str
    data: bytes
    kind: str  # ack | result
    job_id: str
    attempt: int


def _uuid(value: Any) -> str | None:
    return value if isinstance(value, str) and _UUID.fullmatch(value) else None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 1 else None


def _clip(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ReferenceService:
    """Subscribes to one request subject in the service's queue group and answers on
    the result subject. The subscription callback acks at once and never raises; the
    slow part of each job runs in a task of its own."""

    def __init__(self, nc: Client, config: ReferenceConfig) -> None:
        self.nc = nc
        self.config = config
        self.stats = ReferenceStats()
        # By lower-case job_id, in work or answered, oldest first (popped in O(1)).
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Subscription | None = None
        self._pending: deque[_Answer] = deque()  # made, waiting to be published; oldest first
        self._inflight: list[_Answer] = []  # published, waiting for the confirmation
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

    async def start(self) -> None:
        cfg = self.config
        await self._find_stream()
        self._sender = asyncio.create_task(self._send_loop())
        self._sub = await self.nc.subscribe(cfg.subject, queue=cfg.queue, cb=self._on_message)
        await confirm(self.nc)  # the server has the SUB before we say we listen
        log.info(
            "reference %s (mode %s) on %s, queue group %s",
            cfg.service,
            cfg.mode,
            cfg.subject,
            cfg.queue,
            extra={"action": "ref_start", "subject": cfg.subject, "stream": self.stream},
        )

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

    async def stop(self, grace: float = 5.0) -> None:
        """Takes no new request, cancels the work in progress, gives the queued answers
        up to `grace` seconds to go out, and logs how many did not."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may be closed already
                log.debug("unsubscribe failed: %s", exc)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        sender, self._sender = self._sender, None
        if sender is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), grace)
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        if self.pending:
            log.warning(
                "%s: stopped with %d answers not sent",
                self.config.service,
                self.pending,
                extra={"action": "ref_unsent", "count": self.pending},
            )

    # -- receiving ---------------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        """Subscription callback: answers what it can at once, never raises."""
        self.stats.received += 1
        try:
            await self._handle(msg)
        except Exception:
            self.stats.dropped += 1
            log.exception(
                "%s: failed on a request, dropped it",
                self.config.service,
                extra={"action": "ref_drop", "reason": "internal_error"},
            )

    async def _handle(self, msg: Msg) -> None:
        try:
            body: Any = json.loads(msg.data)
        except Exception as exc:  # not UTF-8, not JSON, nested too deep
            return self._drop("not_json", type(exc).__name__)
        if not isinstance(body, dict):
            return self._drop("not_an_object", type(body).__name__)
        job_id = _uuid(body.get("job_id"))
        if job_id is None:
            value = body.get("job_id")
            detail = _clip(value, 80) if isinstance(value, str) else type(value).__name__
            return self._drop("job_id_unreadable", f"job_id {detail}")
        problem = self._problem(body)
        known = self._jobs.get(job_id.lower())
        if known is not None:
            if problem is not None or not known.acked:
                # A SCHEMA_MISMATCH now would carry the real result's Nats-Msg-Id.
                said = problem[1] if problem else "answered already"
                return self._drop("duplicate_invalid", said, job_id)
            self.stats.reacked += 1
            return await self._send(known, "processing", "repeated for a job already taken")
        if problem is not None:
            return await self._schema_mismatch(msg, body, job_id, problem)

        job = _Job(job_id, body["file_id"], _positive_int(body["attempt"]) or 1, acked=True)
        mode = self._mode(body["original_name"], job.attempt)
        if mode == "never_ack":
            return self._drop("never_ack", "mode never_ack", job_id, job.attempt)
        if mode != "never_answer" and self.config.service == SCAN:
            if _passed(body["reply_deadline"]):
                mode = "timeout"
        await self._send(job, "processing")
        self._remember(job)
        self.stats.acked += 1
        if mode != "never_answer":
            task = asyncio.create_task(self._work(job, body, mode, time.monotonic()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _problem(self, body: dict[str, Any]) -> tuple[str, str] | None:
        """Why the request breaks the contract — the reason logged and what the answer
        says — or None. Every MINOR of MAJOR 1 is read, its new fields ignored."""
        if (major := other_major(body.get("schema_version"))) is not None:
            said = f"schema_version MAJOR {major}: MAJOR version {CONTRACT_MAJOR} expected"
            return "schema_version_unsupported", said
        error = best_match(validator(REQUEST_SCHEMA).iter_errors(body))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return "schema_mismatch", f"{where}: {_clip(error.message, 500)}"
        if body["pipeline"] != PIPELINES[self.config.service]:
            said = f"pipeline {body['pipeline']!r} is not served by {self.config.service}"
            return "schema_mismatch", said
        return None

    def _mode(self, original_name: str, attempt: int = 1) -> str:
        name = original_name.lower()
        if FAIL_ONCE in name:
            return "fail" if attempt == 1 else self.config.mode
        return next((mode for marker, mode in MARKERS if marker in name), self.config.mode)

    def _remember(self, job: _Job) -> None:
        self._jobs[job.job_id.lower()] = job
        forget_before = job.seen_at - REMEMBER_SECONDS
        while len(self._jobs) > REMEMBERED_JOBS or (
            next(iter(self._jobs.values())).seen_at < forget_before  # the oldest
        ):
            self._jobs.popitem(last=False)

    def _drop(
        self, reason: str, detail: str, job_id: str | None = None, attempt: int | None = None
    ) -> None:
        self.stats.dropped += 1
        extra = {"action": "ref_drop", "reason": reason, "job_id": job_id, "attempt": attempt}
        extra = {k: v for k, v in extra.items() if v is not None}
        log.warning("%s: request dropped, no answer: %s", self.config.service, detail, extra=extra)

    # -- answering -----------------------------------------------------------------------

    async def _send(self, job: _Job, status: str, reason: str = "", **fields: Any) -> None:
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
        answer = _Answer(
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

    async def _publish(self, batch: list[_Answer]) -> int:
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

    async def _publish_js(self, batch: list[_Answer]) -> int:
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

    async def _schema_mismatch(
        self, msg: Msg, body: dict[str, Any], job_id: str, problem: tuple[str, str]
    ) -> None:
        """A request against the contract, its ids readable: an error SCHEMA_MISMATCH, no
        ack; the log line says why (`schema_mismatch`, `schema_version_unsupported`)."""
        reason, problem_text = problem
        file_id = _uuid(body.get("file_id"))
        if file_id is None:
            return self._drop("file_id_unreadable", problem_text, job_id)
        attempt = _positive_int(body.get("attempt"))
        if attempt is None:  # the contract leaves it open (docs/contracts/README.md)
            attempt = 1 if self.config.service == SCAN else _header_attempt(msg, job_id)
        if attempt is None:
            return self._drop("attempt_unreadable", problem_text, job_id)
        job = _Job(job_id, file_id, attempt, acked=False)
        self._remember(job)
        self.stats.schema_mismatch += 1
        message = f"request does not match {REQUEST_SCHEMA} v1: {problem_text}"
        log.warning(
            "%s: request against the contract, answered SCHEMA_MISMATCH: %s",
            self.config.service,
            problem_text,
            extra={"action": "ref_refuse", "reason": reason, "job_id": job_id, "attempt": attempt},
        )
        await self._send(job, "error", "schema mismatch", error=_error("SCHEMA_MISMATCH", message))

    async def _work(self, job: _Job, body: dict[str, Any], mode: str, started: float) -> None:
        """After the ack: the (pretend) S3 read and recognition, then the result."""
        cfg = self.config
        try:
            if mode == "timeout":
                message = f"reply_deadline {body['reply_deadline']} passed before the scan"
                await self._send(job, "error", "deadline passed", error=_error("TIMEOUT", message))
            else:
                await asyncio.sleep(cfg.delay_seconds)
                ms = round((time.monotonic() - started) * 1000)
                metrics = {"duration_ms": ms, "reference": True}
                if mode == "fail":
                    error = _error(cfg.fail_code, FAIL_MESSAGE)
                    await self._send(
                        job, "error", "failing on purpose", error=error, metrics=metrics
                    )
                else:
                    # In the event loop, not a worker thread: a few hundred bytes per
                    # file, and the RSS of a service writing through asyncio.to_thread
                    # kept growing (~1 MiB a minute at 60 files/s, its anonymous
                    # mappings) while the Python objects it held did not; written here
                    # it stayed flat.
                    fields = self._write_files(job, body)
                    await self._send(job, "done", metrics=metrics, **fields)
            self.stats.processed += 1
        except Exception:  # a full disk, NATS gone: the core's watchdog takes over
            log.exception(
                "%s: job failed inside the reference service, no result",
                cfg.service,
                extra={"action": "ref_drop", "reason": "internal_error", "job_id": job.job_id},
            )

    def _write_files(self, job: _Job, body: dict[str, Any]) -> dict[str, Any]:
        """Writes the result file (and scan-gateway's raw answer), each complete before
        the envelope pointing at it is published; returns the envelope's fields."""
        service = {"name": self.config.service, "version": self.config.version}
        key = f"results/{job.file_id}/{job.job_id}/result.json"
        content = {
            "schema_version": "1.0",
            "job_id": job.job_id,
            "file_id": job.file_id,
            "original_name": body["original_name"],
            "service": service,
            "reference": True,
            "note": NOTE,
            "group_schema": None,
        }
        _write_json(self.config.results_dir / key, content)
        fields: dict[str, Any] = {
            "result_s3": {"bucket": self.config.results_bucket, "key": key},
            "result_schema_version": "1.0",
        }
        if self.config.service == SCAN:
            raw_key = f"raw/{job.file_id}/{job.job_id}/scan.json"
            raw = {"job_id": job.job_id, "reference": True, "note": "no scanning system was called"}
            _write_json(self.config.results_dir / raw_key, raw)
            fields["raw_s3_key"] = raw_key
        return fields


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": _clip(message, 4000)}


def _passed(reply_deadline: str) -> bool:
    try:
        return datetime.fromisoformat(reply_deadline.upper()) <= datetime.now(UTC)
    except ValueError:  # e.g. a leap second: RFC 3339 allows it, Python does not
        return False


def _header_attempt(msg: Msg, job_id: str) -> int | None:
    """The attempt of the request's `Nats-Msg-Id: <job_id>:<attempt>`, if it is that."""
    head, _, tail = (msg.headers or {}).get(MSG_ID, "").rpartition(":")
    if head.lower() != job_id.lower() or not re.fullmatch(r"[1-9][0-9]{0,17}", tail):
        return None
    return int(tail)


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(content, ensure_ascii=False, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def configs_from_env(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> list[ReferenceConfig]:
    """REFERENCE_SERVICES (default both), subjects from Settings, the rest per from_env."""
    env = os.environ if environ is None else environ
    raw = env.get("REFERENCE_SERVICES", "").strip() or f"{TABULAR},{SCAN}"
    names = list(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    if not names:
        raise ConfigError(
            f"REFERENCE_SERVICES: expected {TABULAR}, {SCAN} or both (comma-separated), got {raw!r}"
        )
    configs = []
    for name in names:
        config = ReferenceConfig.from_env(name, env)
        subject = settings.subject_for(PIPELINES[name])
        configs.append(
            replace(config, request_subject=subject, result_subject=settings.result_subject)
        )
    return configs


async def run_reference(
    settings: Settings, configs: list[ReferenceConfig], stopping: asyncio.Event
) -> None:
    """One NATS connection, one ReferenceService per config, until `stopping` is set."""
    nc = Client()
    await connect(nc, settings, name="arm-core-reference", closing=stopping.is_set, **NATS_OPTIONS)
    services = [ReferenceService(nc, config) for config in configs]
    try:
        for service in services:
            await service.start()
        await stopping.wait()
    finally:
        for service in services:
            await service.stop()
        await nc.close()
