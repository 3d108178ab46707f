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
each confirmed before it is forgotten, through JetStream publish where a stream captures
the result subject: :mod:`arm_core.devtools.reference_sender`.

Its configuration, :class:`ReferenceConfig` (REFERENCE_*), is in
:mod:`arm_core.devtools.reference_config`; what it reads from a request and writes in
an answer below the schemas, in :mod:`arm_core.devtools.reference_contract`. Their
names are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from arm_core.bridge.contracts import CONTRACT_MAJOR, REQUEST_SCHEMA, other_major, problem
from arm_core.bridge.nats_client import confirm, connect
from arm_core.config import Settings
from arm_core.devtools.reference_config import (
    DEFAULT_SUBJECTS,
    ERROR_CODES,
    FAIL_ONCE,
    MARKERS,
    MODES,
    PIPELINES,
    SCAN,
    TABULAR,
    ReferenceConfig,
    configs_from_env,
)
from arm_core.devtools.reference_contract import (
    Job,
    clip,
    deadline_passed,
    error_field,
    header_attempt,
    positive_int,
    uuid_or_none,
    write_json,
)
from arm_core.devtools.reference_sender import AnswerSender, ReferenceStats

__all__ = [
    "DEFAULT_SUBJECTS",
    "ERROR_CODES",
    "FAIL_MESSAGE",
    "FAIL_ONCE",
    "MARKERS",
    "MODES",
    "NATS_OPTIONS",
    "NOTE",
    "PIPELINES",
    "REMEMBERED_JOBS",
    "REMEMBER_SECONDS",
    "SCAN",
    "TABULAR",
    "ReferenceConfig",
    "ReferenceService",
    "ReferenceStats",
    "configs_from_env",
    "run_reference",
]

log = logging.getLogger(__name__)

NOTE = "reference service: the file was not read or recognised"
FAIL_MESSAGE = "reference service: failing on purpose (REFERENCE_MODE=fail or [fail] in the name)"
# Jobs kept for duplicate detection, oldest forgotten first: a repeat of a request comes
# within its ack timeout's republishes (two minutes with the defaults), so a job is kept
# REMEMBER_SECONDS, and at most REMEMBERED_JOBS of them. A job forgotten and asked for
# again is answered again, with the same Nats-Msg-Ids: the core calls that a duplicate.
# The time bound keeps the memory flat after a few minutes of a steady flow: an hour's
# soak saw the count bound alone still filling (and the RSS growing) after its 10-minute
# warm-up at 33 jobs a second per service.
REMEMBER_SECONDS = 300.0
REMEMBERED_JOBS = 20_000

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


class ReferenceService(AnswerSender):
    """Subscribes to one request subject in the service's queue group and answers on
    the result subject. The subscription callback acks at once and never raises; the
    slow part of each job runs in a task of its own. Its answers go out through
    :class:`AnswerSender`, which it is."""

    def __init__(self, nc: Client, config: ReferenceConfig) -> None:
        super().__init__(nc, config)
        # By lower-case job_id, in work or answered, oldest first (popped in O(1)).
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Subscription | None = None
        # REFERENCE_WORKERS: the files worked on at once; the rest wait their turn.
        self._workers = asyncio.Semaphore(config.workers) if config.workers else None

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
        job_id = uuid_or_none(body.get("job_id"))
        if job_id is None:
            value = body.get("job_id")
            detail = clip(value, 80) if isinstance(value, str) else type(value).__name__
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

        job = Job(job_id, body["file_id"], positive_int(body["attempt"]) or 1, acked=True)
        mode = self._mode(body["original_name"], job.attempt)
        if mode == "never_ack":
            return self._drop("never_ack", "mode never_ack", job_id, job.attempt)
        if mode != "never_answer" and self.config.service == SCAN:
            if deadline_passed(body["reply_deadline"]):
                mode = "timeout"
        late_ack = self._workers is not None and self.config.ack == "start"
        if not late_ack:
            await self._send(job, "processing")
            self.stats.acked += 1
        self._remember(job)
        if mode != "never_answer" or late_ack:
            task = asyncio.create_task(self._work(job, body, mode, time.monotonic()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _problem(self, body: dict[str, Any]) -> tuple[str, str] | None:
        """Why the request breaks the contract — the reason logged and what the answer
        says — or None. Every MINOR of MAJOR 1 is read, its new fields ignored."""
        if (major := other_major(body.get("schema_version"))) is not None:
            said = f"schema_version MAJOR {major}: MAJOR version {CONTRACT_MAJOR} expected"
            return "schema_version_unsupported", said
        if (why := problem(REQUEST_SCHEMA, body, limit=500)) is not None:
            return "schema_mismatch", why
        if body["pipeline"] != PIPELINES[self.config.service]:
            said = f"pipeline {body['pipeline']!r} is not served by {self.config.service}"
            return "schema_mismatch", said
        return None

    def _mode(self, original_name: str, attempt: int = 1) -> str:
        name = original_name.lower()
        if FAIL_ONCE in name:
            return "fail" if attempt == 1 else self.config.mode
        return next((mode for marker, mode in MARKERS if marker in name), self.config.mode)

    def _remember(self, job: Job) -> None:
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

    async def _schema_mismatch(
        self, msg: Msg, body: dict[str, Any], job_id: str, problem: tuple[str, str]
    ) -> None:
        """A request against the contract, its ids readable: an error SCHEMA_MISMATCH, no
        ack; the log line says why (`schema_mismatch`, `schema_version_unsupported`)."""
        reason, problem_text = problem
        file_id = uuid_or_none(body.get("file_id"))
        if file_id is None:
            return self._drop("file_id_unreadable", problem_text, job_id)
        attempt = positive_int(body.get("attempt"))
        if attempt is None:  # the contract leaves it open (docs/contracts/README.md)
            attempt = 1 if self.config.service == SCAN else header_attempt(msg, job_id)
        if attempt is None:
            return self._drop("attempt_unreadable", problem_text, job_id)
        job = Job(job_id, file_id, attempt, acked=False)
        self._remember(job)
        self.stats.schema_mismatch += 1
        message = f"request does not match {REQUEST_SCHEMA} v1: {problem_text}"
        log.warning(
            "%s: request against the contract, answered SCHEMA_MISMATCH: %s",
            self.config.service,
            problem_text,
            extra={"action": "ref_refuse", "reason": reason, "job_id": job_id, "attempt": attempt},
        )
        await self._send(
            job, "error", "schema mismatch", error=error_field("SCHEMA_MISMATCH", message)
        )

    async def _work(self, job: Job, body: dict[str, Any], mode: str, started: float) -> None:
        """After the ack: the (pretend) S3 read and recognition, then the result — on one
        of REFERENCE_WORKERS when set, once one is free (acking then with
        REFERENCE_ACK=start)."""
        if self._workers is None:
            return await self._recognise(job, body, mode, started)
        async with self._workers:
            began = time.monotonic()
            try:
                if self.config.ack == "start":
                    await self._send(job, "processing")
                    self.stats.acked += 1
                if mode != "never_answer":
                    await self._recognise(job, body, mode, started)
            finally:
                self.stats.busy_seconds += time.monotonic() - began

    async def _recognise(self, job: Job, body: dict[str, Any], mode: str, started: float) -> None:
        cfg = self.config
        try:
            if mode == "timeout":
                message = f"reply_deadline {body['reply_deadline']} passed before the scan"
                await self._send(
                    job, "error", "deadline passed", error=error_field("TIMEOUT", message)
                )
            else:
                await asyncio.sleep(cfg.delay_seconds)
                ms = round((time.monotonic() - started) * 1000)
                metrics = {"duration_ms": ms, "reference": True}
                if mode == "fail":
                    error = error_field(cfg.fail_code, FAIL_MESSAGE)
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

    def _write_files(self, job: Job, body: dict[str, Any]) -> dict[str, Any]:
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
        write_json(self.config.results_dir / key, content)
        fields: dict[str, Any] = {
            "result_s3": {"bucket": self.config.results_bucket, "key": key},
            "result_schema_version": "1.0",
        }
        if self.config.service == SCAN:
            raw_key = f"raw/{job.file_id}/{job.job_id}/scan.json"
            raw = {"job_id": job.job_id, "reference": True, "note": "no scanning system was called"}
            write_json(self.config.results_dir / raw_key, raw)
            fields["raw_s3_key"] = raw_key
        return fields


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
