"""Helpers that act as upstream and as a DBA would: plain-SQL uploads
(docs/behaviour.md#interfaces) and calls of the arm.* functions. They write nothing the
functions would not write.

And the logins the tests connect as (docs/dbas.md "Database roles"): one login member of each
group role of db/roles.sql, created once per cluster (:func:`ensure_logins`, by the
conftest's template_db fixture). :func:`as_login` turns the suite's superuser URL into a
login's, which is how the bridge, the API and the `arm-core` processes under test run
with their roles' privileges and no more (processes.py here; the tests' bridge and API
helpers); setup code keeps the superuser (or the uploader's login)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb

from arm_core.db import query
from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.migrate import SQL_DIR
from arm_core.statuses import FileType
from arm_core.store import publish_params

# Every migration of db/migrations, in the order they apply (their numbered names), read
# from the folder `arm-core migrate` reads: a new migration is in every test that lists
# them.
MIGRATIONS = sorted(
    path.name.removesuffix(".sql")
    for path in (SQL_DIR / "migrations").glob("[0-9]*.sql")
    if not path.name.endswith(".rollback.sql")
)


def pipeline_for(file_type: str) -> str:
    """The pipeline a file type goes to: spreadsheets to tabular, scans to image (the
    same rule as arm.pipeline_for; tests/integration/test_schema.py checks they agree)."""
    tabular = FileType(file_type) in (FileType.XLS, FileType.XLSX, FileType.XLSB)
    return "tabular" if tabular else "image"


# Connections in tests return dict rows (conftest `conn`, dict_conn) or tuples.
Conn = psycopg.Connection[Any]


# The superuser of the suite's embedded PostgreSQL (arm_core.devtools.embedded_postgres).
SUPERUSER = "postgres"


@dataclass(frozen=True)
class Login:
    """A login role of the tests and the group roles it is a member of."""

    name: str
    roles: tuple[str, ...]


BRIDGE_LOGIN = Login("arm_test_bridge", ("arm_bridge",))
API_LOGIN = Login("arm_test_api", ("arm_api",))
# `arm-core serve` with NATS_ENABLED=true runs the API and the bridge in one process.
SERVE_LOGIN = Login("arm_test_serve", ("arm_api", "arm_bridge"))
UPLOADER_LOGIN = Login("arm_test_uploader", ("arm_uploader",))
READONLY_LOGIN = Login("arm_test_readonly", ("arm_readonly",))
# A DBA who changes the schedule or calls the owner's functions (SET ROLE is not needed:
# members inherit).
OWNER_LOGIN = Login("arm_test_owner", ("arm_owner",))
LOGINS = (BRIDGE_LOGIN, API_LOGIN, SERVE_LOGIN, UPLOADER_LOGIN, READONLY_LOGIN, OWNER_LOGIN)


def ensure_logins(url: str) -> None:
    """Creates the logins of LOGINS that url's server does not have yet (url: a
    superuser's, of a migrated database, so the group roles exist); safe to repeat.
    It asks the server each time (one query) rather than remember which servers have
    them: a server started later on a port an earlier one used is another server."""
    names = [login.name for login in LOGINS]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (names,))
        have = {row[0] for row in rows}
        for login in LOGINS:
            if login.name not in have:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                        sql.Identifier(login.name),
                        sql.SQL(", ").join(map(sql.Identifier, login.roles)),
                    )
                )


def as_login(url: str, login: Login) -> str:
    """url with the suite's superuser replaced by `login` (the server trusts loopback
    connections, so no password); any other URL is returned as it is."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or parts.username != SUPERUSER:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{login.name}@{host}"))


@dataclass(frozen=True)
class Upload:
    file_id: uuid.UUID
    job_id: uuid.UUID
    s3_object_id: uuid.UUID
    key: str


@dataclass(frozen=True)
class Uploaded:
    """What arm.upload_file returns (the object's id is not the uploader's to read)."""

    file_id: uuid.UUID
    job_id: uuid.UUID
    key: str


def upload(
    conn: Conn,
    file_type: str = "XLSX",
    name: str | None = None,
    bucket: str = "arm-ka",
    consolidation_id: uuid.UUID | None = None,
) -> Upload:
    """Creates a file the way upstream does: s3_object, stored_file, a queued job, then
    the file's current job — plain SQL inserts, no function."""
    name = name or f"ОСВ {uuid.uuid4().hex[:6]}.{file_type.lower()}"
    pipeline = pipeline_for(file_type)
    with conn.transaction():
        key = f"uploads/{uuid.uuid4()}/{name}"
        obj = _one(
            conn,
            "INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by) "
            "VALUES (%s, %s, 'uploads', 'upload-service') RETURNING id",
            (bucket, key),
        )
        file_id = _one(
            conn,
            "INSERT INTO arm.stored_file (consolidation_id, original_name, file_type, s3_object_id)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (consolidation_id or uuid.uuid4(), name, file_type, obj),
        )
        job_id = _one(
            conn,
            "INSERT INTO arm.recognition_job (file_id, pipeline, attempt) "
            "VALUES (%s, %s, 1) RETURNING id",
            (file_id, pipeline),
        )
        conn.execute(
            "UPDATE arm.stored_file SET current_recognition_job_id = %s WHERE id = %s",
            (job_id, file_id),
        )
    return Upload(file_id=file_id, job_id=job_id, s3_object_id=obj, key=key)


def upload_file(
    conn: Conn,
    file_type: str = "XLSX",
    name: str | None = None,
    bucket: str = "arm-ka",
    consolidation_id: uuid.UUID | None = None,
) -> Uploaded:
    """The same upload as :func:`upload` in one call of arm.upload_file, the recommended
    upload (docs/dbas.md): the same rows, the same triggers."""
    name = name or f"ОСВ {uuid.uuid4().hex[:6]}.{file_type.lower()}"
    key = f"uploads/{uuid.uuid4()}/{name}"
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            "SELECT file_id, job_id FROM arm.upload_file(p_bucket => %s, p_key => %s, "
            "p_original_name => %s, p_file_type => %s, p_consolidation_id => %s, "
            "p_created_by => 'upload-service')",
            (bucket, key, name, file_type, consolidation_id or uuid.uuid4()),
        ).fetchone()
        assert row is not None
    return Uploaded(file_id=row[0], job_id=row[1], key=key)


def upload_many(
    conn: Conn, n: int, file_type: str = "XLSX", mixed: bool = False, name_suffix: str = ""
) -> None:
    """n plain-SQL uploads as docs/dbas.md's upload, set-wise (one INSERT of jobs, so one
    wake-up): an s3_object, a stored_file and a queued job each, then the file's current
    job; with `mixed`, every other file is a PDF scan; `name_suffix` ends each file's name
    (a reference service's marker: `[fail-once]`)."""
    with conn.transaction():
        _upload_many(conn, n, file_type, mixed, name_suffix)


async def steady_uploads(
    url: str, n: int, chunk: int = 20, pause: float = 0.05, mixed: bool = False
) -> None:
    """A steady flow on a thread: n plain-SQL uploads (:func:`upload_many`, `mixed` as
    there), `chunk` at a time, one chunk every `pause` seconds."""

    def flow() -> None:
        with dict_conn(url) as conn:
            for _ in range(n // chunk):
                upload_many(conn, chunk, mixed=mixed)
                time.sleep(pause)

    await asyncio.to_thread(flow)


def upload_consolidations(
    conn: Conn, n: int, consolidations: Sequence[uuid.UUID], first: int = 0
) -> list[uuid.UUID]:
    """n spreadsheets uploaded in one call of arm.upload_files (one statement, as the
    workstation's batch upload): file i (from `first`) belongs to consolidation i modulo
    their number. Their job ids, in order."""
    files = [
        {
            "bucket": "arm-ka",
            "key": f"uploads/{uuid.uuid4()}/ОСВ {i}.xlsx",
            "original_name": f"ОСВ {i}.xlsx",
            "file_type": "XLSX",
            "consolidation_id": str(consolidations[i % len(consolidations)]),
        }
        for i in range(first, first + n)
    ]
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute("SELECT job_id FROM arm.upload_files(%s)", (Jsonb(files),))
        return [r[0] for r in rows.fetchall()]


def _upload_many(conn: Conn, n: int, file_type: str, mixed: bool, suffix: str = "") -> None:
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            """
            WITH o AS (
                INSERT INTO arm.s3_object (bucket, key, bucket_role)
                SELECT 'arm-ka', 'uploads/burst/' || g, 'uploads' FROM generate_series(1, %(n)s) g
                RETURNING id, key
            ), f AS (
                INSERT INTO arm.stored_file (original_name, file_type, s3_object_id)
                SELECT o.key || %(suffix)s,
                       CASE WHEN %(mixed)s AND split_part(o.key, '/', 3)::int %% 2 = 1
                            THEN 'PDF' ELSE %(type)s END::arm.file_type,
                       o.id
                FROM o
                RETURNING id
            )
            INSERT INTO arm.recognition_job (file_id, attempt) SELECT id, 1 FROM f
            RETURNING file_id, id
            """,
            {"n": n, "type": file_type, "mixed": mixed, "suffix": suffix},
        ).fetchall()
    files, jobs = [r[0] for r in rows], [r[1] for r in rows]
    # A second statement: the sub-statements of one WITH cannot see each other's rows.
    # By the ids just written: a scan for files without a current job would read the
    # whole history, every batch (an hour's soak saw its p99 creep with the table).
    conn.execute(
        """
        UPDATE arm.stored_file f SET current_recognition_job_id = u.job_id
        FROM unnest(%s::uuid[], %s::uuid[]) AS u(file_id, job_id)
        WHERE f.id = u.file_id
        """,
        (files, jobs),
    )


def _one(conn: Conn, sql: str, params: tuple[Any, ...]) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return next(iter(row.values())) if isinstance(row, dict) else row[0]


def dict_conn(url: str) -> Conn:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def job(conn: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM arm.recognition_job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"no job {job_id}"
    return row


def stored_file(conn: Conn, file_id: uuid.UUID) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM arm.stored_file WHERE id = %s", (file_id,)).fetchone()
    assert row is not None, f"no file {file_id}"
    return row


def jobs_of(conn: Conn, file_id: uuid.UUID) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM arm.recognition_job WHERE file_id = %s ORDER BY attempt", (file_id,)
        ).fetchall()


# What a DBA calls and today's runtime does not (src/arm_core/queries.sql holds only what
# the runtime sends), as the tests call it.
DEAD_LETTER_UNPUBLISHABLE = """
SELECT job_id, attempt, file_id
FROM arm.dead_letter_unpublishable(%(job_ids)s::uuid[], %(error_codes)s::text[],
                                   %(error_messages)s::text[])
"""


def claim_params(
    limit: int,
    max_bytes: int = 1 << 20,
    tabular_timeout: float = 600,
    image_timeout: float = 1800,
    tabular_subject: str = "files.tabular_uploaded",
    image_subject: str = "files.img_uploaded",
) -> dict[str, Any]:
    """The publisher's claim's parameters (unpaced), with the tests' defaults."""
    return publish_params(
        limit=limit,
        tabular_timeout=tabular_timeout,
        image_timeout=image_timeout,
        tabular_subject=tabular_subject,
        image_subject=image_subject,
        max_bytes=max_bytes,
    )


def publish(
    conn: Conn,
    limit: int = 1000,
    tabular_timeout: float = 600,
    image_timeout: float = 1800,
    tabular_subject: str = "files.tabular_uploaded",
    image_subject: str = "files.img_uploaded",
) -> list[dict[str, Any]]:
    """What the publisher does, minus NATS: its statement (arm.publish_queued_jobs_v2,
    unpaced), committed. No request is too large here (every job is published), and each
    row's `request` is the request as a dict."""
    params = claim_params(
        limit, 2**31 - 1, tabular_timeout, image_timeout, tabular_subject, image_subject
    )
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("publish_queued_jobs"), params).fetchall()
    assert {r["outcome"] for r in rows} <= {"published"}, rows
    return [{**r, "request": json.loads(r["request"])} for r in rows]


def publish_open(conn: Conn, limit: int = 10, max_bytes: int = 1 << 20) -> list[dict[str, Any]]:
    """What the bridge's publisher does before it commits: arm.publish_queued_jobs_v2 in
    the connection's open transaction (autocommit off). The caller commits or rolls back."""
    assert not conn.autocommit, "publish_open needs an open transaction"
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("publish_queued_jobs"), claim_params(limit, max_bytes)).fetchall()


def apply_envelopes(conn: Conn, envelopes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inbox's statement (arm.apply_envelopes_v2) on a batch of envelopes: one row per
    envelope (ord, outcome, attempt, status, wait_seconds)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("apply_envelopes"), {"envelopes": Jsonb(envelopes)}).fetchall()


def _apply_one(conn: Conn, envelope: dict[str, Any]) -> dict[str, Any]:
    """One envelope, as the bridge applies it: again while it is `busy` (another
    transaction holds its job), until that transaction is over."""
    rows: list[dict[str, Any]] = []

    def through() -> bool:
        rows[:] = apply_envelopes(conn, [envelope])
        return bool(rows[0]["outcome"] != "busy")

    wait_for_sync(through, 10, f"job {envelope['job_id']} is held by another transaction")
    return {key: rows[0][key] for key in ("outcome", "attempt", "status")}


def ack(
    conn: Conn,
    job_id: uuid.UUID,
    file_id: uuid.UUID,
    service: str = "tabular-parser",
    version: str = "1.4.2",
) -> dict[str, Any]:
    """An ack through the inbox's statement, as the bridge applies one."""
    return _apply_one(
        conn,
        {
            "job_id": str(job_id),
            "file_id": str(file_id),
            "msg_id": f"ack:{job_id}",
            "status": "processing",
            "service_name": service,
            "service_version": version,
        },
    )


def result(
    conn: Conn,
    job_id: uuid.UUID,
    file_id: uuid.UUID,
    status: str = "done",
    msg_id: str | None = None,
    attempt: int = 1,
    service: str = "tabular-parser",
    error: tuple[str, str] | None = None,
    result_s3: tuple[str, str] | None = None,
    metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A result through the inbox's statement, as the bridge applies one."""
    if status in ("done", "needs_check") and result_s3 is None:
        result_s3 = ("arm-ka", f"results/{file_id}/{job_id}/result.json")
    return _apply_one(
        conn,
        {
            "job_id": str(job_id),
            "file_id": str(file_id),
            "msg_id": msg_id or f"result:{job_id}:{attempt}",
            "status": status,
            "service_name": service,
            "service_version": "1.4.2",
            "result_bucket": result_s3[0] if result_s3 else None,
            "result_key": result_s3[1] if result_s3 else None,
            "result_schema_version": "1.0" if status in ("done", "needs_check") else None,
            "error_code": error[0] if error else None,
            "error_message": error[1] if error else None,
            "metrics": metrics,
        },
    )


def retry(
    conn: Conn,
    file_id: uuid.UUID,
    actor: str = "operator",
    expected_job_id: uuid.UUID | None = None,
    actor_level: str | None = "operator",
) -> dict[str, Any]:
    """arm.retry_file_v3 as the API calls it: when the file's current job is still
    `expected_job_id` (None: whichever), for an actor retrying with `actor_level`
    (what the audit records beside the actor; None: none, as a DBA's SQL)."""
    params = {
        "file_id": file_id,
        "actor": actor,
        "expected_job_id": expected_job_id,
        "actor_level": actor_level,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("retry_file"), params).fetchone()
    assert row is not None
    return row


def one_row(conn: Conn, sql: str, params: tuple[Any, ...] = ()) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(sql, params).fetchone()
    assert row is not None, sql
    return row


def scalar(conn: Conn, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def fail_by_timeout(conn: Conn, up: Upload) -> None:
    """Drives an upload's current job to `timeout` through the functions."""
    publish(conn, tabular_timeout=0, image_timeout=0)
    swept = scalar(conn, "SELECT arm.sweep_timeouts()")
    assert swept >= 1


def fail_by_no_ack(conn: Conn) -> None:
    """Dead-letters every published job at once (ack timeout 0, no republish)."""
    conn.execute(query("dead_letter_unacked"), {"ack_timeout": 0, "max_republish": 0})


def sample(conn: Conn, ago: float = 0.0) -> None:
    """A sample of the schedule's task (arm.sample_status()), moved `ago` seconds back:
    samples are a minute apart, and a test moves them rather than wait."""
    conn.execute("SELECT arm.sample_status()")
    conn.execute(
        "UPDATE arm.status_sample SET sampled_at = sampled_at - make_interval(secs => %s) "
        "WHERE sampled_at = (SELECT max(sampled_at) FROM arm.status_sample)",
        (ago,),
    )


def age(conn: Conn, file_id: uuid.UUID, days: int) -> None:
    """Moves a file's history `days` back, as time would (the touch and guard triggers
    would stamp now() on the way)."""
    conn.execute("ALTER TABLE arm.stored_file DISABLE TRIGGER USER")
    conn.execute("ALTER TABLE arm.recognition_job DISABLE TRIGGER USER")
    back = f"{days} days"
    conn.execute(
        "UPDATE arm.stored_file SET created_at = created_at - %s::interval, "
        "updated_at = updated_at - %s::interval WHERE id = %s",
        (back, back, file_id),
    )
    conn.execute(
        "UPDATE arm.recognition_job SET requested_at = requested_at - %s::interval, "
        "finished_at = finished_at - %s::interval WHERE file_id = %s",
        (back, back, file_id),
    )
    conn.execute(
        "UPDATE arm.retry_audit SET retried_at = retried_at - %s::interval WHERE file_id = %s",
        (back, file_id),
    )
    conn.execute("ALTER TABLE arm.recognition_job ENABLE TRIGGER USER")
    conn.execute("ALTER TABLE arm.stored_file ENABLE TRIGGER USER")


def archive(conn: Conn, days: int = 30, limit: int = 1000) -> dict[str, Any]:
    return one_row(
        conn,
        "SELECT * FROM arm.archive_files(now() - %s::interval, %s)",
        (f"{days} days", limit),
    )
