"""The typed store (src/arm_core/store.py): one method per runtime operation, each named
query sent by exactly one of them, and every method called by the runtime or the admin
code (a query only tests used would be dead weight: tests send plain SQL,
src/arm_core/devtools/testbed/sql.py); each row class is the columns a real database returns; every
method runs against a real database and returns its rows typed; the publisher's
operations commit only when their send callback returned; the outcome enums are the
texts db/functions returns; and nothing else in the runtime sends a named query."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import inspect
import json
import re
import typing
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

import arm_core.store as store_module
from arm_core.bridge.envelope import Envelope, parse_envelope
from arm_core.db import queries
from arm_core.devtools.testbed.services import envelope
from arm_core.devtools.testbed.sql import (
    DEAD_LETTER_UNPUBLISHABLE,
    Conn,
    dict_conn,
    job,
    publish,
    scalar,
    stored_file,
    upload,
)
from arm_core.rows import (
    AppliedEnvelope,
    BridgeInstance,
    FileListFilter,
    MovedJob,
    PacedJob,
    PublishedJob,
    RetryResult,
    SeriesPoint,
    TaskRun,
    UnackedJob,
    typed_row,
)
from arm_core.statuses import (
    ApplyOutcome,
    JobStatus,
    PublishOutcome,
    RetryOutcome,
    RetryReason,
)
from arm_core.store import Pacing, Store, SyncStore, file_list_params, publish_params

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "db" / "functions"


def store_methods(cls: type[Any]) -> dict[str, Any]:
    """The public methods of a store class."""
    return {
        name: member
        for name, member in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }


def queries_sent(method: Any) -> set[str]:
    """The named queries a store method's source names (as string constants)."""
    tree = ast.parse(inspect.getsource(method).strip().replace("\n    ", "\n"))
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    return {n for n in names if isinstance(n, str)} & set(queries())


def test_each_named_query_is_sent_by_exactly_one_store_method() -> None:
    methods = store_methods(Store)
    sent = {name: queries_sent(m) | ({name} & set(queries())) for name, m in methods.items()}
    assert all(sent.values()), {name for name, q in sent.items() if not q}
    every = [q for qs in sent.values() for q in qs]
    assert sorted(every) == sorted(queries())  # each once, none missing
    for name in methods:
        assert inspect.iscoroutinefunction(getattr(Store, name)), name
    # SyncStore: the synchronous twins of some of them, with the same parameters.
    for name, method in store_methods(SyncStore).items():
        assert name in queries(), name
        async_params = inspect.signature(getattr(Store, name)).parameters
        assert inspect.signature(method).parameters == async_params, name


def test_a_query_is_named_for_what_it_does_not_for_a_function_version() -> None:
    """A new version of a function (db/README.md) changes what its query calls, not the
    query's name, nor the code that sends it."""
    versioned = [name for name in queries() if re.search(r"_v\d+$", name)]
    assert not versioned, versioned


def called_methods(paths: list[Path]) -> set[str]:
    """The names of every method called (`x.name(…)`) in the given sources."""
    called = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                called.add(node.func.attr)
    return called


def test_every_named_query_is_called_by_the_runtime_or_the_admin_code() -> None:
    """A query only tests send is not kept for them: they send plain SQL
    (src/arm_core/devtools/testbed/sql.py). The runtime's and the development tools'
    modules count; the store itself and the testbed (the tests' and the benchmarks') do
    not."""
    testbed = ROOT / "src" / "arm_core" / "devtools" / "testbed"
    sources = [p for d in ("src/arm_core", "bridge", "http") for p in (ROOT / d).rglob("*.py")]
    called = called_methods(
        [p for p in sources if p.name != "store.py" and not p.is_relative_to(testbed)]
    )
    for cls in (Store, SyncStore):
        unused = sorted(set(store_methods(cls)) - called)
        assert not unused, f"{cls.__name__} methods no runtime or admin code calls: {unused}"


def row_class(method: Any) -> type[Any] | None:
    """The dataclass a store method returns rows of (alone or in a list), or None for a
    scalar or nothing."""
    returned = typing.get_type_hints(method)["return"]
    if typing.get_origin(returned) is list:
        [returned] = typing.get_args(returned)
    return returned if isinstance(returned, type) and dataclasses.is_dataclass(returned) else None


# The publish statement's parameters (also store.publish_queued_jobs' besides `send`).
PUBLISH: dict[str, Any] = {
    "limit": 10,
    "tabular_timeout": 600,
    "image_timeout": 1800,
    "tabular_subject": "files.tabular_uploaded",
    "image_subject": "files.img_uploaded",
    "max_bytes": 1 << 20,
}

# The paced claim's settings besides (store.publish_queued_jobs' `pacing`).
PACED = Pacing(
    pacing="fixed",
    tabular_min=1,
    tabular_max=5,
    image_min=1,
    image_max=5,
    ack_timeout=30,
    max_republish=3,
)

# Harmless parameters for every query: on a fresh database they change nothing that
# matters, and they are enough for PostgreSQL to say which columns come back.
SAMPLE_PARAMS: dict[str, dict[str, Any]] = {
    "dead_letter_unacked": {"ack_timeout": 3600, "max_republish": 3},
    "claim_unacked_jobs": {"limit": 10, "ack_timeout": 3600, "max_republish": 3},
    "outbox_ready_age": {},
    "answers": {},
    "mark_republished": {"job_ids": []},
    "run_due_tasks": {},
    "dead_letter_unrepublishable": {"job_ids": [], "error_codes": [], "error_messages": []},
    "record_waits": {"phase": "queued", "counts": [0] * 17},
    "status_series": {"minutes": 60},
    "set_sweep_interval": {"seconds": 30},
    "set_setting": {"name": "default_max_attempts", "value": "3"},
    "retry_file": {
        "file_id": uuid.uuid4(),
        "actor": "test",
        "expected_job_id": None,
        "actor_level": "operator",
    },
    "retry_files": {
        "file_ids": [uuid.uuid4()],
        "actor": "test",
        "expected_job_ids": None,
        "actor_level": "operator",
    },
    "get_file": {"file_id": uuid.uuid4()},
    "list_files": file_list_params(10, FileListFilter()),
    "publish_queued_jobs": PUBLISH,
    "publish_paced_jobs": publish_params(**PUBLISH, pacing=PACED),
    "pace_view": {},
    "pace_unheard": {"pipeline": "tabular", "retry_seconds": 1.0},
    "apply_envelopes": {"envelopes": Jsonb([])},
    "compact_counts": {},
    "status_view": {"ack_timeout": 30},
    "record_bridge": {
        "name": "arm-core@test:1",
        "version": "1.0.0",
        "started_at": dt.datetime.now(dt.UTC),
        "nats": "ok",
        "listener": "ok",
        "loops": Jsonb({}),
        "held": 0,
    },
    "forget_bridge": {"name": "arm-core@test:1"},
    "bridge_instances": {},
}


# The rows of the queries a method of another name sends.
QUERY_ROWS: dict[str, type[Any] | None] = {
    "claim_unacked_jobs": UnackedJob,
    "mark_republished": None,
    "dead_letter_unrepublishable": MovedJob,
    "publish_paced_jobs": PacedJob,
    "pace_unheard": None,
}


def test_each_row_class_is_the_columns_the_database_returns(conn: Conn) -> None:
    assert sorted(SAMPLE_PARAMS) == sorted(queries())
    for name, sql in queries().items():
        params = SAMPLE_PARAMS[name]
        assert set(re.findall(r"%\((\w+)\)s", sql)) == set(params), name
        with conn.transaction(force_rollback=True):
            cur = conn.execute(sql, params)
            assert cur.description is not None, name
            columns = [c.name for c in cur.description]
        cls = QUERY_ROWS[name] if name in QUERY_ROWS else row_class(getattr(Store, name))
        if cls is None:  # a scalar (or a function returning void): one column
            assert len(columns) == 1, (name, columns)
        else:
            assert columns == [f.name for f in dataclasses.fields(cls)], name


def test_a_row_class_that_is_not_the_query_s_columns_is_refused(conn: Conn) -> None:
    with conn.cursor(row_factory=typed_row(TaskRun)) as cur:
        with pytest.raises(TypeError, match=r"TaskRun has the fields .*the query returns"):
            cur.execute("SELECT 'sweep' AS task, NULL::text AS error")
        cur.execute("SELECT 'sweep' AS task, '1' AS result, NULL::text AS error")
        assert cur.fetchall() == [TaskRun("sweep", "1", None)]


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    async with AsyncConnectionPool(
        db_url, open=False, min_size=1, max_size=2, kwargs={"autocommit": True}
    ) as pool:
        yield Store(pool)


def answer(body: dict[str, Any], msg_id: str) -> Envelope:
    parsed = parse_envelope(json.dumps(body).encode(), {"Nats-Msg-Id": msg_id}, 1 << 20)
    assert isinstance(parsed, Envelope), parsed
    return parsed


async def test_every_store_method_runs_against_a_real_database_and_types_its_rows(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One short life of three files through every method, each query recorded as it
    goes out."""
    sent: list[str] = []
    original = store_module.query

    def recording(name: str) -> str:
        sent.append(name)
        return original(name)

    monkeypatch.setattr(store_module, "query", recording)
    with dict_conn(db_url) as conn:
        a, b, c = upload(conn), upload(conn, "PDF"), upload(conn)

    # The publisher's one statement: claimed and marked published, each with its wait;
    # the jobs handed to `send` before the commit. First a send that fails: nothing
    # changed.
    async def failing(jobs: list[PublishedJob]) -> None:
        raise ConnectionError("NATS did not confirm")

    with pytest.raises(ConnectionError):
        await store.publish_queued_jobs(**PUBLISH, send=failing)
    with dict_conn(db_url) as conn:
        assert {job(conn, u.job_id)["status"] for u in (a, b, c)} == {"queued"}
    handed: list[PublishedJob] = []

    async def send(jobs: list[PublishedJob]) -> None:
        with dict_conn(db_url) as conn:  # not committed yet: another session sees queued
            assert {job(conn, j.job_id)["status"] for j in jobs} == {"queued"}
        handed.extend(jobs)

    published = await store.publish_queued_jobs(**PUBLISH, send=send)
    assert handed == published
    assert [(p.job_id, p.outcome, p.subject) for p in published] == [
        (a.job_id, PublishOutcome.PUBLISHED, "files.tabular_uploaded"),
        (b.job_id, PublishOutcome.PUBLISHED, "files.img_uploaded"),
        (c.job_id, PublishOutcome.PUBLISHED, "files.tabular_uploaded"),
    ]
    assert all(p.request and p.error_message is None for p in published)
    assert published[0].msg_id == f"{a.job_id}:1"
    assert json.loads(published[0].request or "")["job_id"] == str(a.job_id)  # JSON text
    with dict_conn(db_url) as conn:
        row = job(conn, a.job_id)
    waited = (row["published_at"] - row["requested_at"]).total_seconds()
    assert published[0].queued_seconds == pytest.approx(waited, abs=1e-6)

    # a: an ack, then its result with a late copy of the ack, each batch on its own.
    ack_a = answer(envelope(a.job_id, a.file_id, "processing"), f"ack:{a.job_id}:1")
    done_a = answer(envelope(a.job_id, a.file_id, "done", metrics={"rows": 3}), "result:a")
    [acked] = await store.apply_envelopes([ack_a])
    assert acked.wait_seconds is not None and acked.wait_seconds >= 0
    assert acked == AppliedEnvelope(
        1, ApplyOutcome.APPLIED, 1, JobStatus.PROCESSING, acked.wait_seconds
    )
    finished = await store.apply_envelopes([done_a, ack_a])
    assert [(f.ord, f.outcome, f.attempt, f.status) for f in finished] == [
        (1, ApplyOutcome.APPLIED, 1, JobStatus.DONE),
        (2, ApplyOutcome.ALREADY_FINAL, 1, JobStatus.DONE),
    ]
    with dict_conn(db_url) as conn:
        row = job(conn, a.job_id)
    assert finished[0].wait_seconds == pytest.approx(
        (row["finished_at"] - row["started_at"]).total_seconds(), abs=1e-6
    )
    assert finished[1].wait_seconds is None
    # b: an ack and an error in one batch.
    error = {"code": "UNSUPPORTED_FORMAT", "message": "m"}
    batch = [
        answer(envelope(b.job_id, b.file_id, "processing", "scan-gateway"), "ack:b"),
        answer(envelope(b.job_id, b.file_id, "error", "scan-gateway", error=error), "result:b"),
        answer(envelope(uuid.uuid4(), b.file_id, "done"), "result:nobody"),
    ]
    applied = await store.apply_envelopes(batch)
    assert [(e.ord, e.outcome, e.attempt, e.status) for e in applied] == [
        (1, ApplyOutcome.APPLIED, 1, JobStatus.PROCESSING),
        (2, ApplyOutcome.APPLIED, 1, JobStatus.ERROR),
        (3, ApplyOutcome.UNKNOWN_JOB, None, None),
    ]
    assert applied[1].wait_seconds == 0.0  # acked and finished by the same statement
    assert applied[2].wait_seconds is None

    document = await store.get_file(a.file_id)
    assert document is not None and document["current_job"]["status"] == "done"
    assert document["current_job"]["metrics"] == {"rows": 3}
    assert await store.get_file(uuid.uuid4()) is None

    retried = await store.retry_file(b.file_id, "test")
    assert (retried.outcome, retried.reason, retried.attempt) == (RetryOutcome.RETRIED, None, 2)
    assert (retried.previous_job_id, retried.previous_status) == (b.job_id, JobStatus.ERROR)
    assert retried.job_id is not None
    unknown = uuid.uuid4()
    assert await store.retry_file(unknown, "test") == RetryResult(
        unknown, RetryOutcome.NOT_FOUND, RetryReason.FILE_NOT_FOUND, *[None] * 6
    )
    refused, missing = await store.retry_files([a.file_id, unknown], "test")
    assert {refused.file_id, missing.file_id} == {a.file_id, unknown}
    if refused.file_id != a.file_id:
        refused, missing = missing, refused
    assert (refused.outcome, refused.reason) == (RetryOutcome.NOT_RETRYABLE, RetryReason.NOT_FAILED)
    assert (refused.previous_status, refused.previous_attempt) == (JobStatus.DONE, 1)
    assert missing.outcome is RetryOutcome.NOT_FOUND

    # c: overdue at once (ack timeout 0): republished once, then dead-lettered.
    async def send_unacked(claimed: list[UnackedJob]) -> list[UnackedJob]:
        return claimed

    [unacked], too_large = await store.republish_unacked_jobs(
        limit=10, ack_timeout=0, max_republish=1, max_bytes=1 << 20, send=send_unacked
    )
    assert too_large == []
    assert (unacked.job_id, unacked.republish_count) == (c.job_id, 0)
    assert unacked.msg_id == f"{c.job_id}:1" and unacked.subject == "files.tabular_uploaded"
    assert json.loads(unacked.request)["job_id"] == str(c.job_id)
    # What nats-py sends: the request and the header block with the Nats-Msg-Id.
    header = f"NATS/1.0\r\nNats-Msg-Id: {unacked.msg_id}\r\n\r\n"
    assert unacked.bytes == len(unacked.request.encode()) + len(header.encode())
    with dict_conn(db_url) as conn:
        assert job(conn, c.job_id)["republish_count"] == 1
    [dead] = await store.dead_letter_unacked(ack_timeout=0, max_republish=1)
    assert (dead.job_id, dead.attempt, dead.file_id, dead.republish_count) == (
        c.job_id,
        1,
        c.file_id,
        1,
    )

    # b's new attempt is queued: it waits, then a DBA dead-letters it.
    await store.answers()  # the probes' trivial statement: the database answers
    assert await store.outbox_ready_age() >= 0.0
    with dict_conn(db_url) as conn:
        params = {"job_ids": [retried.job_id], "error_codes": ["X"], "error_messages": [None]}
        assert len(conn.execute(DEAD_LETTER_UNPUBLISHABLE, params).fetchall()) == 1
    assert await store.outbox_ready_age() == 0.0  # nothing queued any more

    ran = await store.run_due_tasks()  # the sweep and the charts' first sample
    assert all(isinstance(t, TaskRun) for t in ran)
    assert "sample_status" in {t.task for t in ran}
    await store.record_waits({"queued": [0, 2] + [0] * 15, "ack": [1] + [0] * 16})
    [point] = await store.status_series(60, within=5)
    assert isinstance(point, SeriesPoint) and point.queued == 0  # nothing queued, as above
    assert (point.seconds, point.finished, point.waits) == (None, None, None)  # the first
    await store.set_sweep_interval(7)
    await store.set_setting("default_max_attempts", "4")
    listed = await store.list_files(10, FileListFilter())
    assert [f.id for f in listed] == [c.file_id, b.file_id, a.file_id]  # newest first
    assert (listed[1].job_status, listed[1].attempt, listed[1].retryable) == (
        JobStatus.DLQ,
        2,
        True,
    )
    # Nothing left to publish or apply; the counts, the status view
    # (tests/integration/test_metrics_counts.py has their behaviour).
    assert await store.publish_queued_jobs(**PUBLISH, send=send) == []
    assert await store.publish_queued_jobs(**PUBLISH, send=send, pacing=PACED) == []
    await store.pace_unheard("image", 30)  # nobody listened to an image probe
    paced = await store.pace_view(within=5)
    assert [(p.pipeline, p.mode, p.in_flight_limit, p.queued, p.answering) for p in paced] == [
        ("tabular", "fixed", 5, 0, True),
        ("image", "fixed", 5, 0, False),
    ]
    assert await store.apply_envelopes([]) == []
    view = await store.status_view(ack_timeout=30, within=5)
    assert (view.jobs["done"], view.jobs["error"], view.jobs["dlq"]) == (1, 1, 2)
    assert await store.compact_counts() > 0
    view = await store.status_view(ack_timeout=30, within=5)
    assert (view.jobs["dlq"], view.files["ERROR"], view.oldest_queued_age_seconds) == (2, 2, 0)
    started = dt.datetime.now(dt.UTC)
    alive = BridgeInstance("arm-core@a:1", "1.0.0", started, 0.0, "ok", "ok", {}, 3)
    await store.record_bridge(alive)
    await store.record_bridge(
        dataclasses.replace(alive, nats="reconnecting", loops={"inbox": "failed"})
    )
    [seen] = await store.bridge_instances(within=5)
    assert dataclasses.replace(seen, seen_seconds_ago=0.0) == dataclasses.replace(
        alive, nats="reconnecting", loops={"inbox": "failed"}
    )
    assert seen.started_at == started and 0 <= seen.seen_seconds_ago < 60
    assert await store.forget_bridge("arm-core@a:1", within=5) is True
    assert await store.forget_bridge("arm-core@a:1", within=5) is False
    assert await store.bridge_instances(within=5) == []

    with dict_conn(db_url) as conn:
        assert job(conn, c.job_id)["status"] == "dlq"
        assert stored_file(conn, b.file_id)["status"] == "ERROR"
        run_every = "SELECT run_every FROM arm.periodic_task WHERE name = 'sweep_timeouts'"
        assert scalar(conn, run_every) == dt.timedelta(seconds=7)
        setting = "SELECT value FROM arm.setting WHERE name = 'default_max_attempts'"
        assert scalar(conn, setting) == "4"
        d = upload(conn)
        publish(conn)
    # d: overdue, and larger than the server takes now: dead-lettered, not sent.
    nothing, too_big = await store.republish_unacked_jobs(
        limit=10, ack_timeout=0, max_republish=3, max_bytes=10, send=send_unacked
    )
    assert nothing == [] and [j.job_id for j in too_big] == [d.job_id]
    with dict_conn(db_url) as conn:
        assert (job(conn, d.job_id)["status"], job(conn, d.job_id)["error_code"]) == (
            "dlq",
            "REQUEST_TOO_LARGE",
        )
    assert set(sent) == set(queries())


def test_the_sync_store_writes_what_migrate_writes(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        sync = SyncStore(conn)
        sync.set_sweep_interval(11)
        sync.set_setting("default_max_attempts", "6")
    with dict_conn(db_url) as conn:
        run_every = "SELECT run_every FROM arm.periodic_task WHERE name = 'sweep_timeouts'"
        assert scalar(conn, run_every) == dt.timedelta(seconds=11)
        setting = "SELECT value FROM arm.setting WHERE name = 'default_max_attempts'"
        assert scalar(conn, setting) == "6"


def _source(name: str) -> str:
    """A functions file without its comments."""
    return re.sub(r"--[^\n]*", "", (FUNCTIONS / name).read_text(encoding="utf-8"))


def test_the_outcome_enums_are_the_texts_the_functions_return() -> None:
    inbox = _source("30_inbox.sql")
    returned = set(re.findall(r"(?:RETURN QUERY SELECT|THEN|ELSE)\s+'([a-z_]+)'(?!::)", inbox))
    # `failed` is the inbox's own: the database raised on the envelope.
    assert returned == {o.value for o in ApplyOutcome} - {ApplyOutcome.FAILED}

    retry = re.findall(
        r"RETURN QUERY SELECT [\w.]+, '(\w+)', (?:'(\w+)'|NULL::text)", _source("50_retry.sql")
    )
    assert {outcome for outcome, _ in retry} == {o.value for o in RetryOutcome}
    assert {reason for _, reason in retry} - {""} == {r.value for r in RetryReason}

    publish = re.findall(
        r"THEN '(\w+)'\s+ELSE '(\w+)' END::arm.job_status", _source("21_publish_queued.sql")
    )
    assert publish == [(PublishOutcome.PUBLISHED.value, PublishOutcome.DLQ.value)]
    assert {o.value for o in PublishOutcome} <= {s.value for s in JobStatus}


def runtime_modules() -> list[Path]:
    """The runtime's sources: src/arm_core, bridge/ and http/, but not the store, its rows
    and db.py themselves nor the development tools."""
    found = [*(ROOT / "src" / "arm_core").glob("*.py"), *(ROOT / "bridge").glob("*.py")]
    found += (ROOT / "http").glob("*.py")
    return sorted(p for p in found if p.name not in ("store.py", "rows.py", "db.py"))


def test_only_the_store_sends_named_queries_or_reads_dict_rows() -> None:
    modules = runtime_modules()
    assert {"runtime.py", "migrate.py", "inbox.py", "publisher.py", "handlers.py"} <= {
        p.name for p in modules
    }
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "arm_core.db":
                assert not {a.name for a in node.names} & {"query", "queries"}, path
            if isinstance(node, ast.ImportFrom) and node.module == "psycopg.rows":
                raise AssertionError(f"{path} builds rows itself (psycopg.rows)")
            if isinstance(node, ast.Name | ast.Attribute):
                name = node.id if isinstance(node, ast.Name) else node.attr
                assert name not in ("dict_row", "query"), f"{path}:{node.lineno}: {name}"
