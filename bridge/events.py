"""One call per event of the bridge: each function here updates the Prometheus metrics
of the service that saw the event (the process's: arm_core.instruments), writes the log
line, and counts the event in the service's `counts` (the per-instance figures a test
reads, keyed mostly by the functions' names). Nothing else in the bridge records these
events, so a metric, its log line and its count cannot disagree."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from arm_core.bridge.envelope import Envelope, Rejected
from arm_core.bridge.nats_client import MSG_ID_HEADER
from arm_core.instruments import Metrics
from arm_core.rows import AppliedEnvelope, DeadLetteredJob, PublishedJob, TaskRun, UnackedJob
from arm_core.statuses import ApplyOutcome, JobStatus

log = logging.getLogger(__name__)

Counts = Counter[str]


class Source(Protocol):
    """The service that saw an event."""

    counts: Counts
    metrics: Metrics


# Why an envelope was lost before the database saw it, as its log line says it.
DROPPED_BECAUSE = {
    "buffer_full": "the database has been unreachable for longer than the inbox's buffer "
    "lasts (INBOX_BUFFER_SIZE {size} envelopes, INBOX_BUFFER_BYTES {bytes} bytes)",
    "shutdown": "the process stopped (or its inbox worker failed) before it could apply them",
}


def _job(action: str, job: PublishedJob | UnackedJob) -> dict[str, Any]:
    return {"action": action, "job_id": job.job_id, "attempt": job.attempt, "msg_id": job.msg_id}


def _envelope(envelope: Envelope, action: str, **more: Any) -> dict[str, Any]:
    return {"action": action, "job_id": envelope.job_id, "msg_id": envelope.msg_id, **more}


# --- the publisher ----------------------------------------------------------------------


def published(seen: Source, jobs: Sequence[PublishedJob]) -> None:
    """A batch reached NATS and committed: its jobs are published."""
    seen.metrics.publish_batches.labels(result="ok").inc()
    seen.metrics.transition("published", len(jobs))
    for job in jobs:
        seen.metrics.waited("queued", job.queued_seconds)
        log.debug("published", extra=_job("publish", job))
    seen.counts["published"] += len(jobs)
    seen.counts["batches"] += 1
    log.info("published %d jobs", len(jobs), extra={"action": "publish", "count": len(jobs)})


def unpublishable(seen: Source, job: PublishedJob | UnackedJob, why: str) -> None:
    """Dead-lettered (REQUEST_TOO_LARGE): the request exceeds the server's max_payload, at
    claim or (max_payload lowered) when it was to be republished."""
    seen.metrics.transition("dlq")
    seen.counts["unpublishable"] += 1
    log.error("dead-lettered: %s", why, extra={**_job("dlq", job), "reason": "REQUEST_TOO_LARGE"})


def batch_failed(seen: Source, action: str, n: int, error: str) -> None:
    """NATS did not confirm a batch (publish or republish): it rolled back."""
    seen.metrics.publish_batches.labels(result="failed").inc()
    seen.counts["failed_batches"] += 1
    log.error(
        "%s of %d jobs failed; they stay as they were: %s",
        action,
        n,
        error,
        extra={"action": action, "count": n, "error": error},
    )


def republished(seen: Source, jobs: Sequence[UnackedJob]) -> None:
    """Overdue, unacked jobs went out again with the same Nats-Msg-Id."""
    seen.metrics.publish_batches.labels(result="ok").inc()
    seen.metrics.republished.inc(len(jobs))
    seen.counts["republished"] += len(jobs)
    for job in jobs:
        log.info(
            "republished: no ack yet",
            extra={**_job("republish", job), "count": job.republish_count + 1},
        )


def dead_lettered(seen: Source, jobs: Sequence[DeadLetteredJob]) -> None:
    """Published jobs moved to dlq (NO_ACK) after their republishes."""
    seen.metrics.transition("dlq", len(jobs))
    seen.counts["dead_lettered"] += len(jobs)
    for job in jobs:
        log.warning(
            "dead-lettered: no ack after %d republishes",
            job.republish_count,
            extra={
                "action": "dlq",
                "job_id": job.job_id,
                "attempt": job.attempt,
                "file_id": job.file_id,
                "reason": "NO_ACK",
            },
        )


# --- the inbox --------------------------------------------------------------------------


def rejected(seen: Source, subject: str, why: Rejected) -> None:
    """A message that is no envelope: not JSON, not schema-valid, no Nats-Msg-Id, …"""
    seen.metrics.envelope("rejected")
    seen.counts["rejected"] += 1
    log.warning(
        "dropped a message from %s: %s",
        subject,
        why.detail,
        extra={
            "action": "inbox_drop",
            "reason": why.reason,
            "job_id": why.job_id,
            "msg_id": why.msg_id,
        },
    )


def accepted(seen: Source, envelope: Envelope) -> None:
    """A schema-valid envelope taken as it came, or: made storable (NUL, NaN/Infinity or
    lone surrogates replaced), an ack without Nats-Msg-Id named ack:<job_id> (said once
    per ack, so the service's team can add the header), text over the core's caps cut."""
    if envelope.made_storable:
        seen.counts["made_storable"] += 1
        log.warning(
            "envelope made storable (NUL, NaN/Infinity or lone surrogates replaced): %s",
            ", ".join(envelope.made_storable)[:300],
            extra=_envelope(envelope, "inbox_sanitize", status=envelope.status),
        )
    if envelope.msg_id_derived:
        seen.counts["ack_without_msg_id"] += 1
        log.info(
            "ack without %s: taken as %s",
            MSG_ID_HEADER,
            envelope.msg_id,
            extra=_envelope(envelope, "inbox_ack_without_msg_id", status=envelope.status),
        )
    if envelope.truncated:
        seen.counts["truncated"] += 1
        log.warning(
            "answer stored with over-long fields cut to the caps: %s",
            ", ".join(envelope.truncated),
            extra=_envelope(envelope, "inbox_truncate", status=envelope.status),
        )


def redelivered(seen: Source, n: int) -> None:
    """Messages of a fetch from the results stream that were delivered before."""
    seen.metrics.redelivered.inc(n)
    seen.counts["redelivered"] += n
    log.info(
        "%d answer(s) delivered again by the results stream (handed back by a bridge that "
        "lost its database, or not acknowledged within its ack_wait: one holding them "
        "stopped or died)",
        n,
        extra={"action": "inbox_redelivered", "count": n},
    )


def replayed(seen: Source, n: int, stream: str, leader: str) -> None:
    """The stream elected a leader: the last seconds' core NATS answers go to the inbox
    again (bridge/replay.py)."""
    seen.metrics.replayed.inc(n)
    seen.counts["replayed"] += n
    log.info(
        "stream %s has a new leader (%s): %d answer(s) of the last seconds applied again "
        "from core NATS, for those it did not store while it had none",
        stream,
        leader or "?",
        n,
        extra={"action": "stream_replay", "count": n, "leader": leader},
    )


def dropped(seen: Source, envelope: Envelope, reason: str) -> None:
    """An envelope lost before the database saw it (buffer_full, shutdown); its burst is
    told once (bridge/buffer.py DropBursts)."""
    seen.metrics.envelope("dropped")
    seen.counts[f"dropped.{reason}"] += 1
    log.debug(
        "dropped an envelope (%s)",
        reason,
        extra=_envelope(envelope, "inbox_drop", reason=reason, status=envelope.status),
    )


def handed_back(seen: Source, n: int, reason: str) -> None:
    """Messages of the results stream this bridge let go unapplied (a NAK)."""
    seen.metrics.handed_back.inc(n)
    seen.counts["handed_back"] += n
    log.info(
        "handed %d answer(s) back to the results stream (%s): another bridge takes them",
        n,
        "the database is unreachable" if reason == "buffer_full" else "stopping",
        extra={"action": "stream_hand_back", "count": n, "reason": reason},
    )


def intake(seen: Source, paused_by: Exception | None) -> None:
    """RESULTS_STREAM: the database is unreachable (`paused_by` says why), so the bridge
    takes no more answers; or it answers again."""
    if paused_by is None:
        seen.counts["intake_resumed"] += 1
        log.info(
            "the database answers: taking answers from the results stream again",
            extra={"action": "stream_intake", "state": "resumed"},
        )
        return
    seen.counts["intake_paused"] += 1
    log.warning(
        "this bridge cannot reach its database: it takes no more answers from the results "
        "stream and hands back what it holds, until the database answers (%s)",
        paused_by,
        extra={"action": "stream_intake", "state": "paused"},
    )


def slow_consumer(seen: Source) -> None:
    """nats-py dropped a message: the subscription's queue was full (nats-py logs it)."""
    seen.metrics.envelope("dropped")
    seen.counts["dropped.slow_consumer"] += 1


def outcome(seen: Source, envelope: Envelope, row: AppliedEnvelope | None, error: str = "") -> None:
    """What the database made of one envelope (`busy`: not yet, it is applied again); no
    `row`: it raised on this envelope even alone (`failed`, with the error)."""
    result = row.outcome if row else ApplyOutcome.FAILED
    seen.counts[result.value] += 1
    if result is ApplyOutcome.BUSY:
        return
    seen.metrics.envelope(result.value)
    action = "ack" if envelope.is_ack else "result"
    attempt = row.attempt if row else None
    extra = _envelope(envelope, action, attempt=attempt, status=envelope.status)
    if row is None:
        log.error(
            "%s could not be applied: %s",
            action,
            error,
            extra={**extra, "reason": "apply_error", "outcome": result},
        )
    elif result is ApplyOutcome.APPLIED:
        if row.status is not None:
            seen.metrics.transition(row.status.value)
            phase = "ack" if row.status is JobStatus.PROCESSING else "processing"
            seen.metrics.waited(phase, row.wait_seconds)
        log.debug("%s applied", action, extra=extra)
    else:  # a valid envelope with nothing to change: duplicate, already_final, …
        seen.counts["ignored"] += 1
        level = logging.INFO if result is ApplyOutcome.DUPLICATE else logging.WARNING
        extra.update(reason=result, outcome=result)
        log.log(level, "%s ignored: %s", action, result, extra=extra)


def applied_batch(seen: Source, outcomes: Counter[ApplyOutcome]) -> None:
    """One arm.apply_envelopes_v2 call: one line at INFO for the batch (one per envelope
    is DEBUG: a line per envelope cost a fifth of the bridge's CPU in a burst)."""
    seen.counts["batches"] += 1
    if applied := outcomes[ApplyOutcome.APPLIED]:
        log.info(
            "applied %d envelopes in one transaction (%s)",
            applied,
            ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())),
            extra={"action": "inbox_batch", "count": applied},
        )


def held(seen: Source, n: int, waiting: int, error: Exception) -> None:
    """The database is unreachable, or the pool exhausted: the inbox tries again."""
    seen.counts["db_retries"] += 1
    # DEBUG: the outage (or the exhausted pool) is logged once by arm_core.db, not once
    # per retry; `error` says which.
    log.debug(
        "holding %d envelopes (%d more waiting): %s",
        n,
        waiting,
        error,
        extra={"action": "inbox_hold", "count": n},
    )


def settled(seen: Source, terminated: bool) -> None:
    """A message of the results stream acked (outcome final) or terminated (garbage)."""
    seen.counts["terminated" if terminated else "acked"] += 1


# --- the schedule -----------------------------------------------------------------------


def task_ran(seen: Source, task: TaskRun) -> None:
    """A periodic task ran (the sweep's result is how many jobs timed out)."""
    seen.counts[f"task.{task.task}"] += 1
    if task.task == "sweep_timeouts" and task.result and task.result.isdigit():
        seen.metrics.transition("timeout", int(task.result))
    if task.error:
        log.error(
            "periodic task %s failed: %s",
            task.task,
            task.error,
            extra={"action": "schedule", "error": task.error},
        )
    elif task.result not in (None, "0") and task.task != "sample_status":  # every minute
        log.info(
            "periodic task %s: %s",
            task.task,
            task.result,
            extra={"action": "schedule", "count": task.result},
        )
