"""Request handlers: validate input, call one SQL function (a method of the store),
shape the answer."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from arm_core.access import shown_level
from arm_core.http.auth import CALLER, Caller, authenticate
from arm_core.http.errors import ApiError, invalid, invalid_parameter
from arm_core.http.health import bridge_states
from arm_core.http.keys import BRIDGE_VIEW, METRICS, SETTINGS, STORE
from arm_core.rows import RetryResult
from arm_core.statuses import JobStatus, RetryOutcome, RetryReason
from arm_core.version import installed

log = logging.getLogger(__name__)

OPENAPI = web.AppKey("openapi", dict)
NO_BODY = object()  # an empty request body (JSON null is a body)

# Why a file cannot be retried, as the database says it (arm.retry_file's reason).
_WHY = {
    RetryReason.NOT_FAILED: "its current job has not failed (it is live or succeeded)",
    RetryReason.ATTEMPTS_EXHAUSTED: "its current job failed on the last allowed attempt",
    RetryReason.NO_JOB: "it has no recognition job",
    RetryReason.ATTEMPT_CHANGED: "its current job is no longer the one named (another "
    "retry came first); look at the file again",
    RetryReason.ARCHIVED: "it was moved to the archive; its history is kept, read-only "
    "(upload the document again to recognise it anew)",
}


def _uuid(raw: object) -> uuid.UUID | None:
    """`raw` as a uuid; None when it is not a string spelling one."""
    try:
        return uuid.UUID(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def _file_id(request: web.Request) -> uuid.UUID:
    raw = request.match_info["file_id"]
    if (found := _uuid(raw)) is None:
        raise ApiError(400, "INVALID_FILE_ID", f"not a uuid: {raw[:64]!r}")
    return found


def _not_retryable_details(row: RetryResult) -> dict[str, Any]:
    return {
        "reason": row.reason,
        "current_job_id": str(row.previous_job_id) if row.previous_job_id else None,
        "current_status": row.previous_status,
        "current_attempt": row.previous_attempt,
        "max_attempts": row.max_attempts,
    }


def _job_id(raw: object, where: str) -> uuid.UUID:
    if (found := _uuid(raw)) is None:
        raise invalid(f"{where}: not a job id (a uuid)")
    return found


def _expected_job(request: web.Request, body: object) -> uuid.UUID | None:
    """The job the caller saw as the file's current one, from the body or If-Match (so
    two retries of one failed attempt never make two new jobs); None: whichever is."""
    from_body: uuid.UUID | None = None
    if body is not NO_BODY and body != {}:
        if not isinstance(body, dict) or set(body) - {"job_id"}:
            raise invalid('the body takes one field: "job_id"')
        from_body = _job_id(body.get("job_id"), "job_id")
    header = request.headers.get("If-Match", "").strip()  # an empty one names nothing
    from_header = _job_id(header.removeprefix("W/").strip('"'), "If-Match") if header else None
    if from_body and from_header and from_body != from_header:
        raise invalid("job_id and If-Match name different jobs")
    return from_body or from_header


async def retry_file(request: web.Request) -> web.Response:
    """POST /api/v1/files/{file_id}/retry [{"job_id": …} | If-Match] → 201 new job."""
    file_id = _file_id(request)
    body: object = NO_BODY
    if request.can_read_body:  # an empty body, {} or {"job_id": …}
        body = await _json_body(request, required=False)
    expected = _expected_job(request, body)
    caller = request[CALLER]
    row = await request.app[STORE].retry_file(
        file_id, caller.actor, expected, actor_level=caller.audit_level
    )
    request.app[METRICS].instruments.metrics.retries.labels(outcome=row.outcome.value).inc()
    if row.outcome is RetryOutcome.NOT_FOUND:
        raise ApiError(404, "FILE_NOT_FOUND", f"no file {file_id}")
    if row.outcome is RetryOutcome.NOT_RETRYABLE:
        why = _WHY.get(row.reason, row.reason) if row.reason else None
        raise ApiError(
            409,
            "FILE_NOT_RETRYABLE",
            f"file {file_id} cannot be retried: {why}",
            _not_retryable_details(row),
        )
    return web.json_response(
        {**_retried(row), "previous_job_id": str(row.previous_job_id)}, status=201
    )


async def retry_files(request: web.Request) -> web.Response:
    """POST /api/v1/files/retry {"file_ids": [...]} → one entry per distinct file."""
    body = await _json_body(request, required=True)
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    unknown = sorted(set(body) - {"file_ids", "files"})
    if unknown:
        raise invalid(f"unknown fields: {', '.join(unknown)[:200]}")
    if ("file_ids" in body) == ("files" in body):
        raise invalid('give either "file_ids" or "files"')
    expected: list[uuid.UUID | None] | None = None
    if "files" in body:
        raw_ids, expected = _named_files(body["files"])
    else:
        raw_ids = body["file_ids"]
    if not isinstance(raw_ids, list):
        raise invalid("file_ids must be a list of uuids")
    limit = request.app[SETTINGS].retry_batch_max
    if len(raw_ids) > limit:
        raise ApiError(413, "TOO_MANY_FILES", f"{len(raw_ids)} file ids; at most {limit} a request")
    if not raw_ids:
        raise invalid("file_ids is empty")
    parsed = [_uuid(raw) for raw in raw_ids]
    ids = [found for found in parsed if found is not None]
    bad = [i for i, found in enumerate(parsed) if found is None]
    if bad:
        raise invalid("file_ids must hold uuids only", {"invalid_indexes": bad[:50]})
    distinct = list(dict.fromkeys(ids))  # request order, duplicates once
    caller = request[CALLER]
    rows = await request.app[STORE].retry_files(
        ids, caller.actor, expected, actor_level=caller.audit_level
    )
    retries = request.app[METRICS].instruments.metrics.retries
    for row in rows:
        retries.labels(outcome=row.outcome.value).inc()
    by_id = {row.file_id: row for row in rows}
    return web.json_response({"results": [_batch_entry(by_id[f]) for f in distinct]})


def _named_files(raw: object) -> tuple[list[object], list[uuid.UUID | None]]:
    """A batch's [{"file_id": …, "job_id": … | null}]: the raw file ids (checked as
    file_ids are) and the jobs expected current (null or absent: whichever is)."""
    if not isinstance(raw, list):
        raise invalid('files must be a list of {"file_id", "job_id"}')
    ids: list[object] = []
    expected: list[uuid.UUID | None] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "file_id" not in item or set(item) - {"file_id", "job_id"}:
            raise invalid(
                f'files[{i}]: expected {{"file_id": …, "job_id": …}}', {"invalid_indexes": [i]}
            )
        ids.append(item["file_id"])
        job = item.get("job_id")
        expected.append(None if job is None else _job_id(job, f"files[{i}].job_id"))
    return ids, expected


def _retried(row: RetryResult) -> dict[str, Any]:
    return {
        "file_id": str(row.file_id),
        "job_id": str(row.job_id),
        "attempt": row.attempt,
        "status": JobStatus.QUEUED,
    }


def _batch_entry(row: RetryResult) -> dict[str, Any]:
    if row.outcome is RetryOutcome.RETRIED:
        return {**_retried(row), "outcome": RetryOutcome.RETRIED}
    skipped = {"file_id": str(row.file_id), "outcome": "skipped"}
    if row.outcome is RetryOutcome.NOT_FOUND:
        return {**skipped, "reason": "FILE_NOT_FOUND"}
    return {**skipped, "reason": "FILE_NOT_RETRYABLE", "details": _not_retryable_details(row)}


async def get_file(request: web.Request) -> web.Response:
    """GET /api/v1/files/{file_id} → the file, its current job and every attempt."""
    file_id = _file_id(request)
    document = await request.app[STORE].get_file(file_id)
    if document is None:
        raise ApiError(404, "FILE_NOT_FOUND", f"no file {file_id}")
    return web.json_response(document)


async def whoami(request: web.Request) -> web.Response:
    """GET /api/v1/whoami, public: the console asks it whether to show its sign-in form,
    and whether to offer retries."""
    settings = request.app[SETTINGS]
    try:
        caller: Caller | None = authenticate(request, settings)
    except ApiError:
        caller = None
    return web.json_response(
        {
            "actor": caller.actor if caller else None,
            "level": shown_level(caller.levels) if caller else None,
            "levels": sorted(level.value for level in caller.levels) if caller else [],
            "auth_mode": settings.auth_mode,
        }
    )


# A bridge writes its row every few seconds (BridgeConfig.heartbeat_seconds, 5): one
# silent for three of those has died, hangs, or cannot reach the database.
BRIDGE_SILENT_SECONDS = 15.0


async def status(request: web.Request) -> web.Response:
    """GET /api/v1/status (http/openapi.json Status), from reads the polls share."""
    app = request.app
    view, bridges, pacing = await app[METRICS].status_view()
    nats, listener = bridge_states(app)
    bridge = None if nats == "off" else {"nats": nats, "listener": listener}
    if bridge is not None and BRIDGE_VIEW in app:
        bridge["name"] = app[BRIDGE_VIEW].name
    return web.json_response(
        {
            "jobs": view.jobs,
            "files": view.files,
            "oldest_queued_age_seconds": round(view.oldest_queued_age_seconds, 3),
            "unacked_overdue": view.unacked_overdue,
            "past_deadline_unswept": view.past_deadline_unswept,
            "last_sweep": {
                "at": view.last_sweep_at.isoformat() if view.last_sweep_at else None,
                "result": view.last_sweep_result,
                "error": view.last_sweep_error,
            },
            "version": installed(),
            "bridge": bridge,
            "bridges": [
                {
                    **asdict(b),
                    "started_at": b.started_at.isoformat(),
                    "seen_seconds_ago": round(max(0.0, b.seen_seconds_ago), 1),
                    "silent": b.seen_seconds_ago > BRIDGE_SILENT_SECONDS,
                }
                for b in bridges
            ],
            # Per pipeline: how many jobs its service may hold at once and holds, what
            # waits for room, and whether the service answers (docs/pacing.md).
            "pacing": [
                {
                    "pipeline": p.pipeline,
                    "mode": p.mode,
                    "in_flight_limit": p.in_flight_limit,
                    "pinned": p.pinned,
                    "in_flight": p.in_flight,
                    "queued": p.queued,
                    "held_back": p.held_back,
                    "answering": p.answering,
                    "silent_since": p.silent_since.isoformat() if p.silent_since else None,
                    "latency_seconds": _rounded(p.latency_seconds),
                    "answers_per_second": _rounded(p.answers_per_second),
                }
                for p in pacing
            ],
        }
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


SERIES_MINUTES = (1, 1440)  # arm.status_series's window: a minute to the day it keeps


async def status_series(request: web.Request) -> web.Response:
    """GET /api/v1/status/series?minutes=60: the console's charts (http/openapi.json
    StatusSeries), from a read the polls share."""
    params = parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True)
    unknown = sorted({name for name, _ in params} - {"minutes"})
    if unknown:
        raise invalid_parameter(unknown[0][:40], "unknown parameter")
    raw = [value for _, value in params] or ["60"]
    low, high = SERIES_MINUTES
    whole = len(raw) == 1 and raw[0].isascii() and raw[0].isdigit() and len(raw[0]) <= 4
    if not whole or not low <= int(raw[0]) <= high:
        raise invalid_parameter("minutes", f"one whole number from {low} to {high}")
    minutes = int(raw[0])
    points = await request.app[METRICS].status_series(minutes)
    return web.json_response(
        {
            "minutes": minutes,
            "points": [
                {
                    "at": p.sampled_at.isoformat(),
                    "seconds": p.seconds,
                    "finished": p.finished,
                    "queued": p.queued,
                    "oldest_queued_age_seconds": round(p.oldest_queued_age_seconds, 3),
                    "waits": p.waits,
                }
                for p in points
            ],
        }
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


async def _json_body(request: web.Request, required: bool) -> Any:
    if request.content_type not in ("application/json", "application/octet-stream", ""):
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "send application/json")
    # The body deadline, where the body is read: a client that stops sending it gets a
    # JSON 408 and the connection is closed (the error middleware closes it).
    seconds = request.app[SETTINGS].http_body_timeout_seconds
    try:
        async with asyncio.timeout(seconds):
            raw = await request.read()
    except TimeoutError:
        log.info(
            "request body not received within HTTP_BODY_TIMEOUT_SECONDS=%g; "
            "answering 408 and closing",
            seconds,
            extra={"action": "http_timeout"},
        )
        raise ApiError(
            408,
            "REQUEST_TIMEOUT",
            f"the request body did not arrive within HTTP_BODY_TIMEOUT_SECONDS={seconds:g}",
        ) from None
    if not raw.strip():
        if required:
            raise ApiError(400, "INVALID_JSON", "the request needs a JSON body")
        return NO_BODY
    try:
        return json.loads(raw)
    except RecursionError:  # e.g. 100,000 nested [ — the decoder recurses once a level
        raise ApiError(400, "INVALID_JSON", "the body is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "INVALID_JSON", f"the body is not valid JSON: {exc}"[:300]) from None
