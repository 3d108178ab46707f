"""The reference recognition service against a real nats-server
(docs/behaviour.md#contracts, service side).

Every envelope a test sees is checked against the result schema when the test ends. A
"nothing was published" claim is settled by a sentinel: a normal request sent afterwards
whose `done` comes after anything the earlier message could have produced.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import re
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from arm_core.bridge.contracts import CONTRACTS_DIR, RESULT_SCHEMA, validator
from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.devtools import reference
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.reference import (
    NATS_OPTIONS,
    NOTE,
    SCAN,
    TABULAR,
    ReferenceConfig,
    ReferenceService,
    configs_from_env,
    run_reference,
)
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ARM_CORE
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import Collector, nats_client
from tests.support.bridge import logged

RESULTS = "files.tabular_parsed"
SUBJECTS = {TABULAR: "files.tabular_uploaded", SCAN: "files.img_uploaded"}
DELAY = 0.05
Start = Callable[..., Awaitable[ReferenceService]]


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONTRACTS_DIR / "examples" / name).read_text("utf-8"))
    return loaded


def request(service: str = TABULAR, **overrides: Any) -> dict[str, Any]:
    """A valid request for `service` with fresh ids and a future deadline."""
    body = example("request-tabular.json" if service == TABULAR else "request-image.json")
    file_id = str(uuid.uuid4())
    body.update(job_id=str(uuid.uuid4()), file_id=file_id, reply_deadline="2099-01-01T00:00:00Z")
    body["s3"]["key"] = f"uploads/{file_id}/{body['original_name']}"
    body.update(overrides)
    return body


@dataclass
class Seen(Collector):
    """Envelopes on files.tabular_parsed; for each `done`, the result file as it was on
    arrival (None if it was not there yet)."""

    results_dir: Path = Path()
    files_on_arrival: dict[str, Any] = field(default_factory=dict)

    async def on_message(self, msg: Msg) -> None:
        body = json.loads(msg.data)
        if body.get("status") == "done":
            path = self.results_dir / body["result_s3"]["key"]
            content = json.loads(path.read_bytes()) if path.exists() else None
            self.files_on_arrival[body["job_id"]] = content
        await super().on_message(msg)

    def of(self, job_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(Nats-Msg-Id, body) of every envelope about `job_id`, in arrival order."""
        pairs = zip(self.msg_ids(), self.bodies(), strict=True)
        return [(msg_id, body) for msg_id, body in pairs if body["job_id"] == job_id]

    def assert_valid(self) -> None:
        """Rule 4: every envelope passes the result schema and carries the right id."""
        for msg_id, body in zip(self.msg_ids(), self.bodies(), strict=True):
            validator(RESULT_SCHEMA).validate(body)
            kind = "ack" if body["status"] == "processing" else "result"
            assert re.fullmatch(rf"{kind}:{body['job_id']}:[1-9][0-9]*", msg_id), msg_id
            assert "group_schema" not in body


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "bucket"


@pytest.fixture
async def seen(client: Client, results_dir: Path) -> AsyncIterator[Seen]:
    collector = Seen(results_dir=results_dir)
    await client.subscribe(RESULTS, cb=collector.on_message)
    await client.flush()
    yield collector
    collector.assert_valid()


@pytest.fixture
async def start(nats_server: EmbeddedNats, results_dir: Path) -> AsyncIterator[Start]:
    """Starts reference services on a connection of their own; stops them afterwards."""
    nc = await nats_client(nats_server.url())
    services: list[ReferenceService] = []

    async def start_service(service: str = TABULAR, **overrides: Any) -> ReferenceService:
        options: dict[str, Any] = {"delay_seconds": DELAY, "results_dir": results_dir}
        reference = ReferenceService(nc, ReferenceConfig(service, **{**options, **overrides}))
        await reference.start()
        services.append(reference)
        return reference

    try:
        yield start_service
    finally:
        for reference in services:
            await reference.stop()
        await nc.close()


async def send_raw(
    client: Client, data: bytes, msg_id: str | None, subject: str = SUBJECTS[TABULAR]
) -> None:
    await client.publish(subject, data, headers={"Nats-Msg-Id": msg_id} if msg_id else None)
    await client.flush()


async def send(client: Client, body: dict[str, Any], subject: str | None = None) -> None:
    """Publishes a request as the core does: subject by pipeline, `<job_id>:<attempt>`."""
    subject = subject or SUBJECTS[SCAN if body.get("pipeline") == "image" else TABULAR]
    msg_id = f"{body['job_id']}:{body.get('attempt')}"
    await send_raw(client, json.dumps(body).encode(), msg_id, subject)


async def answered(seen: Seen, job_id: str, count: int, within: float = 5.0) -> list[Any]:
    await wait_for(lambda: len(seen.of(job_id)) >= count, within, f"{count} envelopes")
    return seen.of(job_id)


async def settle(client: Client, seen: Seen, service: str = TABULAR) -> None:
    """Sends a normal request to `service` and waits for its `done`: whatever the messages
    sent before could still produce has been published by then."""
    sentinel = request(service)
    await send(client, sentinel)
    _, done = (await answered(seen, sentinel["job_id"], 2))[-1]
    assert done["status"] == "done"


def files(root: Path) -> list[str]:
    """Every file under `root`, relative to it (temporary files included)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def statuses(pairs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [body["status"] for _, body in pairs]


# -- rule 3: a valid request is acked at once, then the file, then done -----------------


async def test_example_request_is_acked_then_done_after_the_result_file(
    client: Client, seen: Seen, start: Start, results_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="arm_core.devtools.reference")
    service = await start(TABULAR)
    body = example("request-tabular.json")
    job_id, file_id = body["job_id"], body["file_id"]
    await send(client, body)

    (ack_id, ack), (result_id, done) = await answered(seen, job_id, 2)
    assert (ack_id, result_id) == (f"ack:{job_id}:1", f"result:{job_id}:1")
    service_field = {"name": "tabular-parser", "version": "0.1.0-reference"}
    assert ack == {
        "schema_version": "1.0",
        "job_id": job_id,
        "file_id": file_id,
        "status": "processing",
        "service": service_field,
    }
    key = f"results/{file_id}/{job_id}/result.json"
    assert done["status"] == "done"
    assert done["result_s3"] == {"bucket": "arm-ka", "key": key}
    assert done["result_schema_version"] == "1.0"
    assert done["metrics"]["reference"] is True
    assert done["metrics"]["duration_ms"] >= DELAY * 1000 * 0.8
    assert "raw_s3_key" not in done  # scan-gateway only

    expected = {
        "schema_version": "1.0",
        "job_id": job_id,
        "file_id": file_id,
        "original_name": "ОСВ 60 счёт 2026-09.xlsx",
        "service": service_field,
        "reference": True,
        "note": NOTE,
        "group_schema": None,
    }
    assert seen.files_on_arrival[job_id] == expected  # complete before the envelope
    assert files(results_dir) == [key]  # and no temporary file left behind
    assert service.stats.received == service.stats.acked == service.stats.processed == 1

    assert logged(caplog.records, action="ref_ack", job_id=job_id, attempt=1)
    assert logged(caplog.records, action="ref_result", job_id=job_id, attempt=1, status="done")


async def test_scan_gateway_result_carries_raw_s3_key(
    client: Client, seen: Seen, start: Start, results_dir: Path
) -> None:
    await start(SCAN)
    body = request(SCAN, attempt=2)
    await send(client, body)
    (ack_id, _), (result_id, done) = await answered(seen, body["job_id"], 2)
    assert (ack_id, result_id) == (f"ack:{body['job_id']}:2", f"result:{body['job_id']}:2")
    assert done["status"] == "done"
    assert done["service"]["name"] == "scan-gateway"
    assert done["raw_s3_key"] == f"raw/{body['file_id']}/{body['job_id']}/scan.json"
    assert json.loads((results_dir / done["raw_s3_key"]).read_bytes())["reference"] is True
    assert seen.files_on_arrival[body["job_id"]]["note"] == NOTE


# -- rule 6: a past reply_deadline -------------------------------------------------------


async def test_example_image_request_with_past_deadline_gets_timeout_from_scan_gateway(
    client: Client, seen: Seen, start: Start, results_dir: Path
) -> None:
    await start(SCAN)
    body = example("request-image.json")  # reply_deadline 2024-03-01T10:30:00Z
    await send(client, body)
    (ack_id, ack), (result_id, error) = await answered(seen, body["job_id"], 2)
    assert ack_id == f"ack:{body['job_id']}:1" and ack["status"] == "processing"
    assert result_id == f"result:{body['job_id']}:1"
    assert error["status"] == "error" and error["error"]["code"] == "TIMEOUT"
    assert "2024-03-01T10:30:00Z" in error["error"]["message"]
    assert files(results_dir) == []  # nothing was "recognised"


async def test_tabular_parser_processes_a_request_past_its_deadline(
    client: Client, seen: Seen, start: Start
) -> None:
    await start(TABULAR)
    body = request(reply_deadline="2024-03-01T10:30:00Z")
    await send(client, body)
    assert statuses(await answered(seen, body["job_id"], 2)) == ["processing", "done"]


# -- rule 1: job_id unreadable → no answer ----------------------------------------------

UNREADABLE: list[tuple[bytes, str]] = [
    (b"", "not_json"),
    (b"not json at all", "not_json"),
    (b"\xff\xfe\x00\x01binary", "not_json"),
    (b"[" * 200_000, "not_json"),  # nested deeper than the parser goes
    (b'{"job_id": ' + b"[" * 400 + b"]" * 400 + b"}", "job_id_unreadable"),
    (b"[1, 2, 3]", "not_an_object"),
    (b'"3f0c9a52-7d1e-4b8a-9c41-5e2f8a6b1d07"', "not_an_object"),
    (b"null", "not_an_object"),
    (b"{}", "job_id_unreadable"),
    (json.dumps({**request(), "job_id": None}).encode(), "job_id_unreadable"),
    (json.dumps({**request(), "job_id": "job-42"}).encode(), "job_id_unreadable"),
    (json.dumps({**request(), "job_id": 42}).encode(), "job_id_unreadable"),
    (json.dumps({**request(), "job_id": uuid.uuid4().hex}).encode(), "job_id_unreadable"),
    (json.dumps({**request(), "job_id": "x" * 600_000}).encode(), "job_id_unreadable"),
    (
        json.dumps({k: v for k, v in request().items() if k != "job_id"}).encode(),
        "job_id_unreadable",
    ),
]


async def test_unreadable_job_id_gets_no_answer_and_never_crashes_the_service(
    client: Client, seen: Seen, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    service = await start(TABULAR)
    for data, _ in UNREADABLE:
        await send_raw(client, data, f"{uuid.uuid4()}:1")
    await settle(client, seen)

    assert len(seen.messages) == 2  # the sentinel's ack and done, nothing else
    assert service.stats.received == len(UNREADABLE) + 1
    assert service.stats.dropped == len(UNREADABLE)
    drops = [r.reason for r in logged(caplog.records, action="ref_drop")]
    assert drops == [reason for _, reason in UNREADABLE]
    assert all(r.levelno == logging.WARNING for r in logged(caplog.records, action="ref_drop"))


# -- rule 2: schema-invalid with readable ids → SCHEMA_MISMATCH, no ack ------------------


def without_s3_key(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "s3": {"bucket": body["s3"]["bucket"]}}


INVALID: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = [
    ("no s3.key", without_s3_key, 's3: "key" is a required property'),
    ("unknown file_type", lambda b: {**b, "file_type": "DOCX"}, "DOCX"),
    ("MAJOR version 2", lambda b: {**b, "schema_version": "2.0"}, "MAJOR version 1"),
    ("no MINOR", lambda b: {**b, "schema_version": "1"}, "schema_version"),
    ("wrong pipeline", lambda b: {**b, "pipeline": "image", "file_type": "PDF"}, "pipeline"),
    ("bad deadline", lambda b: {**b, "reply_deadline": "tomorrow"}, "reply_deadline"),
    ("huge name", lambda b: {**b, "original_name": "я" * 100_000}, "original_name"),
]


@pytest.mark.parametrize(("case", "break_it", "says"), INVALID, ids=[c[0] for c in INVALID])
async def test_schema_invalid_request_gets_schema_mismatch_without_ack(
    client: Client,
    seen: Seen,
    start: Start,
    case: str,
    break_it: Callable[[dict[str, Any]], dict[str, Any]],
    says: str,
) -> None:
    service = await start(TABULAR)
    body = break_it(request(attempt=2))
    await send(client, body, SUBJECTS[TABULAR])
    await settle(client, seen)

    [(msg_id, error)] = seen.of(body["job_id"])  # the error only: no ack before it
    assert msg_id == f"result:{body['job_id']}:2"
    assert error["status"] == "error" and error["error"]["code"] == "SCHEMA_MISMATCH"
    assert says in error["error"]["message"]
    assert "recognition-request.schema.json" in error["error"]["message"]
    assert service.stats.schema_mismatch == 1 and service.stats.acked == 1  # the sentinel


@pytest.mark.parametrize(
    ("service_name", "body_attempt", "header", "expected"),
    [
        (TABULAR, None, "{job}:3", "result:{job}:3"),  # open in the contract: the header's
        (TABULAR, "2", "{job}:4", "result:{job}:4"),  # not a positive int in the body
        (TABULAR, 0, "{job}:5", "result:{job}:5"),
        (TABULAR, None, None, None),  # no header: no answer
        (TABULAR, None, "{job}:x", None),
        (TABULAR, None, "{job}:²", None),
        (TABULAR, None, "00000000-0000-4000-8000-000000000001:3", None),  # another job's id
        (SCAN, None, None, "result:{job}:1"),  # open in the contract: scan-gateway takes 1
        (SCAN, None, "{job}:3", "result:{job}:1"),
        (SCAN, 7, "{job}:3", "result:{job}:7"),  # the body wins when it has one
    ],
)
async def test_schema_mismatch_attempt_comes_from_body_then_the_header(
    client: Client,
    seen: Seen,
    start: Start,
    caplog: pytest.LogCaptureFixture,
    service_name: str,
    body_attempt: Any,
    header: str | None,
    expected: str | None,
) -> None:
    service = await start(service_name)
    body = without_s3_key(request(service_name))
    del body["attempt"]
    if body_attempt is not None:
        body["attempt"] = body_attempt
    job = body["job_id"]
    msg_id = header.format(job=job) if header else None
    await send_raw(client, json.dumps(body).encode(), msg_id, SUBJECTS[service_name])
    await settle(client, seen, service_name)

    if expected is None:
        assert seen.of(job) == []
        assert service.stats.dropped == 1
        assert logged(caplog.records, action="ref_drop", reason="attempt_unreadable", job_id=job)
    else:
        [(msg_id, error)] = seen.of(job)
        assert msg_id == expected.format(job=job)
        assert error["error"]["code"] == "SCHEMA_MISMATCH"


async def test_a_later_minor_is_served_and_another_major_refused_saying_so(
    client: Client, seen: Seen, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """The contract's version rule, on the service's side: a request of a later MINOR is
    acked and answered, the fields this version does not know ignored; one of another
    MAJOR gets SCHEMA_MISMATCH and a log line with reason schema_version_unsupported."""
    caplog.set_level(logging.INFO, logger="arm_core.devtools.reference")
    await start(TABULAR)
    later = {**request(attempt=1), "schema_version": "1.3", "priority": "high"}
    later["s3"] = {**later["s3"], "region": "ru"}
    await send(client, later, SUBJECTS[TABULAR])
    (_, ack), (_, done) = await answered(seen, later["job_id"], 2)
    assert (ack["status"], done["status"]) == ("processing", "done")

    other = {**request(attempt=1), "schema_version": "2.0"}
    await send(client, other, SUBJECTS[TABULAR])
    [(_, error)] = await answered(seen, other["job_id"], 1)
    assert error["error"]["code"] == "SCHEMA_MISMATCH"
    assert "MAJOR version 1 expected" in error["error"]["message"]
    [refused] = logged(caplog.records, action="ref_refuse", job_id=other["job_id"])
    assert refused.reason == "schema_version_unsupported"
    assert not logged(caplog.records, action="ref_refuse", job_id=later["job_id"])


async def test_schema_invalid_request_with_unreadable_file_id_gets_no_answer(
    client: Client, seen: Seen, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    service = await start(TABULAR)
    body = {**request(), "file_id": "not-a-uuid"}
    await send(client, body)
    await settle(client, seen)
    assert seen.of(body["job_id"]) == []
    assert service.stats.dropped == 1
    assert logged(caplog.records, action="ref_drop", reason="file_id_unreadable")


# -- rule 5: duplicates --------------------------------------------------------------------


async def test_repeated_request_is_acked_again_and_processed_once(
    client: Client, seen: Seen, start: Start, results_dir: Path
) -> None:
    service = await start(TABULAR, delay_seconds=0.3)
    body = request()
    job = body["job_id"]
    await send(client, body)
    await answered(seen, job, 1)
    await send(client, body)  # in work: the core republished after a lost ack
    await answered(seen, job, 3)
    await send(client, body)  # done already
    await settle(client, seen)

    pairs = seen.of(job)
    assert statuses(pairs) == ["processing", "processing", "done", "processing"]
    assert [msg_id for msg_id, _ in pairs] == [f"ack:{job}:1"] * 2 + [f"result:{job}:1"] + [
        f"ack:{job}:1"
    ]
    assert (service.stats.acked, service.stats.reacked, service.stats.processed) == (2, 2, 2)
    assert [f for f in files(results_dir) if job in f] == [
        f"results/{body['file_id']}/{job}/result.json"
    ]


@pytest.mark.parametrize("bound", ["time", "count"])
async def test_a_job_forgotten_is_answered_again_with_the_same_message_ids(
    bound: str, client: Client, seen: Seen, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service remembers a job for REMEMBER_SECONDS, and at most REMEMBERED_JOBS of
    them (its memory stays flat under a steady flow); a repeat after that is processed
    again, and its ack and result carry the same Nats-Msg-Ids, which the core calls
    duplicates."""
    if bound == "time":
        monkeypatch.setattr(reference, "REMEMBER_SECONDS", 0.5)
    else:
        monkeypatch.setattr(reference, "REMEMBERED_JOBS", 1)
    service = await start(TABULAR, delay_seconds=0)
    body = request()
    job = body["job_id"]
    await send(client, body)
    await answered(seen, job, 2)
    if bound == "time":
        await asyncio.sleep(0.6)  # the window's length, not a wait for a condition
    await settle(client, seen)  # a newer job: the oldest is forgotten as it comes in
    await send(client, body)
    await answered(seen, job, 4)
    pairs = seen.of(job)
    assert statuses(pairs) == ["processing", "done"] * 2
    assert [m for m, _ in pairs] == [f"ack:{job}:1", f"result:{job}:1"] * 2
    assert (service.stats.reacked, service.stats.processed) == (0, 3)


async def test_schema_invalid_repeat_of_a_known_job_publishes_nothing(
    client: Client, seen: Seen, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    service = await start(TABULAR)
    body = request()
    await send(client, body)
    await answered(seen, body["job_id"], 2)
    await send(client, without_s3_key(body))  # its SCHEMA_MISMATCH would shadow the result
    await settle(client, seen)

    assert statuses(seen.of(body["job_id"])) == ["processing", "done"]
    assert service.stats.schema_mismatch == 0 and service.stats.dropped == 1
    assert logged(caplog.records, action="ref_drop", reason="duplicate_invalid")


async def test_repeat_of_a_schema_mismatch_is_not_answered_twice(
    client: Client, seen: Seen, start: Start
) -> None:
    service = await start(TABULAR)
    body = without_s3_key(request())
    await send(client, body)
    await send(client, body)
    await settle(client, seen)
    assert statuses(seen.of(body["job_id"])) == ["error"]
    assert service.stats.schema_mismatch == 1 and service.stats.dropped == 1


# -- rule 7: modes and per-file markers --------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "name", "expected", "code"),
    [
        ("fail", "ОСВ.xlsx", ["processing", "error"], "INVALID_DOCUMENT"),
        ("normal", "ОСВ [fail].xlsx", ["processing", "error"], "INVALID_DOCUMENT"),
        ("never_ack", "ОСВ.xlsx", [], None),
        ("normal", "ОСВ [noack].xlsx", [], None),
        ("never_answer", "ОСВ.xlsx", ["processing"], None),
        ("normal", "ОСВ [SILENT].xlsx", ["processing"], None),
        ("fail", "ОСВ [silent].xlsx", ["processing"], None),  # the marker wins
    ],
)
async def test_modes_and_markers(
    client: Client,
    seen: Seen,
    start: Start,
    results_dir: Path,
    mode: str,
    name: str,
    expected: list[str],
    code: str | None,
) -> None:
    service = await start(TABULAR, mode=mode, fail_code="INVALID_DOCUMENT")
    await start(SCAN)  # a normal service for the sentinel
    body = request(original_name=name)
    await send(client, body)
    # The callback has finished with the request: it dropped it or its ack is out.
    await wait_for(lambda: service.stats.dropped + service.stats.acked == 1, 5, "handled")
    await settle(client, seen, SCAN)  # same delay, started later: anything due is out

    pairs = seen.of(body["job_id"])
    assert statuses(pairs) == expected
    if code is not None:
        assert pairs[-1][1]["error"]["code"] == code
    assert service.stats.received == 1
    assert not [f for f in files(results_dir) if body["file_id"] in f]


async def test_fail_once_fails_the_first_attempt_and_answers_a_retry(
    client: Client, seen: Seen, start: Start
) -> None:
    """`[fail-once]` in a file's name: its attempt 1 fails, its attempt 2 is done — what an
    operator's retry recovers."""
    service = await start(TABULAR, fail_code="INVALID_DOCUMENT")
    await start(SCAN)
    first = request(original_name="ОСВ [fail-once].xlsx")
    retried = {**first, "job_id": str(uuid.uuid4()), "attempt": 2}
    for body in (first, retried):
        await send(client, body)
    await wait_for(lambda: service.stats.acked == 2, 5, "both acked")
    await wait_for(lambda: len(seen.of(retried["job_id"])) == 2, 10, "the retry answered")
    await settle(client, seen, SCAN)
    assert statuses(seen.of(first["job_id"])) == ["processing", "error"]
    assert statuses(seen.of(retried["job_id"])) == ["processing", "done"]


# -- rule 8: concurrency, a callback that never raises, stop -------------------------------


async def test_slow_jobs_run_side_by_side(
    client: Client, seen: Seen, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five requests are worked on at once: when the first job's delay is over and it
    writes its result file, all five jobs are in work — jobs done one after another
    (the subscription's callback waiting for each) would have one. The files are written
    in the event loop's own thread: written through a worker thread, the service's RSS
    crept up for as long as it ran (make soak)."""
    service = await start(TABULAR, delay_seconds=1.0)
    in_work: list[int] = []
    threads: set[int] = set()
    write = service._write_files

    def counting_write(job: Any, body: dict[str, Any]) -> dict[str, Any]:
        in_work.append(len(service._tasks))
        threads.add(threading.get_ident())
        return write(job, body)

    monkeypatch.setattr(service, "_write_files", counting_write)
    bodies = [request() for _ in range(5)]
    for body in bodies:
        await send(client, body)
    for body in bodies:
        await answered(seen, body["job_id"], 2, within=30)
    assert in_work[0] == 5 and service.stats.processed == 5
    assert threads == {threading.get_ident()}
    assert statuses(seen.of(bodies[0]["job_id"])) == ["processing", "done"]
    assert seen.bodies()[0]["status"] == "processing" and seen.bodies()[4]["status"] == "processing"


async def test_a_failure_inside_the_callback_drops_that_message_only(
    client: Client,
    seen: Seen,
    start: Start,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = await start(TABULAR)

    def boom(body: dict[str, Any]) -> str | None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "_problem", boom)
    broken = request()
    await send(client, broken)
    await wait_for(lambda: service.stats.dropped == 1, 5, "dropped")
    monkeypatch.undo()
    await settle(client, seen)
    assert seen.of(broken["job_id"]) == []
    assert logged(caplog.records, action="ref_drop", reason="internal_error")


async def test_a_failure_inside_the_work_publishes_no_result(
    client: Client, seen: Seen, start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    service = await start(TABULAR, results_dir=not_a_dir)
    body = request()
    await send(client, body)
    await wait_for(lambda: bool(logged(caplog.records, reason="internal_error")), 5, "failed")
    assert statuses(seen.of(body["job_id"])) == ["processing"]
    assert service.stats.processed == 0


async def test_stop_cancels_work_in_flight(
    client: Client, seen: Seen, start: Start, results_dir: Path
) -> None:
    service = await start(TABULAR, delay_seconds=60)
    body = request()
    await send(client, body)
    await answered(seen, body["job_id"], 1)
    await asyncio.wait_for(service.stop(), 2)
    assert service.stats.processed == 0 and files(results_dir) == []


# -- configuration and run_reference -------------------------------------------------------


def test_from_env_defaults_and_values(tmp_path: Path) -> None:
    assert ReferenceConfig.from_env(SCAN, {}) == ReferenceConfig(SCAN)
    config = ReferenceConfig.from_env(
        TABULAR,
        {
            "REFERENCE_MODE": " Never_Answer ",
            "REFERENCE_DELAY_SECONDS": "0",
            "REFERENCE_FAIL_CODE": "unreadable",
            "REFERENCE_RESULTS_DIR": str(tmp_path),
            "REFERENCE_RESULTS_BUCKET": "demo",
            "REFERENCE_PENDING_MAX": "7",
        },
    )
    assert (config.mode, config.delay_seconds, config.fail_code) == (
        "never_answer",
        0,
        "UNREADABLE",
    )
    assert (config.results_dir, config.results_bucket) == (tmp_path, "demo")
    assert (config.pending_max, ReferenceConfig(TABULAR).pending_max) == (7, 5000)
    assert (config.subject, config.queue) == ("files.tabular_uploaded", "tabular-parser")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("REFERENCE_MODE", "sometimes"),
        ("REFERENCE_DELAY_SECONDS", "soon"),
        ("REFERENCE_DELAY_SECONDS", "-1"),
        ("REFERENCE_DELAY_SECONDS", "nan"),
        ("REFERENCE_DELAY_SECONDS", "inf"),
        ("REFERENCE_FAIL_CODE", "OOPS"),
        ("REFERENCE_RESULTS_BUCKET", "a bucket"),
        ("REFERENCE_PENDING_MAX", "0"),
        ("REFERENCE_PENDING_MAX", "many"),
        ("REFERENCE_PENDING_MAX", "1.5"),
    ],
)
def test_from_env_errors_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ReferenceConfig.from_env(TABULAR, {variable: value})
    assert str(caught.value).startswith(f"{variable}: ")
    assert repr(value) in str(caught.value)


def test_configs_from_env_take_services_and_subjects() -> None:
    settings = Settings(image_request_subject="x.img", result_subject="x.parsed")
    both = configs_from_env(settings, {})
    assert [(c.service, c.subject, c.result_subject) for c in both] == [
        (TABULAR, "files.tabular_uploaded", "x.parsed"),
        (SCAN, "x.img", "x.parsed"),
    ]
    assert [c.service for c in configs_from_env(settings, {"REFERENCE_SERVICES": SCAN})] == [SCAN]
    with pytest.raises(ConfigError, match=r"^REFERENCE_SERVICES: "):
        configs_from_env(settings, {"REFERENCE_SERVICES": "ocr"})
    # Commas naming nothing are a mistake, not "none": empty (or unset) is both.
    with pytest.raises(ConfigError, match=r"^REFERENCE_SERVICES: .*got ','"):
        configs_from_env(settings, {"REFERENCE_SERVICES": " , "})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("REFERENCE_MODE", "sometimes"),
        ("REFERENCE_DELAY_SECONDS", "inf"),
        ("REFERENCE_SERVICES", "ocr"),
        ("NATS_ENABLED", "maybe"),
    ],
)
def test_arm_core_reference_fails_at_start_naming_the_variable(variable: str, value: str) -> None:
    # REFERENCE_* go through the parser of Settings: exit 2, the variable named, and the
    # NATS seed (a secret) never echoed. Nothing is started, so no server is needed.
    seed = "SUAKYRHVIOREXV7EUZTBHUHL7NUMHPMAS7QMDU3GTIUWEI5LDNOXD43IZY"
    env = {"PATH": "/usr/bin:/bin", "OPENBAO__NATS__NATS_SEED": seed, variable: value}
    done = subprocess.run(
        [ARM_CORE, "reference"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2, done.stderr
    assert f"configuration error: {variable}: " in done.stderr
    assert seed not in done.stdout + done.stderr


async def test_run_reference_serves_both_pipelines_until_stopped(
    nats_server: EmbeddedNats, client: Client, seen: Seen, results_dir: Path
) -> None:
    settings = Settings(nats_urls=(nats_server.url(),))
    configs = [ReferenceConfig(s, delay_seconds=DELAY, results_dir=results_dir) for s in SUBJECTS]
    stopping = asyncio.Event()
    running = asyncio.create_task(run_reference(settings, configs, stopping))
    bodies = [request(TABULAR), request(SCAN)]

    async def done() -> bool:
        if running.done():
            running.result()  # surfaces a crash
        for body in bodies:  # republished until the subscriptions are up, as the core does
            if not seen.of(body["job_id"]):
                await send(client, body)
        return all(statuses(seen.of(b["job_id"]))[-1:] == ["done"] for b in bodies)

    await wait_for(done, 10, "both pipelines answered")
    stopping.set()
    await asyncio.wait_for(running, 5)


# -- NATS unreachable: answers wait in the service's queue, then go out once ---------------


@pytest.fixture
async def proxy(nats_server: EmbeddedNats) -> AsyncIterator[TcpProxy]:
    """The service's way to nats-server: blocked, the service cannot reach NATS while the
    test's own client (the core's seat) stays connected to the server."""
    assert nats_server.port is not None
    tcp = await TcpProxy(nats_server.port).start()
    try:
        yield tcp
    finally:
        await tcp.close()


@pytest.fixture
async def behind_proxy(proxy: TcpProxy, results_dir: Path) -> AsyncIterator[Start]:
    """Starts services connected as docs/service-teams.md tells service teams (NATS_OPTIONS),
    through `proxy`."""
    nc = await nats.connect(f"nats://127.0.0.1:{proxy.port}", **NATS_OPTIONS)
    services: list[ReferenceService] = []

    async def start_service(service: str = TABULAR, **overrides: Any) -> ReferenceService:
        options: dict[str, Any] = {"delay_seconds": DELAY, "results_dir": results_dir}
        reference = ReferenceService(nc, ReferenceConfig(service, **{**options, **overrides}))
        await reference.start()
        services.append(reference)
        return reference

    try:
        yield start_service
    finally:
        for reference in services:
            await reference.stop(grace=0)
        await nc.close()


def idle_after(service: ReferenceService, acks: int) -> Callable[[], bool]:
    """`acks` requests acked, and every answer confirmed sent."""
    return lambda: service.stats.acked == acks and service.pending == 0


def results_seen(seen: Seen) -> list[str]:
    return [m for m in seen.msg_ids() if m.startswith("result:")]


async def test_answers_made_while_nats_is_stopped_are_sent_once_in_order_after_it_is_back(
    nats_server: EmbeddedNats,
    proxy: TcpProxy,
    client: Client,
    seen: Seen,
    behind_proxy: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nats-server stops while the service has every result still to make; they wait in
    the service's queue and go out after the restart: each exactly once (by Nats-Msg-Id),
    in the order they were made. Before this queue, each was lost with an
    OutboundBufferLimitError."""
    caplog.set_level(logging.INFO, logger="arm_core.devtools.reference")
    n = 60
    service = await behind_proxy(TABULAR, delay_seconds=1.5)
    bodies = [request() for _ in range(n)]
    for body in bodies:
        await send(client, body)
    await wait_for(idle_after(service, acks=n), 10, "all acked")

    proxy.block()  # the service loses NATS at once, results 1.5 s away: all will wait
    nats_server.stop()  # and the server goes; the service stays away (proxy) until the
    # test's client is back
    await wait_for(lambda: service.stats.processed == n, 20, "every result made")
    assert service.pending == n and results_seen(seen) == []
    assert logged(caplog.records, action="ref_waiting")

    nats_server.start()  # the same port
    await wait_for(lambda: client.is_connected, 20, "the test's client reconnected")
    await client.flush()
    await client.flush()  # its subscription is back on the server
    proxy.unblock()
    await wait_for(lambda: len(results_seen(seen)) == n, 30, "every result arrived")
    await settle(client, seen)  # nothing more is on its way

    counts = Counter(seen.msg_ids())
    assert set(counts.values()) == {1}, [m for m, c in counts.items() if c > 1]
    made = [r.job_id for r in logged(caplog.records, action="ref_result")]
    arrived = [m.split(":")[1] for m in results_seen(seen)]
    assert arrived == made  # in the order they were made (the sentinel's last)
    assert {body["job_id"] for body in bodies} <= set(arrived)
    # The service counts a message sent once the server confirmed it, which may come
    # after the test's client has seen it.
    await wait_for(
        lambda: service.pending == 0 and service.stats.sent == 2 * n + 2,
        10,
        lambda: f"the service's queue emptied: {service.pending} left, {service.stats}",
    )
    assert service.stats.pending_dropped == 0
    assert logged(caplog.records, action="ref_resumed")


async def test_a_full_queue_drops_its_oldest_answer_logged_and_counted(
    proxy: TcpProxy,
    client: Client,
    seen: Seen,
    behind_proxy: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="arm_core.devtools.reference")
    service = await behind_proxy(TABULAR, delay_seconds=2.5, pending_max=3)
    for i in range(1, 6):  # one by one: the acks never fill the tiny queue
        await send(client, request())
        await wait_for(idle_after(service, acks=i), 10, "ack sent")
    proxy.block()  # NATS unreachable for the service
    await wait_for(lambda: service.stats.processed == 5, 10, "every result made")

    made = [r.job_id for r in logged(caplog.records, action="ref_result")]
    drops = logged(caplog.records, action="ref_pending_drop")
    assert [r.job_id for r in drops] == made[:2]  # the oldest two
    assert {r.levelno for r in drops} == {logging.WARNING}
    assert [r.kind for r in drops] == ["result", "result"]
    assert [r.dropped for r in drops] == [1, 2]
    assert "REFERENCE_PENDING_MAX" in drops[0].getMessage()
    assert (service.pending, service.stats.pending_dropped) == (3, 2)

    proxy.unblock()
    await wait_for(lambda: len(results_seen(seen)) == 3, 30, "the three kept results")
    await settle(client, seen)
    assert [m.split(":")[1] for m in results_seen(seen)][:3] == made[2:]
    assert set(Counter(seen.msg_ids()).values()) == {1}


async def test_stop_says_how_many_answers_were_never_sent(
    proxy: TcpProxy,
    client: Client,
    seen: Seen,
    behind_proxy: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = await behind_proxy(TABULAR, delay_seconds=1.5)
    await send(client, request())
    await wait_for(idle_after(service, acks=1), 10, "acked")
    proxy.block()
    await wait_for(lambda: service.stats.processed == 1, 10, "result made")
    await asyncio.wait_for(service.stop(grace=0.2), 5)
    [unsent] = logged(caplog.records, action="ref_unsent")
    assert unsent.count == 1 and unsent.levelno == logging.WARNING


async def test_repeated_request_while_the_result_waits_for_nats_is_acked_not_redone(
    proxy: TcpProxy, client: Client, seen: Seen, behind_proxy: Start, results_dir: Path
) -> None:
    """The core republishes a request whose ack it never saw: acked again, behind the
    waiting result, and not processed a second time."""
    service = await behind_proxy(TABULAR, delay_seconds=1.5)
    body = request()
    job = body["job_id"]
    proxy.block()
    await send(client, body)  # lost: the service is not there (core NATS keeps nothing)
    proxy.unblock()
    await wait_for(lambda: service.nc.is_connected, 20, "service reconnected")
    await service.nc.flush()
    await service.nc.flush()  # its subscription is back
    await send(client, body)
    await answered(seen, job, 1)
    proxy.block()
    await wait_for(lambda: service.stats.processed == 1, 10, "result made")
    proxy.unblock()
    await wait_for(lambda: service.nc.is_connected, 20, "service reconnected")
    await service.nc.flush()
    await service.nc.flush()
    await send(client, body)  # republished: its ack was "lost"
    await settle(client, seen)

    pairs = seen.of(job)
    assert [m for m, _ in pairs] == [f"ack:{job}:1", f"result:{job}:1", f"ack:{job}:1"]
    assert (service.stats.acked, service.stats.reacked, service.stats.processed) == (2, 1, 2)
    assert len([f for f in files(results_dir) if job in f]) == 1


def test_service_teams_page_recommends_the_reference_services_nats_options() -> None:
    """The connect options docs/service-teams.md ("For service teams") shows are the ones
    the reference service runs with."""
    page = (Path(__file__).parents[2] / "docs" / "service-teams.md").read_text("utf-8")
    section = page.split("\n## For service teams\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    [block] = [b for b in blocks if "NATS_OPTIONS = " in b]
    literal = block.split("NATS_OPTIONS = ", 1)[1].split("\n}\n", 1)[0] + "\n}"
    assert ast.literal_eval(literal) == NATS_OPTIONS
    assert "**NATS_OPTIONS" in block and 'queue="tabular-parser"' in block
