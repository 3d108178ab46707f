"""The inbox over a real nats-server (docs/behaviour.md#ack, #inbox, #retry): acks, results,
duplicates, late answers, garbage of every kind, and a database outage while envelopes
arrive.

Each envelope goes through a real nats-server into the bridge's subscription callback
(`Inbox.on_message`), and one inbox step (`Inbox.run_once`) applies what it buffered:
the tests assert on each envelope's outcome and on the database, and wait for no poll.
Only the outage runs the whole bridge, because its worker holding a batch while the
callback keeps receiving is the point."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from psycopg_pool import AsyncConnectionPool

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import envelope, send
from arm_core.devtools.testbed.sql import (
    ack,
    dict_conn,
    fail_by_timeout,
    job,
    publish,
    retry,
    scalar,
    stored_file,
    upload,
)
from arm_core.statuses import ApplyOutcome, JobStatus
from tests.support.bridge import fast_settings, logged, running_bridge
from tests.support.steps import inbox_feed, outcomes, step_pool

pytestmark = pytest.mark.integration

APPLIED, DUPLICATE, ALREADY_FINAL = (
    ApplyOutcome.APPLIED,
    ApplyOutcome.DUPLICATE,
    ApplyOutcome.ALREADY_FINAL,
)
PROCESSING, DONE, ERROR, TIMEOUT = (
    JobStatus.PROCESSING,
    JobStatus.DONE,
    JobStatus.ERROR,
    JobStatus.TIMEOUT,
)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with step_pool(db_url) as pool:
        yield pool


TABLES = ("arm.s3_object", "arm.stored_file", "arm.recognition_job", "arm.retry_audit")


def tables(db_url: str) -> dict[str, list[dict[str, Any]]]:
    with dict_conn(db_url) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES}


def published_job(db_url: str, file_type: str = "XLSX") -> Any:
    with dict_conn(db_url) as conn:
        up = upload(conn, file_type)
        publish(conn)
    return up


async def test_S_ACK_1_ack_over_nats(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """S-ACK-1: job processing, started_at, service_name tabular-parser, file PROCESSING."""
    up = published_job(db_url)
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
    step = await feed.step()

    [applied] = step.results
    assert (applied.outcome, applied.status, applied.attempt) == (APPLIED, PROCESSING, 1)
    assert applied.envelope.job_id == up.job_id and step.deferred == ()
    with dict_conn(db_url) as conn:
        row = job(conn, up.job_id)
        assert row["status"] == "processing"
        assert row["started_at"] is not None
        assert row["service_name"] == "tabular-parser"
        assert stored_file(conn, up.file_id)["status"] == "PROCESSING"


async def test_S_IN_1_to_3_results_over_nats(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """S-IN-1 (done registers the result object), S-IN-2 (the same message again changes
    nothing), S-IN-3 (error without result_s3 → job error, file ERROR)."""
    caplog.set_level(logging.INFO)
    done, failed = published_job(db_url), published_job(db_url)
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(envelope(done.job_id, done.file_id, "processing"), f"ack:{done.job_id}:1")
    result = envelope(done.job_id, done.file_id, "done", metrics={"rows": 412})
    await feed.put(result, f"result:{done.job_id}:1")
    first = await feed.step()
    assert outcomes(first) == [(APPLIED, PROCESSING), (APPLIED, DONE)]

    before = tables(db_url)
    await feed.put(result, f"result:{done.job_id}:1")  # S-IN-2: redelivery
    error = {"code": "UNSUPPORTED_FORMAT", "message": "XLSB 2.0 не поддержан"}
    await feed.put(
        envelope(failed.job_id, failed.file_id, "error", error=error), f"result:{failed.job_id}:1"
    )
    second = await feed.step()
    assert outcomes(second) == [(DUPLICATE, DONE), (APPLIED, ERROR)]
    assert feed.inbox.counts["ignored"] == 1 and feed.inbox.counts["applied"] == 3

    after = tables(db_url)
    assert after["arm.s3_object"] == before["arm.s3_object"]
    done_row = next(r for r in after["arm.recognition_job"] if r["id"] == done.job_id)
    assert done_row == next(r for r in before["arm.recognition_job"] if r["id"] == done.job_id)
    assert done_row["result_msg_id"] == f"result:{done.job_id}:1"
    assert done_row["metrics"] == {"rows": 412}
    [obj] = [o for o in after["arm.s3_object"] if o["id"] == done_row["result_s3_object_id"]]
    assert obj["key"] == f"results/{done.file_id}/{done.job_id}/result.json"
    assert obj["bucket_role"] == "results" and obj["created_by"] == "tabular-parser"
    with dict_conn(db_url) as conn:
        assert stored_file(conn, done.file_id)["status"] == "PROCESSING"
        err = job(conn, failed.job_id)
        assert (err["error_code"], err["error_message"]) == (
            "UNSUPPORTED_FORMAT",
            "XLSB 2.0 не поддержан",
        )
        assert err["result_s3_object_id"] is None
        assert stored_file(conn, failed.file_id)["status"] == "ERROR"
    assert len(logged(caplog.records, reason="duplicate", job_id=done.job_id)) == 1


async def test_S_IN_4_done_after_timeout_is_logged_not_applied(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """S-IN-4: the job is already timeout when a done arrives: unchanged, logged."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        fail_by_timeout(conn, up)
    before = tables(db_url)
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
    step = await feed.step()

    [ignored] = step.results
    assert (ignored.outcome, ignored.status, ignored.attempt) == (ALREADY_FINAL, TIMEOUT, 1)
    assert feed.inbox.counts["ignored"] == 1 and feed.inbox.counts["applied"] == 0
    assert tables(db_url) == before
    assert len(logged(caplog.records, reason="already_final", job_id=up.job_id, attempt=1)) == 1


async def test_S_RT_2_late_answers_of_attempt_1_after_the_retry(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """S-RT-2: after attempt 2 exists, an ack and a done for attempt 1 (timeout) leave the
    current job and the file unchanged; both are logged and ignored."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        fail_by_timeout(conn, up)
        new_id = retry(conn, up.file_id)["job_id"]
        publish(conn)
        ack(conn, new_id, up.file_id)
    before = tables(db_url)
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
    await feed.put(envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
    step = await feed.step()

    assert outcomes(step) == [(ALREADY_FINAL, TIMEOUT)] * 2
    assert [r.attempt for r in step.results] == [1, 1]
    assert feed.inbox.counts["ignored"] == 2 and feed.inbox.counts["applied"] == 0
    assert tables(db_url) == before
    ignored = logged(caplog.records, reason="already_final", job_id=up.job_id)
    assert sorted(r.action for r in ignored) == ["ack", "result"]


async def test_an_ack_without_nats_msg_id_is_taken_and_a_result_without_it_is_not(
    db_url: str,
    client: Client,
    pool: AsyncConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The contract sets no header precondition on an ack: one without Nats-Msg-Id moves
    its job to processing, named ack:<job_id>, logged once for the service's team. A
    result needs its id — how a repeated result is told from another — so one without
    it is dropped, saying so (the contract rule, docs/contracts)."""
    caplog.set_level(logging.INFO)
    up = published_job(db_url)
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(envelope(up.job_id, up.file_id, "processing"), None)
    [applied] = (await feed.step()).results
    assert (applied.outcome, applied.status) == (APPLIED, PROCESSING)
    assert applied.envelope.msg_id == f"ack:{up.job_id}"
    assert feed.inbox.counts["ack_without_msg_id"] == 1
    [said] = logged(caplog.records, action="inbox_ack_without_msg_id", job_id=up.job_id)
    assert said.levelno == logging.INFO and said.msg_id == f"ack:{up.job_id}"

    await feed.send(envelope(up.job_id, up.file_id, "done"), None)
    assert await feed.deliver() == 1
    assert feed.inbox.counts["rejected"] == 1 and feed.inbox.buffered() == 0
    [drop] = logged(caplog.records, action="inbox_drop", reason="missing_msg_id")
    assert drop.job_id == str(up.job_id)
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "processing"


async def test_an_answer_for_an_unknown_job_is_logged_with_its_ids(
    db_url: str,
    client: Client,
    pool: AsyncConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A valid answer whose job_id no job has: nothing changes, and a WARNING names the
    job and the message, so the service that sent it can be found."""
    caplog.set_level(logging.INFO)
    before = tables(db_url)
    feed = await inbox_feed(client, db_url, pool)
    stranger, its_file = uuid.uuid4(), uuid.uuid4()
    await feed.put(envelope(stranger, its_file, "done"), f"result:{stranger}:1")
    [answer] = (await feed.step()).results
    assert answer.outcome is ApplyOutcome.UNKNOWN_JOB
    assert tables(db_url) == before
    [said] = logged(caplog.records, action="result", reason="unknown_job")
    assert said.levelno == logging.WARNING
    assert (str(said.job_id), said.msg_id) == (str(stranger), f"result:{stranger}:1")


@pytest.mark.parametrize(
    "over",
    ["error.message", "service.name", "service.version", "metrics"],
)
async def test_an_error_answer_over_a_cap_ends_its_job_error_with_the_services_code(
    db_url: str,
    client: Client,
    pool: AsyncConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
    over: str,
) -> None:
    """No answer is lost to a size cap the seeds do not have (docs/contracts, Caps): an
    error answer with text or metrics over the core's caps is stored cut, with the
    original length, and the job ends `error` with the service's own code — not
    `timeout` 10–30 minutes later."""
    caplog.set_level(logging.INFO)
    up = published_job(db_url)
    answer = envelope(up.job_id, up.file_id, "error")
    answer["error"] = {"code": "UNREADABLE", "message": "не читается"}
    if over == "error.message":
        answer["error"]["message"] = "Строка не распознана. " * 600  # 13,200 characters
    elif over == "service.name":
        answer["service"]["name"] = "tabular-parser-" + "x" * 500
    elif over == "service.version":
        answer["service"]["version"] = "1." * 200
    else:
        answer["metrics"] = {f"m{i}": i for i in range(150)}
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(answer, f"result:{up.job_id}:1")
    [applied] = (await feed.step()).results
    assert (applied.outcome, applied.status) == (APPLIED, ERROR)
    with dict_conn(db_url) as conn:
        row = job(conn, up.job_id)
    assert (row["status"], row["error_code"]) == ("error", "UNREADABLE")
    if over == "error.message":
        assert len(row["error_message"]) == 4000
        assert row["error_message"].endswith(" …[truncated: 13200 characters]")
        assert row["error_message"].startswith("Строка не распознана. ")
    elif over == "service.name":
        assert len(row["service_name"]) == 200 and row["service_name"].startswith(
            "tabular-parser-x"
        )
        assert row["service_name"].endswith("[truncated: 515 characters]")
    elif over == "service.version":
        assert len(row["service_version"]) == 100 and "truncated: 400" in row["service_version"]
    else:
        assert len(row["metrics"]) == 100 and row["metrics"]["_truncated_keys"] == 51
        assert row["metrics"]["m0"] == 0 and "m149" not in row["metrics"]
    [said] = logged(caplog.records, action="inbox_truncate", job_id=up.job_id)
    assert said.levelno == logging.WARNING and over.replace(".", "/") in said.getMessage()


async def test_a_done_answer_with_a_long_result_schema_version_is_applied(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    up = published_job(db_url)
    answer = envelope(up.job_id, up.file_id, "done")
    answer["result_schema_version"] = "2026.12-" + "r" * 80
    feed = await inbox_feed(client, db_url, pool)
    await feed.put(answer, f"result:{up.job_id}:1")
    [applied] = (await feed.step()).results
    assert (applied.outcome, applied.status) == (APPLIED, DONE)
    with dict_conn(db_url) as conn:
        version = job(conn, up.job_id)["result_schema_version"]
    assert len(version) == 50 and version.endswith("[truncated: 88 characters]")


GARBAGE: list[tuple[str, bytes | dict[str, Any], str | None]] = [
    ("not_json", b"\xff\xfe not json", "m1"),
    ("not_json", b'{"job_id": ', "m2"),
    ("not_object", b"[1, 2, 3]", "m3"),
    ("not_object", b'"done"', "m4"),
    ("not_object", b"null", "m5"),
    ("schema", {"job_id": "not-a-uuid", "status": "done"}, "m6"),
    ("schema", {"schema_version": "1.0"}, "m7"),
    ("too_large", b'{"pad": "' + b"x" * 900_000 + b'"}', "m8"),
]


def garbage_for(up: Any) -> list[tuple[str, bytes | dict[str, Any], str | None]]:
    good = envelope(up.job_id, up.file_id, "done")
    return [
        *GARBAGE,
        ("missing_msg_id", good, None),
        ("schema", {**good, "status": "finished"}, "g1"),  # unknown status
        ("schema", {**good, "job_id": 42}, "g2"),  # wrong type
        ("schema", {**good, "service": "tabular-parser"}, "g3"),
        ("schema", {k: v for k, v in good.items() if k != "result_s3"}, "g4"),
        ("schema", {**good, "status": "error"}, "g6"),  # error without error{}
        ("schema_version_unsupported", {**good, "schema_version": "2.0"}, "g7"),
        ("schema", {**good, "schema_version": "1.x"}, "g5"),
        ("schema", {**good, "metrics": "fast"}, "g8"),
    ]


async def test_garbage_is_logged_and_dropped_and_the_next_good_message_applies(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input never crashes the bridge: the subscription callback takes each kind
    without raising, logs it with its reason and drops it before the buffer, so the
    inbox step after the flood has nothing to apply and nothing in the database changes;
    a good message afterwards applies."""
    caplog.set_level(logging.WARNING)
    up = published_job(db_url)
    before = tables(db_url)
    feed = await inbox_feed(client, db_url, pool, inbox_max_payload_bytes=512 * 1024)
    cases = garbage_for(up)
    for _ in range(20):  # a flood, not a trickle
        for _, body, msg_id in cases:
            await feed.send(body, msg_id)
    assert await feed.deliver() == 20 * len(cases)  # the callback raised on none of them
    counted = feed.inbox.counts
    assert (counted["received"], counted["rejected"]) == (20 * len(cases), 20 * len(cases))
    assert feed.inbox.buffered() == 0
    flood = await feed.step()
    assert flood.results == () and counted["batches"] == 0  # nothing reached the database
    assert tables(db_url) == before

    drops = logged(caplog.records, action="inbox_drop")
    assert len(drops) == 20 * len(cases)
    for reason, _, msg_id in cases:  # each message is rejected for its own reason
        assert [r.reason for r in drops if r.msg_id == msg_id] == [reason] * 20, msg_id
    [schema_drop, *_] = logged(drops, msg_id="g2")
    assert "job_id" in schema_drop.getMessage()

    await feed.put(envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
    good = await feed.step()
    assert outcomes(good) == [(APPLIED, DONE)]
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "done"


async def test_a_later_minor_applies_with_its_new_fields_ignored(
    db_url: str, client: Client, pool: AsyncConnectionPool[Any]
) -> None:
    """The contract's version rule: every MINOR of MAJOR 1 is read, the fields this core
    does not know ignored (not stored); another MAJOR is refused (the garbage test)."""
    up = published_job(db_url)
    feed = await inbox_feed(client, db_url, pool)
    later = {
        **envelope(up.job_id, up.file_id, "done"),
        "schema_version": "1.7",
        "confidence": 0.93,
        "group_schema": {"a": 1},
        "service": {"name": "tabular-parser", "version": "3.1", "host": "p-1"},
    }
    await feed.put(later, f"result:{up.job_id}:1")
    assert outcomes(await feed.step()) == [(APPLIED, DONE)]
    with dict_conn(db_url) as conn:
        row = job(conn, up.job_id)
    assert row["status"] == "done"
    assert "confidence" not in str(row) and "p-1" not in str(row)


async def test_envelopes_are_held_while_the_database_is_unreachable(
    db_url: str, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats, client: Client
) -> None:
    """The database drops out (every connection cut, new ones refused) while acks and
    results arrive: they are held and applied in order once it is back; none is lost."""
    ups = [published_job(db_url) for _ in range(5)]
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied_url = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    try:
        settings = fast_settings(proxied_url, nats_server.url())
        async with running_bridge(settings) as bridge:
            proxy.block()
            for up in ups:
                await send(
                    client, envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1"
                )
                await send(client, envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
            await wait_for(lambda: bridge.inbox.counts["db_retries"] >= 2, 60, "inbox held")
            with dict_conn(db_url) as conn:  # direct, not through the proxy
                assert (
                    scalar(
                        conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'published'"
                    )
                    == 5
                )
            proxy.unblock()
            with dict_conn(db_url) as conn:
                await wait_for(
                    lambda: (
                        scalar(
                            conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"
                        )
                        == 5
                    ),
                    30,
                    "all applied after the outage",
                )
                for up in ups:  # the ack was applied before the result: started_at is set
                    assert job(conn, up.job_id)["started_at"] is not None
            assert bridge.inbox.dropped() == 0
    finally:
        await proxy.close()
