"""An upgrade from the previous release (tests/fixtures/previous_release): a database
created by that release's migrations and functions, holding jobs in every state written
through that release's own queries, is migrated to the current release. The migration
succeeds, no row changes, the schema is db/schema.sql (owners and grants included), and
the previous release's named queries — what its bridges send — still prepare with the
same result columns and still do their work: during a rolling deploy `arm-core migrate`
runs first, while bridges of the previous release are still running (db/README.md).

The previous release had no roles: everything ran as the user that owned the schema.
After the upgrade the roles' grants are in place and the new release runs under them,
while the old bridges, still connected as that user, keep working — as a superuser, and
as an ordinary owner login, which the DBA makes a member of arm_owner once."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from yoyo import get_backend, read_migrations

from arm_core.db import query
from arm_core.devtools.schema_snapshot import overloads
from arm_core.migrate import SQL_DIR, RolesMissing, migrate
from tests.integration.test_roles import (
    assert_functions_owned_pinned_and_granted,
    assert_table_privileges,
)
from tests.integration.test_schema_snapshot import assert_matches_snapshot
from tests.support.sql import (
    API_LOGIN,
    BRIDGE_LOGIN,
    UPLOADER_LOGIN,
    Login,
    as_login,
    dict_conn,
    ensure_logins,
    scalar,
)
from tests.support.sql import upload as new_upload

pytestmark = pytest.mark.integration

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
TABLES = ("setting", "periodic_task", "s3_object", "stored_file", "recognition_job", "retry_audit")
DictConn = psycopg.Connection[dict[str, Any]]


# --- the previous release, installed as its `arm-core migrate` installed it --------------


def _migration_ids(migrations_dir: Path) -> list[str]:
    return sorted(p.stem for p in migrations_dir.glob("*.sql") if ".rollback" not in p.name)


def install_previous_release(url: str) -> None:
    """yoyo applies the previous release's migrations, then its function files run in name
    order in one transaction: what that release's `arm-core migrate` did."""
    scheme, _, rest = url.partition("://")
    assert scheme in ("postgresql", "postgres")
    backend = get_backend(f"postgresql+psycopg://{rest}")
    try:
        with backend.lock():
            migrations = read_migrations(str(PREVIOUS / "db" / "migrations"))
            backend.apply_migrations(backend.to_apply(migrations))
    finally:
        backend.connection.close()
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for path in sorted((PREVIOUS / "db" / "functions").glob("*.sql")):
            conn.execute(path.read_text(encoding="utf-8"))


_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PARAM = re.compile(r"%\((\w+)\)s")


def previous_queries() -> dict[str, str]:
    """The named queries of the previous release's arm_core/queries.sql."""
    chunks = _NAME.split((PREVIOUS / "queries.sql").read_text(encoding="utf-8"))
    found = {name: body.strip() for name, body in zip(chunks[1::2], chunks[2::2], strict=True)}
    assert found, "tests/fixtures/previous_release/queries.sql holds no named queries"
    return found


OLD = previous_queries()


class OldBridge:
    """Sends the previous release's queries, as its bridges and API do, and records which."""

    def __init__(self, conn: DictConn) -> None:
        self.conn = conn
        self.sent: set[str] = set()

    def __call__(self, query: str, /, **params: Any) -> list[dict[str, Any]]:
        self.sent.add(query)
        try:
            return self.conn.execute(OLD[query], params).fetchall()
        except psycopg.Error as exc:
            raise AssertionError(
                f"the previous release's query {query!r} fails here: {exc}\n{OLD[query]}"
            ) from exc


@contextmanager
def old_bridge(url: str) -> Iterator[OldBridge]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        yield OldBridge(conn)


def describe(conn: DictConn, text: str) -> list[tuple[str, str]] | str:
    """Prepares a named query (an unnamed statement; nothing runs) and returns its result
    columns, name and type, as a bridge's driver sees them — or, when it does not prepare
    (a function gone, its arguments changed), the server's error."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    pgconn = conn.pgconn
    prepared = pgconn.prepare(b"", _PARAM.sub(number, text).encode())
    if prepared.status != psycopg.pq.ExecStatus.COMMAND_OK:
        return "does not prepare: " + (prepared.error_message or b"").decode().strip()
    result = pgconn.describe_prepared(b"")
    oids = [result.ftype(i) for i in range(result.nfields)]
    types = {
        row["oid"]: row["name"]
        for row in conn.execute(
            "SELECT t.oid::int8 AS oid, t.oid::regtype::text AS name "
            "FROM unnest(%s::oid[]) AS t(oid)",
            (oids,),
        )
    }
    return [((result.fname(i) or b"").decode(), types[oid]) for i, oid in enumerate(oids)]


# --- data of every state, written by the previous release ---------------------------------


@dataclass(frozen=True)
class Upload:
    file_id: uuid.UUID
    job_id: uuid.UUID


def upload(conn: DictConn, file_type: str = "XLSX") -> Upload:
    """An upload as the previous release's README has upstream make it: plain INSERTs of
    s3_object, stored_file and a queued job, then the file's current job."""
    pipeline = "image" if file_type in ("PDF", "PNG", "JPG") else "tabular"
    with conn.transaction():
        name = f"ОСВ {uuid.uuid4().hex[:6]}.{file_type.lower()}"
        obj = conn.execute(
            "INSERT INTO arm.s3_object (bucket, key, bucket_role, created_by) "
            "VALUES ('arm-ka', %s, 'uploads', 'upload-service') RETURNING id",
            (f"uploads/{uuid.uuid4()}/{name}",),
        ).fetchone()
        assert obj is not None
        file = conn.execute(
            "INSERT INTO arm.stored_file (consolidation_id, original_name, file_type, "
            "s3_object_id) VALUES (%s, %s, %s, %s) RETURNING id",
            (uuid.uuid4(), name, file_type, obj["id"]),
        ).fetchone()
        assert file is not None
        job = conn.execute(
            "INSERT INTO arm.recognition_job (file_id, pipeline, attempt) "
            "VALUES (%s, %s, 1) RETURNING id",
            (file["id"], pipeline),
        ).fetchone()
        assert job is not None
        conn.execute(
            "UPDATE arm.stored_file SET current_recognition_job_id = %s WHERE id = %s",
            (job["id"], file["id"]),
        )
    return Upload(file_id=file["id"], job_id=job["id"])


def publish(bridge: OldBridge, deadline: timedelta = timedelta(minutes=10)) -> list[uuid.UUID]:
    """The previous release's publisher: claim, (send), mark published, in one transaction."""
    with bridge.conn.transaction():
        claimed = bridge("claim_queued_jobs", limit=100, tabular_timeout=600, image_timeout=1800)
        ids = [row["job_id"] for row in claimed]
        subjects = [
            "files.img_uploaded" if row["pipeline"] == "image" else "files.tabular_uploaded"
            for row in claimed
        ]
        deadlines = [datetime.now(UTC) + deadline] * len(ids)
        [marked] = bridge(
            "mark_published", job_ids=ids, subjects=subjects, reply_deadlines=deadlines
        )
        assert marked["marked"] == len(ids)
    return ids


def ack(bridge: OldBridge, up: Upload) -> str:
    [row] = bridge(
        "apply_ack",
        job_id=up.job_id,
        file_id=up.file_id,
        service_name="tabular-parser",
        service_version="1.0",
    )
    return str(row["outcome"])


def result(bridge: OldBridge, up: Upload, status: str) -> str:
    done = status in ("done", "needs_check")
    [row] = bridge(
        "apply_result",
        job_id=up.job_id,
        file_id=up.file_id,
        msg_id=f"result:{up.job_id}",
        status=status,
        service_name="tabular-parser",
        service_version="1.0",
        result_bucket="arm-results" if done else None,
        result_key=f"results/{up.job_id}/result.json" if done else None,
        result_schema_version="1.0" if done else None,
        error_code=None if done else "UNREADABLE",
        error_message=None if done else "not a spreadsheet",
        metrics=Jsonb({"rows": 3}) if done else None,
    )
    return str(row["outcome"])


def retried(rows: list[dict[str, Any]]) -> Upload:
    [row] = rows
    assert row["outcome"] == "retried", row
    return Upload(file_id=row["file_id"], job_id=row["job_id"])


def status(conn: DictConn, up: Upload) -> str:
    row = conn.execute(
        "SELECT status::text AS status FROM arm.recognition_job WHERE id = %s", (up.job_id,)
    ).fetchone()
    assert row is not None
    return str(row["status"])


def previous_release_with_data(url: str) -> dict[str, Upload]:
    """The previous release installed, with jobs in every state its bridges, API and
    schedule reach, all written through its own queries (uploads as plain SQL)."""
    install_previous_release(url)
    ups: dict[str, Upload] = {}
    with old_bridge(url) as bridge:
        conn = bridge.conn
        ups["dlq"] = upload(conn)
        assert publish(bridge) == [ups["dlq"].job_id]
        dead = bridge("dead_letter_unacked", ack_timeout=0, max_republish=0)
        assert [row["job_id"] for row in dead] == [ups["dlq"].job_id]

        ups["timeout"] = upload(conn)
        assert publish(bridge, deadline=timedelta(seconds=-1)) == [ups["timeout"].job_id]
        ran = bridge("run_due_tasks")
        assert [
            (r["task"], r["result"], r["error"]) for r in ran if r["task"] != "sample_status"
        ] == [("sweep_timeouts", "1", None)]
        # Past its deadline, but the next sweep is not due yet.
        ups["overdue"] = upload(conn)
        assert publish(bridge, deadline=timedelta(seconds=-1)) == [ups["overdue"].job_id]

        for name in ("published", "processing", "done", "error"):
            ups[name] = upload(conn, "PDF" if name == "published" else "XLSX")
        assert len(publish(bridge)) == 4
        assert ack(bridge, ups["processing"]) == "applied"
        assert ack(bridge, ups["done"]) == "applied"
        assert result(bridge, ups["done"], "done") == "applied"
        assert result(bridge, ups["error"], "error") == "applied"
        ups["retried"] = retried(bridge("retry_file", file_id=ups["error"].file_id, actor="ops"))
        ups["queued"] = upload(conn)

        assert {name: status(conn, up) for name, up in ups.items()} == {
            "dlq": "dlq",
            "timeout": "timeout",
            "overdue": "published",
            "published": "published",
            "processing": "processing",
            "done": "done",
            "error": "error",
            "retried": "queued",
            "queued": "queued",
        }
    return ups


# The periodic task an upgrade adds: the samples of the console's charts (0010).
ADDED = "sample_status"


def rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row, as stored (stored_file.failed, which migration 0008 adds, is derived
    from status: not data of its own; retry_audit.actor_level, which 0015 adds, is NULL
    for every retry the previous release made, as the upgrade test checks;
    recognition_job.lane, which 0016 adds, is the file's consolidation, copied for the
    queued jobs, as assert_lanes_are_the_queue checks), but the periodic task the upgrade
    adds."""
    with psycopg.connect(url) as conn:
        return {
            t: conn.execute(
                f"SELECT to_jsonb(x) - 'failed' - 'actor_level' - 'lane' FROM arm.{t} x "
                "WHERE to_jsonb(x) ->> 'name' IS DISTINCT FROM %s ORDER BY 1",
                (ADDED,),
            ).fetchall()
            for t in TABLES
        }


def assert_lanes_are_the_queue(url: str) -> None:
    """Every queued job is in its file's lane (its consolidation, the nil uuid for none),
    and arm.pace_lane has each lane of the queue."""
    with dict_conn(url) as conn:
        assert (
            scalar(
                conn,
                "SELECT count(*) FROM arm.recognition_job j JOIN arm.stored_file f "
                "ON f.id = j.file_id WHERE j.status = 'queued' AND j.lane IS DISTINCT FROM "
                "coalesce(f.consolidation_id, '00000000-0000-0000-0000-000000000000')",
            )
            == 0
        )
        queue = conn.execute(
            "SELECT DISTINCT pipeline::text, lane FROM arm.recognition_job "
            "WHERE status = 'queued' ORDER BY 1, 2"
        ).fetchall()
        lanes = conn.execute("SELECT pipeline::text, lane FROM arm.pace_lane ORDER BY 1, 2")
        assert set(map(tuple, queue)) <= set(map(tuple, lanes.fetchall())) and queue


def assert_counts_are_real(url: str) -> None:
    """arm.job_counts() and arm.file_counts() (the count triggers and the counts the
    upgrade took) equal COUNT(*) per status."""
    with dict_conn(url) as conn:
        for function, table, enum in (
            ("job_counts", "recognition_job", "job_status"),
            ("file_counts", "stored_file", "file_status"),
        ):
            counted = conn.execute(f"SELECT status, n FROM arm.{function}()").fetchall()
            real = conn.execute(
                f"SELECT s::text AS status, "
                f"(SELECT count(*) FROM arm.{table} t WHERE t.status = s) AS n "
                f"FROM unnest(enum_range(NULL::arm.{enum})) AS s"
            ).fetchall()
            assert {r["status"]: r["n"] for r in counted} == {r["status"]: r["n"] for r in real}


def result_columns(url: str) -> dict[str, list[tuple[str, str]] | str]:
    with old_bridge(url) as bridge:
        return {name: describe(bridge.conn, text) for name, text in OLD.items()}


# --- the tests ---------------------------------------------------------------------------


def test_the_previous_release_upgrades_with_its_data_intact_to_db_schema_sql(
    empty_db_url: str,
) -> None:
    previous_release_with_data(empty_db_url)
    before = rows(empty_db_url)

    report = migrate(empty_db_url)

    new = _migration_ids(SQL_DIR / "migrations")
    old = _migration_ids(PREVIOUS / "db" / "migrations")
    assert report.applied_migrations == [m for m in new if m not in old]
    assert rows(empty_db_url) == before
    with dict_conn(empty_db_url) as conn:  # the row it adds (rows() leaves it out)
        assert scalar(conn, "SELECT count(*) FROM arm.periodic_task WHERE name = %s", (ADDED,)) == 1
        # The previous release's retries record no level (rows() leaves the column out).
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit WHERE actor_level IS NULL") == (
            len(before["retry_audit"])
        )
    assert_counts_are_real(empty_db_url)  # counted from the rows the upgrade found
    assert_lanes_are_the_queue(empty_db_url)
    # A parameter added in place shows only here: a fresh database never had the old one.
    found = overloads(empty_db_url)
    assert not found, (
        f"the upgrade left overloaded functions: {found}; a changed signature needs a new "
        "name (arm.x_v2), db/README.md"
    )
    assert_matches_snapshot(empty_db_url, "the previous release's database after migrate")


def test_the_previous_release_queries_prepare_with_the_same_columns_after_the_upgrade(
    empty_db_url: str,
) -> None:
    """Every statement an older bridge sends still resolves (functions, argument types)
    and returns the columns, names and types, its code reads."""
    previous_release_with_data(empty_db_url)
    before = result_columns(empty_db_url)
    assert not [v for v in before.values() if isinstance(v, str)], before
    migrate(empty_db_url)
    after = result_columns(empty_db_url)
    changed = [
        f"{name}:\n  before: {before[name]}\n  after:  {after[name]}"
        for name in OLD
        if before[name] != after[name]
    ]
    assert not changed, (
        "queries of the previous release that its bridges can no longer run as they did "
        "(a rolling deploy needs the old function names and result columns to stay until "
        "the release after next, db/README.md):\n" + "\n".join(changed)
    )


def test_the_previous_release_bridges_keep_working_after_the_upgrade(empty_db_url: str) -> None:
    """A rolling deploy: migrate has run, bridges of the previous release are still up.
    They carry the jobs they left on (ack, result, republish, dead-letter, timeout, retry)
    and new uploads, with every query of their queries.sql."""
    ups = previous_release_with_data(empty_db_url)
    migrate(empty_db_url)
    the_previous_release_keeps_working(empty_db_url, ups)
    assert_counts_are_real(empty_db_url)  # the old bridges' writes are counted too
    assert_lanes_are_the_queue(empty_db_url)


def test_after_the_upgrade_the_roles_grants_are_in_place_and_the_new_release_runs_under_them(
    empty_db_url: str,
) -> None:
    previous_release_with_data(empty_db_url)
    migrate(empty_db_url)
    with dict_conn(empty_db_url) as conn:
        assert_functions_owned_pinned_and_granted(conn)
        assert_table_privileges(conn)
    the_new_release_runs_under_its_roles(empty_db_url)


def test_a_deployment_that_ran_as_the_schema_owner_keeps_its_old_bridges_through_the_upgrade(
    empty_db_url: str,
) -> None:
    """The previous release installed and run by one ordinary login that owns the
    database (no superuser, no CREATEROLE) — what the issue calls every deployment. Its
    migrate stops, changing nothing, until the DBA's one GRANT; then it migrates, the old
    bridges on that login keep working through the membership, and the new release runs
    under the roles."""
    app = f"arm_app_{uuid.uuid4().hex[:8]}"
    dbname = empty_db_url.rsplit("/", 1)[1]
    with psycopg.connect(empty_db_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{app}" LOGIN')
        admin.execute(f'ALTER DATABASE "{dbname}" OWNER TO "{app}"')
    app_url = as_login(empty_db_url, Login(app, ()))
    ups = previous_release_with_data(app_url)
    before = rows(empty_db_url)

    with pytest.raises(RolesMissing) as refused:
        migrate(app_url)
    assert rows(empty_db_url) == before
    with psycopg.connect(empty_db_url, autocommit=True) as dba:
        assert dba.execute(
            "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'arm'"
        ).fetchone() == (app,)
        dba.execute(refused.value.sql)  # GRANT arm_owner TO <app>, once

    migrate(app_url)
    assert rows(empty_db_url) == before
    assert_matches_snapshot(empty_db_url, "a database upgraded by its owner login")
    the_previous_release_keeps_working(app_url, ups)
    the_new_release_runs_under_its_roles(empty_db_url)


def the_new_release_runs_under_its_roles(url: str) -> None:
    """The current release on an upgraded database: an upload as the uploader, published
    and answered as the bridge, retried and read as the API."""
    ensure_logins(url)  # a test of empty databases may be the session's first
    with dict_conn(as_login(url, UPLOADER_LOGIN)) as uploader:
        up = new_upload(uploader)
    with dict_conn(as_login(url, BRIDGE_LOGIN)) as bridge:
        with bridge.transaction():
            sent = bridge.execute(
                query("publish_queued_jobs"),
                {
                    "limit": 100,
                    "tabular_timeout": 600,
                    "image_timeout": 1800,
                    "tabular_subject": "files.tabular_uploaded",
                    "image_subject": "files.img_uploaded",
                    "max_bytes": 1 << 20,
                },
            ).fetchall()
        assert up.job_id in {row["job_id"] for row in sent}
        answer = {
            "job_id": str(up.job_id),
            "file_id": str(up.file_id),
            "status": "error",
            "msg_id": f"result:{up.job_id}",
            "service_name": "tabular-parser",
            "error_code": "UNREADABLE",
        }
        [applied] = bridge.execute(query("apply_envelopes"), {"envelopes": Jsonb([answer])})
        assert applied["outcome"] == "applied"
        bridge.execute(query("set_sweep_interval"), {"seconds": 30})
        bridge.execute(query("run_due_tasks")).fetchall()
    with dict_conn(as_login(url, API_LOGIN)) as api:
        [retried] = api.execute(
            query("retry_file"),
            {
                "file_id": up.file_id,
                "actor": "ops",
                "expected_job_id": None,
                "actor_level": "operator",
            },
        )
        assert retried["outcome"] == "retried"
        document = api.execute(query("get_file"), {"file_id": up.file_id}).fetchone()
        assert document is not None and len(document["file"]["attempts"]) == 2
        assert [r["actor_level"] for r in document["file"]["retries"]] == ["operator"]


def the_previous_release_keeps_working(url: str, ups: dict[str, Upload]) -> None:
    """The previous release's bridges, connected as `url`'s user, after the upgrade."""
    with old_bridge(url) as bridge:
        conn = bridge.conn
        # Jobs published by the previous release: acked, finished.
        assert ack(bridge, ups["published"]) == "applied"
        assert result(bridge, ups["published"], "error") == "applied"
        assert result(bridge, ups["processing"], "needs_check") == "applied"
        # The schedule: the sweep (a DBA makes it due now) times the overdue job out.
        bridge("set_sweep_interval", seconds=30)
        conn.execute("UPDATE arm.periodic_task SET next_run_at = now()")
        ran = bridge("run_due_tasks")
        assert [
            (r["task"], r["result"], r["error"]) for r in ran if r["task"] != "sample_status"
        ] == [("sweep_timeouts", "1", None)]
        # Jobs queued before the upgrade and an upload after it go out.
        ups["new"] = upload(conn, "PNG")
        assert set(publish(bridge)) == {
            ups["queued"].job_id,
            ups["retried"].job_id,
            ups["new"].job_id,
        }
        # No ack: republished once, then dead-lettered.
        with conn.transaction():
            claimed = bridge("claim_unacked_jobs", limit=100, ack_timeout=0, max_republish=1)
            ids = [row["job_id"] for row in claimed]
            assert len(ids) == 3
            assert all(row["request"]["attempt"] == row["attempt"] for row in claimed)
            [marked] = bridge("mark_republished", job_ids=ids)
            assert marked["marked"] == 3
        dead = bridge("dead_letter_unacked", ack_timeout=0, max_republish=1)
        assert {row["job_id"] for row in dead} == set(ids)
        # The API's retries and reads.
        again = retried(bridge("retry_file", file_id=ups["new"].file_id, actor="ops"))
        assert again.job_id != ups["new"].job_id
        many = bridge(
            "retry_files", file_ids=[ups["dlq"].file_id, ups["done"].file_id], actor="ops"
        )
        assert {r["file_id"]: r["outcome"] for r in many} == {
            ups["dlq"].file_id: "retried",
            ups["done"].file_id: "not_retryable",
        }
        [file] = bridge("get_file", file_id=ups["done"].file_id)
        assert file["file"]["file"]["id"] == str(ups["done"].file_id)
        # Settings and the health check.
        bridge("set_setting", name="default_max_attempts", value="3")
        assert bridge("ping") == [{"ok": 1}]

        assert status(conn, ups["published"]) == "error"
        assert status(conn, ups["processing"]) == "needs_check"
        assert status(conn, ups["overdue"]) == "timeout"
        assert bridge.sent == set(OLD), f"not exercised: {sorted(set(OLD) - bridge.sent)}"
