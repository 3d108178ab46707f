"""A differential oracle for arm.apply_envelopes: a batch applied in one call must give,
element by element, the outcome that the inbox's rule applied one envelope per call in
array order gives, and leave the same state behind. That rule, written the plain way
(arm_oracle.apply_envelope: lock the job, decide on what it shows), is inbox_oracle.sql
beside this file; the pool's clone of the test database gets it, nothing else does.

Both runs start from one pool of jobs in every state a job can be in when an envelope
arrives (queued, published, processing, done, needs_check, error, timeout, dlq, files
with a stale attempt 1 and a live or final attempt 2), built once per module through the
real functions and committed. Each run happens in a transaction that is rolled back, so
every case sees the same pool:

  A  SELECT … FROM arm.apply_envelopes(batch)            (the implementation under test)
  B  arm_oracle.apply_envelope, one call per element   (the oracle)

and compares outcomes (outcome, attempt, status per element) and a snapshot of
recognition_job, stored_file and s3_object. Timestamps compare only as NULL / kept (as
before the batch) / new, never by value, so a rewrite may take its times as it likes.

The random batches are seeded (`random.Random(seed)`), one test per seed: a failure
names its seed (rerun one with `-k seed017`) and prints the batch with readable labels
(`pub1@1` = attempt 1 of the file `pub1`) and the first differences. Only elements that
the inbox accepts are generated (those that raise fail the whole batch by contract), and
everything runs on one connection, so no element is `busy`; test_inbox_batch.py covers
both.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from arm_core.bridge.contracts import RESULT_SCHEMA, schema
from arm_core.db import query
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.sql import (
    DEAD_LETTER_UNPUBLISHABLE,
    Conn,
    Upload,
    ack,
    dict_conn,
    fail_by_no_ack,
    fail_by_timeout,
    publish,
    result,
    retry,
    upload,
)
from tests.support.databases import clone

pytestmark = pytest.mark.integration

SEEDS = range(300)
# The generator's reach is checked on a prefix of the seeds (a third oracle run each).
COVERAGE_SEEDS = range(100)

Envelope = dict[str, Any]
Outcome = tuple[str, int | None, str | None]  # outcome, attempt, status
Snapshot = dict[str, Any]

# The contract's error codes (test_contracts checks the list against the spec).
ERROR_CODES: tuple[str, ...] = tuple(
    schema(RESULT_SCHEMA)["properties"]["error"]["properties"]["code"]["enum"]
)
RESULT_KEYS = (
    "result_bucket",
    "result_key",
    "result_schema_version",
    "error_code",
    "error_message",
    "metrics",
)
# The oracle (B), created in the pool's database, and its call.
ORACLE_SQL = Path(__file__).with_name("inbox_oracle.sql")
APPLY_ONE = "SELECT outcome, attempt, status::text AS status FROM arm_oracle.apply_envelope(%s)"
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


# --- the pool --------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    label: str  # `<file>@<attempt>`
    job_id: uuid.UUID
    file_id: uuid.UUID
    attempt: int


@dataclass
class Pool:
    conn: Conn
    jobs: list[Job] = field(default_factory=list)
    unknown_jobs: list[uuid.UUID] = field(default_factory=list)
    unknown_files: list[uuid.UUID] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # str(uuid) → label
    # The rows as committed, before any batch, by id.
    base_jobs: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    base_files: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)

    def job(self, label: str) -> Job:
        return next(j for j in self.jobs if j.label == label)

    def add(self, file_label: str, file_id: uuid.UUID, job_id: uuid.UUID, attempt: int) -> None:
        self.jobs.append(Job(f"{file_label}@{attempt}", job_id, file_id, attempt))
        self.labels[str(job_id)] = f"{file_label}@{attempt}"
        self.labels[str(file_id)] = f"file:{file_label}"

    def _label(self, text: str) -> str:
        label = self.labels.get(text.lower(), text)
        return label if text.islower() or label == text else f"{label}(in capitals)"

    def relabel(self, value: Any) -> Any:
        """`value` with every uuid of the pool replaced by its label (for messages)."""
        if isinstance(value, uuid.UUID):
            value = str(value)
        if isinstance(value, str):
            return UUID_RE.sub(lambda m: self._label(m.group(0)), value)
        return value

    def base_status(self, job_id: str) -> str | None:
        row = self.base_jobs.get(uuid.UUID(job_id))
        return None if row is None else str(row["status"])

    def base_result_msg_id(self, job_id: str) -> str | None:
        row = self.base_jobs.get(uuid.UUID(job_id))
        return None if row is None else row["result_msg_id"]


def build_pool(conn: Conn) -> Pool:
    """24 jobs on 19 files, through the functions only (arm_core.devtools.testbed.sql). The
    order matters: fail_by_timeout times out everything published, fail_by_no_ack
    dead-letters it."""
    pool = Pool(conn)
    ups: dict[str, Upload] = {}

    def add(label: str, up: Upload, job_id: uuid.UUID | None = None, attempt: int = 1) -> None:
        ups[label] = up
        pool.add(label, up.file_id, job_id or up.job_id, attempt)

    # queued → dlq: the request could not be published (never went out).
    unpub = upload(conn)
    conn.execute(
        DEAD_LETTER_UNPUBLISHABLE,
        {"job_ids": [unpub.job_id], "error_codes": ["PAYLOAD_TOO_LARGE"], "error_messages": [None]},
    )
    add("unpub", unpub)

    # Timed out: one left so, three retried (attempt 2 published / processing / done).
    timed_out, retry_pub, retry_done = upload(conn), upload(conn), upload(conn)
    retry_proc = upload(conn, "PDF")  # an image file: another pipeline, another service
    fail_by_timeout(conn, timed_out)
    for label, up in (
        ("timed_out", timed_out),
        ("retry_pub", retry_pub),
        ("retry_proc", retry_proc),
        ("retry_done", retry_done),
    ):
        add(label, up)

    # published → dlq for want of an ack; one retried, its attempt 2 left queued (below).
    no_ack, no_ack_retry = upload(conn), upload(conn)
    publish(conn)
    fail_by_no_ack(conn)
    add("no_ack", no_ack)
    add("no_ack_retry", no_ack_retry)

    second: dict[str, uuid.UUID] = {}
    for label, up in (("retry_pub", retry_pub), ("retry_proc", retry_proc)):
        second[label] = retry(conn, up.file_id)["job_id"]
    second["retry_done"] = retry(conn, retry_done.file_id)["job_id"]

    fresh_labels = "pub1 pub2 pub3 proc1 proc2 done_acked done_direct checked errored error_retry"
    fresh = {label: upload(conn) for label in fresh_labels.split()}
    publish(conn)  # also every attempt 2 above
    for label, up in fresh.items():
        add(label, up)
    for label, job_id in second.items():
        add(label, ups[label], job_id, attempt=2)

    ack(conn, fresh["proc1"].job_id, fresh["proc1"].file_id)
    ack(conn, fresh["proc2"].job_id, fresh["proc2"].file_id, version="2.0.0")
    ack(conn, second["retry_proc"], retry_proc.file_id, service="scan-gateway")
    ack(conn, second["retry_done"], retry_done.file_id)
    result(conn, second["retry_done"], retry_done.file_id, attempt=2, metrics={"rows": 7})
    ack(conn, fresh["done_acked"].job_id, fresh["done_acked"].file_id)
    result(conn, fresh["done_acked"].job_id, fresh["done_acked"].file_id, metrics={"rows": 3})
    result(conn, fresh["done_direct"].job_id, fresh["done_direct"].file_id)  # its ack was lost
    ack(conn, fresh["checked"].job_id, fresh["checked"].file_id)
    result(conn, fresh["checked"].job_id, fresh["checked"].file_id, "needs_check")
    ack(conn, fresh["errored"].job_id, fresh["errored"].file_id)
    result(
        conn,
        fresh["errored"].job_id,
        fresh["errored"].file_id,
        "error",
        error=("UNREADABLE", "лист 2 пуст"),
    )
    er = fresh["error_retry"]
    result(conn, er.job_id, er.file_id, "error", error=("UNSUPPORTED_FORMAT", "XLSB 2003"))
    add("error_retry", er, retry(conn, er.file_id)["job_id"], attempt=2)  # queued
    add("no_ack_retry", no_ack_retry, retry(conn, no_ack_retry.file_id)["job_id"], attempt=2)
    add("queued1", upload(conn))
    add("queued2", upload(conn, "PDF"))

    pool.jobs.sort(key=lambda j: j.label)
    for i in range(3):
        pool.unknown_jobs.append(uuid.uuid4())
        pool.labels[str(pool.unknown_jobs[-1])] = f"unknown_job.{i}"
    for i in range(2):
        pool.unknown_files.append(uuid.uuid4())
        pool.labels[str(pool.unknown_files[-1])] = f"unknown_file.{i}"

    for row in conn.execute("SELECT * FROM arm.recognition_job").fetchall():
        pool.base_jobs[row["id"]] = row
    for row in conn.execute("SELECT * FROM arm.stored_file").fetchall():
        pool.base_files[row["id"]] = row
    statuses = Counter(str(r["status"]) for r in pool.base_jobs.values())
    assert set(statuses) == {
        "queued",
        "published",
        "processing",
        "done",
        "needs_check",
        "error",
        "timeout",
        "dlq",
    }, statuses
    assert len(pool.jobs) == len(pool.base_jobs)
    return pool


@pytest.fixture(scope="module")
def pool(pg_server: EmbeddedPostgres, template_db: str) -> Iterator[Pool]:
    """One clone of the migrated template (as conftest's db_url) for the whole module:
    the pool is built once and committed; every case rolls its runs back. A clone per
    seed would cost ~0.3 s each."""
    with clone(pg_server, "arm_equiv", template_db) as url, dict_conn(url) as conn:
        conn.execute(ORACLE_SQL.read_text())
        yield build_pool(conn)


# --- the two runs ----------------------------------------------------------------------


def run_batch(conn: Conn, batch: list[Envelope]) -> list[Outcome]:
    """A: the whole batch in one apply_envelopes call."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("apply_envelopes"), {"envelopes": Jsonb(batch)}).fetchall()
    assert [r["ord"] for r in rows] == list(range(1, len(batch) + 1)), rows
    return [(r["outcome"], r["attempt"], r["status"]) for r in rows]


def run_one_by_one(conn: Conn, batch: list[Envelope]) -> list[Outcome]:
    """B: the oracle, one arm_oracle.apply_envelope call per element, in array order."""
    out: list[Outcome] = []
    with conn.cursor(row_factory=dict_row) as cur:
        for env in batch:
            row = cur.execute(APPLY_ONE, (Jsonb(env),)).fetchone()
            assert row is not None
            out.append((row["outcome"], row["attempt"], row["status"]))
    return out


def snapshot(pool: Pool) -> Snapshot:
    """The state an inbox batch may touch, by label; timestamps as NULL / kept / new."""
    conn = pool.conn
    objects = {
        r["id"]: (str(r["bucket_role"]), r["bucket"], r["key"], r["created_by"])
        for r in conn.execute("SELECT * FROM arm.s3_object").fetchall()
    }

    def norm(row: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for col, value in row.items():
            if col == "result_s3_object_id":
                value = None if value is None else objects[value]
            elif isinstance(value, datetime):
                value = "kept" if base is not None and base[col] == value else "new"
            elif isinstance(value, uuid.UUID):
                value = pool.labels.get(str(value), str(value))
            elif value is not None and not isinstance(value, int | str | dict | list):
                value = str(value)  # enums, should psycopg not map them to str
            out[col] = value
        return out

    jobs = {
        pool.labels.get(str(r["id"]), str(r["id"])): norm(r, pool.base_jobs.get(r["id"]))
        # metrics as text too: psycopg reads a JSON null and an SQL NULL both as None.
        for r in conn.execute(
            "SELECT *, metrics::text AS metrics_text FROM arm.recognition_job"
        ).fetchall()
    }
    files = {
        pool.labels.get(str(r["id"]), str(r["id"])): norm(
            {k: v for k, v in r.items() if k != "updated_at"}, pool.base_files.get(r["id"])
        )
        for r in conn.execute("SELECT * FROM arm.stored_file").fetchall()
    }
    counted = Counter(objects.values())
    return {
        "jobs": jobs,
        "files": files,
        "s3_objects": sorted((*k, n) for k, n in counted.items()),
    }


@dataclass
class Run:
    outcomes: list[Outcome]
    state: Snapshot


def run(pool: Pool, batch: list[Envelope], apply: Callable[[Conn, list[Envelope]], Any]) -> Run:
    with pool.conn.transaction(force_rollback=True):
        outcomes = apply(pool.conn, batch)
        return Run(outcomes, snapshot(pool))


def describe(pool: Pool, env: Envelope) -> str:
    kind = "ack   " if env["status"] == "processing" else f"{env['status']:<11}"
    parts = [
        kind,
        f"job={pool.relabel(env.get('job_id'))}",
        f"file={pool.relabel(env.get('file_id'))}",
        f"msg={pool.relabel(env.get('msg_id'))}",
        f"svc={env.get('service_name')}/{env.get('service_version')}",
    ]
    if env["status"] != "processing":
        extra = {k: env[k] for k in RESULT_KEYS if env.get(k) is not None}
        if extra:
            parts.append(pool.relabel(json.dumps(extra, ensure_ascii=False)))
    return " ".join(parts)


def _first_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
                cols = sorted(
                    c for c in set(a[key]) | set(b[key]) if a[key].get(c) != b[key].get(c)
                )
                return [f"  {key}.{c}: A={a[key].get(c)!r}  B={b[key].get(c)!r}" for c in cols]
            return [f"  {key}: A={a.get(key)!r}  B={b.get(key)!r}"]
    return []


def assert_equivalent(pool: Pool, batch: list[Envelope], context: str) -> tuple[Run, Run]:
    a = run(pool, batch, run_batch)
    b = run(pool, batch, run_one_by_one)
    if a.outcomes == b.outcomes and a.state == b.state:
        return a, b
    lines = [
        f"{context}: apply_envelopes (A) is not the oracle one by one (B)",
        "batch (element: A outcome | B outcome):",
    ]
    pairs = zip(a.outcomes, b.outcomes, strict=True)
    first = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
    for i, (env, x, y) in enumerate(zip(batch, a.outcomes, b.outcomes, strict=True)):
        mark = "  <-- first difference" if i == first else "  <-- differs" if x != y else ""
        lines.append(f"  {i + 1:2}. {describe(pool, env)}")
        lines.append(f"        A={x} | B={y}{mark}")
    for part in ("jobs", "files"):
        diff = _first_diff(a.state[part], b.state[part])
        if diff:
            lines += [f"first differing row of {part}:", *diff]
    if a.state["s3_objects"] != b.state["s3_objects"]:
        only_a = sorted(set(a.state["s3_objects"]) - set(b.state["s3_objects"]))
        only_b = sorted(set(b.state["s3_objects"]) - set(a.state["s3_objects"]))
        lines += [
            "s3_object (role, bucket, key, created_by, count):",
            f"  only in A: {pool.relabel(str(only_a))}",
            f"  only in B: {pool.relabel(str(only_b))}",
        ]
    pytest.fail("\n".join(lines), pytrace=False)


# --- envelopes -------------------------------------------------------------------------


def ack_env(
    job_id: uuid.UUID | str,
    file_id: uuid.UUID | str | None,
    service: str = "tabular-parser",
    version: str = "1.4.2",
) -> Envelope:
    return {
        "job_id": str(job_id),
        "file_id": None if file_id is None else str(file_id),
        "msg_id": f"ack:{job_id}",
        "status": "processing",
        "service_name": service,
        "service_version": version,
    }


def result_env(
    job_id: uuid.UUID | str,
    file_id: uuid.UUID | str | None,
    status: str = "done",
    msg_id: str | None = None,
    service: str = "tabular-parser",
    version: str = "1.4.2",
    bucket: str = "arm-ka",
    key: str | None = None,
    schema_version: str = "1.0",
    error: tuple[str, str | None] | None = None,
    metrics: dict[str, Any] | None = None,
) -> Envelope:
    """A valid result with every key present (unused ones null), as the bridge sends."""
    success = status in ("done", "needs_check")
    if status == "error" and error is None:
        error = ("RECOGNITION_FAILED", "нет таблицы")
    return {
        "job_id": str(job_id),
        "file_id": None if file_id is None else str(file_id),
        "msg_id": msg_id or f"result:{job_id}:x",
        "status": status,
        "service_name": service,
        "service_version": version,
        "result_bucket": bucket if success else None,
        "result_key": (key or f"results/{job_id}/result.json") if success else None,
        "result_schema_version": schema_version if success else None,
        "error_code": error[0] if error else None,
        "error_message": error[1] if error else None,
        "metrics": metrics,
    }


def random_envelope(rng: random.Random, pool: Pool, focus: list[Job], acks: float) -> Envelope:
    # The target: mostly the batch's few focus jobs (so envelopes of one job meet), some
    # other pool job, or a job that does not exist.
    r = rng.random()
    if r < 0.1:
        job_id = rng.choice(pool.unknown_jobs)
        file_id: uuid.UUID | None = rng.choice([*pool.unknown_files, rng.choice(pool.jobs).file_id])
        attempt = 1
    else:
        target = rng.choice(focus) if r < 0.9 else rng.choice(pool.jobs)
        job_id, file_id, attempt = target.job_id, target.file_id, target.attempt
        if rng.random() < 0.1:  # file_mismatch: another file, an unknown one, or none
            file_id = rng.choice(
                [rng.choice(pool.jobs).file_id, rng.choice(pool.unknown_files), None]
            )
    service = rng.choice(["tabular-parser", "tabular-parser", "scan-gateway"])
    version = rng.choice(["1.4.2", "2.0.0"])

    if rng.random() < acks:
        env = ack_env(job_id, file_id, service, version)
        if rng.random() < 0.1:  # result fields on an ack: ignored
            env.update(result_bucket="arm-ka", result_key="results/ack.json", metrics={"x": 1})
        elif rng.random() < 0.5:
            env.update(dict.fromkeys(RESULT_KEYS))  # present as null rather than absent
        return _maybe_upper(rng, env)

    stored = pool.base_result_msg_id(str(job_id))
    msg_id = rng.choice(
        [
            f"result:{job_id}:{attempt}",  # the helper's, so a stored result's own
            f"result:{job_id}:{attempt}",
            stored or f"result:{job_id}:{attempt}",
            f"alt:{job_id}:{rng.randint(0, 1)}",
            f"shared:{rng.randint(0, 1)}",  # one msg_id on several jobs
        ]
    )
    status = rng.choices(["done", "needs_check", "error"], weights=[45, 15, 40])[0]
    metrics = rng.choice([None, None, {}, {"rows": rng.randint(0, 500)}, {"rows": 1, "p": [1]}])
    env = result_env(
        job_id,
        file_id,
        status,
        msg_id=msg_id,
        service=service,
        version=version,
        bucket=rng.choice(["arm-ka", "arm-results"]),
        key=f"results/{pool.labels.get(str(job_id), 'x')}/{rng.randint(0, 3)}.json",
        schema_version=rng.choice(["1.0", "1.1"]),
        error=(rng.choice(ERROR_CODES), rng.choice(["не читается", "", None])),
        metrics=metrics,
    )
    if status != "error":
        if rng.random() < 0.1:  # an error code on a success: ignored
            env["error_code"], env["error_message"] = "UNREADABLE", "ignored"
        else:
            env["error_code"] = env["error_message"] = None
    elif rng.random() < 0.1:  # an error with a result file: registered all the same
        env.update(result_bucket="arm-ka", result_key=f"results/err/{rng.randint(0, 1)}.json")
        env["result_schema_version"] = rng.choice([None, "1.0"])
    for key in RESULT_KEYS:  # unused keys: null or absent, as the sender pleases
        if env[key] is None and rng.random() < 0.3:
            del env[key]
    return _maybe_upper(rng, env)


def _maybe_upper(rng: random.Random, env: Envelope) -> Envelope:
    """Now and then ids in capitals: still the same job (the bridge sends str(UUID), but a
    DBA's batch need not), so grouping by the id's text would not do."""
    if rng.random() < 0.05:
        env["job_id"] = env["job_id"].upper()
        if env["file_id"] is not None:
            env["file_id"] = env["file_id"].upper()
    return env


def random_batch(seed: int, pool: Pool) -> list[Envelope]:
    rng = random.Random(seed)
    # The few jobs the batch is mostly about, live ones first: only they can change.
    live = [j for j in pool.jobs if pool.base_status(str(j.job_id)) in ("published", "processing")]
    rest = [j for j in pool.jobs if j not in live]
    focus = rng.sample(live, k=rng.randint(1, 4)) + rng.sample(rest, k=rng.randint(0, 3))
    acks = rng.uniform(0.1, 0.6)  # the share of acks: some batches are mostly acks
    batch: list[Envelope] = []
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        if batch and r < 0.2:
            batch.append(dict(rng.choice(batch)))  # a redelivery: the very same message
        elif batch and r < 0.3:  # another message of a job met before (ack, 2nd result…)
            earlier = rng.choice(batch)
            same = uuid.UUID(earlier["job_id"])
            job = next((j for j in pool.jobs if j.job_id == same), None)
            batch.append(random_envelope(rng, pool, [job] if job else focus, acks))
        else:
            batch.append(random_envelope(rng, pool, focus, acks))
    return batch


# --- the tests -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s:03d}")
def test_a_random_batch_is_its_elements_applied_one_by_one(pool: Pool, seed: int) -> None:
    batch = random_batch(seed, pool)
    assert_equivalent(pool, batch, f"seed {seed} (rerun it alone: -k seed{seed:03d})")


def test_the_random_batches_reach_every_outcome_and_scenario(pool: Pool) -> None:
    """The oracle is only as good as its inputs: the generator must produce every outcome
    for acks and results, and the orderings that make batching hard."""
    seen: Counter[str] = Counter()
    for seed in COVERAGE_SEEDS:
        batch = random_batch(seed, pool)
        outcomes = run(pool, batch, run_one_by_one).outcomes
        applied_ack: set[str] = set()
        applied_result: set[str] = set()
        for env, (outcome, _, _) in zip(batch, outcomes, strict=True):
            job_id, is_ack = str(uuid.UUID(env["job_id"])), env["status"] == "processing"
            base = pool.base_status(job_id)
            seen[f"{'ack' if is_ack else 'result'} {outcome}"] += 1
            if outcome == "applied" and not is_ack:
                seen[f"applied {env['status']}"] += 1
                seen[
                    "result after an ack in the batch"
                    if job_id in applied_ack
                    else f"result applied to a {base} job"
                ] += 1
            if outcome == "duplicate" and not is_ack:
                stored = env["msg_id"] == pool.base_result_msg_id(job_id)
                seen[
                    "duplicate of a stored result"
                    if stored
                    else "duplicate of a result in the batch"
                ] += 1
            if outcome == "already_final" and job_id in applied_result:
                seen[f"{'ack' if is_ack else 'result'} after a result in the batch"] += 1
            if outcome == "already_final" and base in ("timeout", "dlq", "error") and not is_ack:
                seen["result of a failed (stale) attempt"] += 1
            if outcome == "applied":
                (applied_ack if is_ack else applied_result).add(job_id)
        seen["batches with a repeated msg_id"] += len({e["msg_id"] for e in batch}) < len(batch)
    wanted = [
        *(
            f"{kind} {o}"
            for kind in ("ack", "result")
            for o in (
                "applied",
                "duplicate",
                "already_final",
                "not_published",
                "unknown_job",
                "file_mismatch",
            )
        ),
        "applied done",
        "applied needs_check",
        "applied error",
        "result applied to a published job",
        "result applied to a processing job",
        "result after an ack in the batch",
        "duplicate of a stored result",
        "duplicate of a result in the batch",
        "ack after a result in the batch",
        "result after a result in the batch",
        "result of a failed (stale) attempt",
        "batches with a repeated msg_id",
    ]
    missing = {w: seen[w] for w in wanted if seen[w] < 10}
    assert not missing, f"the generator rarely reaches {missing}; all: {dict(seen)}"


def _cases(pool: Pool) -> dict[str, tuple[list[Envelope], list[str]]]:
    """Hand-written batches with the outcomes the one-by-one semantics give."""
    j = pool.job
    pub1, pub2, proc1 = j("pub1@1"), j("pub2@1"), j("proc1@1")
    done, stale, live2 = j("done_acked@1"), j("retry_pub@1"), j("retry_pub@2")
    unknown = pool.unknown_jobs[0]
    stored = pool.base_result_msg_id(str(done.job_id))
    r1 = result_env(pub1.job_id, pub1.file_id, msg_id="m1", metrics={"rows": 1})
    return {
        "ack then result": (
            [ack_env(pub1.job_id, pub1.file_id), r1],
            ["applied", "applied"],
        ),
        "result then ack": (
            [r1, ack_env(pub1.job_id, pub1.file_id)],
            ["applied", "already_final"],
        ),
        "ack, result, ack again": (
            [ack_env(pub1.job_id, pub1.file_id), r1, ack_env(pub1.job_id, pub1.file_id)],
            ["applied", "applied", "already_final"],
        ),
        "two results with different msg_ids": (
            [r1, result_env(pub1.job_id, pub1.file_id, "needs_check", msg_id="m2")],
            ["applied", "already_final"],
        ),
        "the same result twice": ([r1, dict(r1)], ["applied", "duplicate"]),
        "the same msg_id, other content": (
            [r1, result_env(pub1.job_id, pub1.file_id, "error", msg_id="m1")],
            ["applied", "duplicate"],
        ),
        "result whose ack was lost (published → done)": (
            [result_env(pub2.job_id, pub2.file_id, "needs_check")],
            ["applied"],
        ),
        "file mismatch, then the valid ack": (
            [ack_env(pub1.job_id, pub2.file_id), ack_env(pub1.job_id, pub1.file_id)],
            ["file_mismatch", "applied"],
        ),
        "file mismatch, then the same result with the right file, twice": (
            [
                result_env(pub1.job_id, None, msg_id="m1"),
                r1,
                dict(r1),
            ],
            ["file_mismatch", "applied", "duplicate"],
        ),
        "error result then done result": (
            [
                result_env(proc1.job_id, proc1.file_id, "error", msg_id="e"),
                result_env(proc1.job_id, proc1.file_id, "done", msg_id="d"),
            ],
            ["applied", "already_final"],
        ),
        "ack of a processing job, twice": (
            [
                ack_env(proc1.job_id, proc1.file_id, version="9.9.9"),
                ack_env(proc1.job_id, proc1.file_id),
            ],
            ["duplicate", "duplicate"],
        ),
        "result of a queued job, and its ack": (
            [
                result_env(j("queued1@1").job_id, j("queued1@1").file_id),
                ack_env(j("queued1@1").job_id, j("queued1@1").file_id),
            ],
            ["not_published", "not_published"],
        ),
        "queued attempt 2 and its dead-lettered attempt 1": (
            [
                result_env(j("no_ack_retry@2").job_id, j("no_ack_retry@2").file_id),
                result_env(j("no_ack_retry@1").job_id, j("no_ack_retry@1").file_id),
                ack_env(j("unpub@1").job_id, j("unpub@1").file_id),
            ],
            ["not_published", "already_final", "already_final"],
        ),
        "a stored result redelivered, then another result": (
            [
                result_env(done.job_id, done.file_id, "error", msg_id=stored),
                result_env(done.job_id, done.file_id, msg_id="another"),
                ack_env(done.job_id, done.file_id),
            ],
            ["duplicate", "already_final", "already_final"],
        ),
        "a stored result redelivered with another file": (
            [result_env(done.job_id, pub1.file_id, msg_id=stored)],
            ["file_mismatch"],
        ),
        "stale attempt 1 around the live attempt 2": (
            [
                result_env(stale.job_id, stale.file_id, "error"),
                ack_env(live2.job_id, live2.file_id),
                ack_env(stale.job_id, stale.file_id),
                result_env(live2.job_id, live2.file_id, "error"),
            ],
            ["already_final", "applied", "already_final", "applied"],
        ),
        "one msg_id on two jobs": (
            [
                result_env(pub1.job_id, pub1.file_id, msg_id="shared"),
                result_env(pub2.job_id, pub2.file_id, msg_id="shared"),
                result_env(pub1.job_id, pub1.file_id, msg_id="shared"),
            ],
            ["applied", "applied", "duplicate"],
        ),
        "two results register the same result key": (
            [
                result_env(pub1.job_id, pub1.file_id, key="results/same.json"),
                result_env(pub2.job_id, pub2.file_id, key="results/same.json"),
            ],
            ["applied", "applied"],
        ),
        "an unknown job, three times": (
            [
                ack_env(unknown, pub1.file_id),
                result_env(unknown, pub1.file_id, msg_id="u"),
                result_env(unknown, pub1.file_id, msg_id="u"),
            ],
            ["unknown_job", "unknown_job", "unknown_job"],
        ),
    }


CASE_NAMES = [
    "ack then result",
    "result then ack",
    "ack, result, ack again",
    "two results with different msg_ids",
    "the same result twice",
    "the same msg_id, other content",
    "result whose ack was lost (published → done)",
    "file mismatch, then the valid ack",
    "file mismatch, then the same result with the right file, twice",
    "error result then done result",
    "ack of a processing job, twice",
    "result of a queued job, and its ack",
    "queued attempt 2 and its dead-lettered attempt 1",
    "a stored result redelivered, then another result",
    "a stored result redelivered with another file",
    "stale attempt 1 around the live attempt 2",
    "one msg_id on two jobs",
    "two results register the same result key",
    "an unknown job, three times",
]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_an_edge_batch_is_its_elements_applied_one_by_one(pool: Pool, name: str) -> None:
    batch, expected = _cases(pool)[name]
    a, _ = assert_equivalent(pool, batch, name)
    assert [o[0] for o in a.outcomes] == expected


def test_the_edge_cases_are_all_parametrized(pool: Pool) -> None:
    assert sorted(_cases(pool)) == sorted(CASE_NAMES)


def test_the_runs_leave_the_pool_as_it_was(pool: Pool) -> None:
    """Every run rolls back: what the cases compare against is the committed pool."""
    before = snapshot(pool)
    assert_equivalent(pool, random_batch(0, pool), "seed 0")
    assert snapshot(pool) == before
    statuses = {label: row["status"] for label, row in before["jobs"].items()}
    assert statuses["pub1@1"] == "published" and statuses["retry_pub@1"] == "timeout"
