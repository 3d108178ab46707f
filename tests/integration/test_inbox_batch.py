"""arm.apply_envelopes: a batch of acks and results applied in one transaction,
in order, with the outcomes of its elements applied one by one (which
test_inbox_batch_equivalence.py proves on random batches); all or nothing when an element
raises; jobs locked in id order so concurrent bridges never deadlock."""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from arm_core.devtools.testbed.sql import (
    Conn,
    Upload,
    ack,
    apply_envelopes,
    dict_conn,
    fail_by_timeout,
    job,
    publish,
    publish_open,
    result,
    scalar,
    stored_file,
    upload,
)

pytestmark = pytest.mark.integration

Envelope = dict[str, Any]


def ack_env(up: Upload, service: str = "tabular-parser", version: str = "1.4.2") -> Envelope:
    """An ack as the bridge passes it: unused keys absent."""
    return {
        "job_id": str(up.job_id),
        "file_id": str(up.file_id),
        "msg_id": f"ack:{up.job_id}:1",
        "status": "processing",
        "service_name": service,
        "service_version": version,
    }


def result_env(
    up: Upload,
    status: str = "done",
    msg_id: str | None = None,
    error: tuple[str, str] | None = None,
    metrics: dict[str, Any] | None = None,
    key: str | None = None,
) -> Envelope:
    """A result with every key present, unused ones null."""
    success = status in ("done", "needs_check")
    return {
        "job_id": str(up.job_id),
        "file_id": str(up.file_id),
        "msg_id": msg_id or f"result:{up.job_id}:1",
        "status": status,
        "service_name": "tabular-parser",
        "service_version": "1.4.2",
        "result_bucket": "arm-ka" if success else None,
        "result_key": (key or f"results/{up.file_id}/{up.job_id}/result.json") if success else None,
        "result_schema_version": "1.0" if success else None,
        "error_code": error[0] if error else None,
        "error_message": error[1] if error else None,
        "metrics": metrics,
    }


def outcomes(rows: list[dict[str, Any]]) -> list[str]:
    assert [r["ord"] for r in rows] == list(range(1, len(rows) + 1))
    return [r["outcome"] for r in rows]


def result_objects(conn: Conn) -> int:
    return int(scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"))


def test_a_mixed_batch_gets_every_outcome_and_applies_the_valid_envelopes(conn: Conn) -> None:
    final = upload(conn)
    fail_by_timeout(conn, final)  # timeout
    acked, done, errored, checked = (upload(conn) for _ in range(4))
    publish(conn)
    queued = upload(conn)  # never published
    stranger = Upload(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "nowhere")
    misfiled = Upload(done.file_id, acked.job_id, acked.s3_object_id, acked.key)

    rows = apply_envelopes(
        conn,
        [
            ack_env(acked, version="2.1.0"),
            ack_env(acked),  # the same ack again
            result_env(done, metrics={"rows": 412}),
            result_env(done, metrics={"rows": 412}),  # the same result again
            ack_env(stranger),
            ack_env(misfiled),
            result_env(misfiled),
            result_env(final),
            ack_env(queued),
            result_env(queued),
            result_env(errored, "error", error=("UNSUPPORTED_FORMAT", "XLSB 2003 не читается")),
            result_env(checked, "needs_check"),
        ],
    )
    assert outcomes(rows) == [
        "applied",
        "duplicate",
        "applied",
        "duplicate",
        "unknown_job",
        "file_mismatch",
        "file_mismatch",
        "already_final",
        "not_published",
        "not_published",
        "applied",
        "applied",
    ]
    assert [(r["attempt"], r["status"]) for r in rows] == [
        (1, "processing"),
        (1, "processing"),
        (1, "done"),
        (1, "done"),
        (None, None),
        (1, "processing"),
        (1, "processing"),
        (1, "timeout"),
        (1, "queued"),
        (1, "queued"),
        (1, "error"),
        (1, "needs_check"),
    ]

    row = job(conn, acked.job_id)
    assert (row["status"], row["service_name"], row["service_version"]) == (
        "processing",
        "tabular-parser",
        "2.1.0",  # the first ack's, the duplicate changed nothing
    )
    assert row["started_at"] is not None
    assert stored_file(conn, acked.file_id)["status"] == "PROCESSING"

    row = job(conn, done.job_id)
    assert (row["status"], row["result_msg_id"], row["metrics"]) == (
        "done",
        f"result:{done.job_id}:1",
        {"rows": 412},
    )
    obj = conn.execute(
        "SELECT * FROM arm.s3_object WHERE id = %s", (row["result_s3_object_id"],)
    ).fetchone()
    assert obj is not None
    assert (obj["bucket"], obj["key"], obj["bucket_role"], obj["created_by"]) == (
        "arm-ka",
        f"results/{done.file_id}/{done.job_id}/result.json",
        "results",
        "tabular-parser",
    )

    row = job(conn, errored.job_id)
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "error",
        "UNSUPPORTED_FORMAT",
        "XLSB 2003 не читается",
    )
    assert row["result_s3_object_id"] is None and row["metrics"] is None
    assert stored_file(conn, errored.file_id)["status"] == "ERROR"

    assert job(conn, checked.job_id)["status"] == "needs_check"
    assert stored_file(conn, checked.file_id)["status"] == "PROCESSING"
    assert job(conn, queued.job_id)["status"] == "queued"
    assert job(conn, final.job_id)["status"] == "timeout"
    assert result_objects(conn) == 2  # done and needs_check, each once


def test_order_inside_a_batch_counts(conn: Conn) -> None:
    ack_first, result_first = upload(conn), upload(conn)
    publish(conn)
    rows = apply_envelopes(
        conn,
        [
            ack_env(ack_first),
            result_env(ack_first),
            result_env(result_first),
            ack_env(result_first),
        ],
    )
    assert outcomes(rows) == ["applied", "applied", "applied", "already_final"]
    row = job(conn, ack_first.job_id)
    assert row["status"] == "done" and row["started_at"] is not None
    row = job(conn, result_first.job_id)
    assert row["status"] == "done" and row["started_at"] is None  # its ack came too late
    assert stored_file(conn, result_first.file_id)["status"] == "PROCESSING"


def test_a_second_result_with_another_msg_id_is_already_final(conn: Conn) -> None:
    up = upload(conn)
    publish(conn)
    rows = apply_envelopes(
        conn,
        [
            result_env(up, "error", error=("UNREADABLE", "?")),
            result_env(up, "done", msg_id="another"),
        ],
    )
    assert outcomes(rows) == ["applied", "already_final"]
    assert job(conn, up.job_id)["status"] == "error"
    assert result_objects(conn) == 0


def test_an_empty_batch_applies_nothing(conn: Conn) -> None:
    assert apply_envelopes(conn, []) == []


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        # a done result without its result file
        (
            {"result_key": None},
            psycopg.errors.InvalidParameterValue,
            "needs result_s3 and result_schema_version",
        ),
        ({"msg_id": None}, psycopg.errors.InvalidParameterValue, "Nats-Msg-Id"),
        ({"status": "queued"}, psycopg.errors.InvalidParameterValue, r"element \d has status"),
        ({"status": None}, psycopg.errors.InvalidParameterValue, r"element \d has status"),
        ({"job_id": "not-a-uuid"}, psycopg.errors.InvalidTextRepresentation, "uuid"),
        # a constraint of the tables: a result key over the contract's 1024 characters
        ({"result_key": "k" * 1025}, psycopg.errors.CheckViolation, "s3_object_key_length"),
    ],
)
def test_an_element_that_raises_fails_the_whole_batch(
    conn: Conn, bad: Envelope, error: type[Exception], match: str
) -> None:
    """The contract: no exception block per element, so nothing of the batch is applied;
    the caller then applies the batch one element per call to isolate the bad one."""
    good, other = upload(conn), upload(conn)
    publish(conn)
    batch = [ack_env(good), {**result_env(other), **bad}, result_env(good)]
    with pytest.raises(error, match=match):
        apply_envelopes(conn, batch)
    assert job(conn, good.job_id)["status"] == "published"
    assert job(conn, other.job_id)["status"] == "published"
    assert result_objects(conn) == 0

    # One element per call: the good ones get their outcomes, the bad one its error.
    assert outcomes(apply_envelopes(conn, [batch[0]])) == ["applied"]
    with pytest.raises(error, match=match):
        apply_envelopes(conn, [batch[1]])
    assert outcomes(apply_envelopes(conn, [batch[2]])) == ["applied"]
    assert job(conn, good.job_id)["status"] == "done"
    assert job(conn, other.job_id)["status"] == "published"


@pytest.mark.parametrize("not_an_array", [{}, "x", None])
def test_the_batch_must_be_an_array(conn: Conn, not_an_array: Any) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="JSON array"):
        conn.execute(
            "SELECT * FROM arm.apply_envelopes_v2(%s)",
            (Jsonb(not_an_array) if not_an_array is not None else None,),
        )


def test_an_early_ack_in_a_batch_is_busy_until_the_publishers_commit(db_url: str) -> None:
    """The service may ack before the publisher's transaction commits. The batch does not
    wait for that commit (it would stall every other envelope behind one NATS round
    trip): the early ack comes back `busy`, nothing of it is applied, the rest of the
    batch is; applied again after the commit, it is `applied` — never lost."""
    with dict_conn(db_url) as conn:
        earlier = upload(conn)
        publish(conn)
        racing = upload(conn)
    with dict_conn(db_url) as publisher, dict_conn(db_url) as inbox:
        publisher.autocommit = False
        claimed = publish_open(publisher)
        assert [c["job_id"] for c in claimed] == [racing.job_id]
        early = [ack_env(racing), result_env(racing)]
        assert outcomes(apply_envelopes(inbox, [ack_env(earlier), *early])) == [
            "applied",
            "busy",
            "busy",
        ]
        assert job(inbox, racing.job_id)["status"] == "queued"  # as committed: untouched
        publisher.commit()
        assert outcomes(apply_envelopes(inbox, early)) == ["applied", "applied"]
    with dict_conn(db_url) as conn:
        assert job(conn, racing.job_id)["status"] == "done"
        assert job(conn, racing.job_id)["started_at"] is not None  # the ack came first
        assert job(conn, earlier.job_id)["status"] == "processing"


def test_concurrent_overlapping_batches_in_opposite_orders_never_deadlock(db_url: str) -> None:
    """Two bridges apply overlapping batches at the same moment, one in job order, the
    other in reverse. Locking jobs one by one they would lock the shared jobs from
    opposite ends and deadlock; apply_envelopes takes its locks up front with SKIP
    LOCKED, so neither waits: what the other holds comes back `busy` and is applied by
    the next call, as the inbox does. Every envelope is applied exactly once."""
    rounds, n = 15, 30
    barrier = threading.Barrier(2)

    def run(conn: Conn, batch: list[Envelope]) -> list[dict[str, Any]]:
        with conn.transaction():
            barrier.wait(timeout=10)
            return apply_envelopes(conn, batch)

    with dict_conn(db_url) as setup, dict_conn(db_url) as a, dict_conn(db_url) as b:
        for conn in (a, b):  # a deadlock, should one happen, is reported quickly
            conn.execute("SET deadlock_timeout = '50ms'")
        for _ in range(rounds):
            ups = [upload(setup) for _ in range(n)]
            publish(setup)
            first, second = ups[: 2 * n // 3], ups[n // 3 :][::-1]
            batches = [
                [ack_env(u) for u in first] + [result_env(u) for u in first],
                [ack_env(u) for u in second] + [result_env(u) for u in second],
            ]

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                done = list(pool.map(run, (a, b), batches))

            applied: dict[tuple[str, str], int] = {}
            for conn, batch, rows in zip((a, b), batches, done, strict=True):
                while True:  # what was busy goes again, as the inbox's next batch
                    assert len(rows) == len(batch)
                    busy = []
                    for env, row in zip(batch, rows, strict=True):
                        assert row["outcome"] in (
                            "applied",
                            "duplicate",
                            "already_final",
                            "busy",
                        ), row
                        key = (env["job_id"], env["status"])
                        applied[key] = applied.get(key, 0) + (row["outcome"] == "applied")
                        if row["outcome"] == "busy":
                            busy.append(env)
                    if not busy:
                        break
                    batch, rows = busy, apply_envelopes(conn, busy)
            assert set(applied.values()) == {1}, "each result applied exactly once"
            assert {job(setup, u.job_id)["status"] for u in ups} == {"done"}
        assert result_objects(setup) == rounds * n


# --- the file follows only its current job (every path that moves a file) ------------


def orphaned(conn: Conn, n: int) -> list[Upload]:
    """Published jobs that are not their file's current job any more (a DBA pointed the
    file elsewhere): their answers move the jobs, never the files."""
    ups = [upload(conn) for _ in range(n)]
    publish(conn)
    for up in ups:
        conn.execute(
            "UPDATE arm.stored_file SET current_recognition_job_id = NULL WHERE id = %s",
            (up.file_id,),
        )
    return ups


def test_the_batch_moves_a_file_only_through_its_current_job(conn: Conn) -> None:
    acked, errored, done = orphaned(conn, 3)
    rows = apply_envelopes(
        conn,
        [
            ack_env(acked),
            result_env(errored, "error", error=("UNSUPPORTED_FORMAT", "x")),
            result_env(done),
        ],
    )
    assert outcomes(rows) == ["applied"] * 3
    assert [job(conn, u.job_id)["status"] for u in (acked, errored, done)] == [
        "processing",
        "error",
        "done",
    ]
    # The files stayed as they were: none went PROCESSING or ERROR.
    assert [stored_file(conn, u.file_id)["status"] for u in (acked, errored, done)] == [
        "UPLOADED"
    ] * 3


def test_the_single_functions_move_a_file_only_through_its_current_job(conn: Conn) -> None:
    acked, errored = orphaned(conn, 2)
    assert ack(conn, acked.job_id, acked.file_id)["outcome"] == "applied"
    ack(conn, errored.job_id, errored.file_id)
    failed = result(
        conn, errored.job_id, errored.file_id, status="error", error=("UNSUPPORTED_FORMAT", "x")
    )
    assert failed["outcome"] == "applied"
    assert job(conn, acked.job_id)["status"] == "processing"
    assert job(conn, errored.job_id)["status"] == "error"
    assert stored_file(conn, acked.file_id)["status"] == "UPLOADED"
    assert stored_file(conn, errored.file_id)["status"] == "UPLOADED"
