"""An upgrade from the previous release (tests/fixtures/previous_release, the wheel of its
commit): a database created by that release's own `arm-core migrate`, holding jobs in
every state written through that release's own queries, is migrated to this tree. The
migration succeeds, no row changes, the schema is db/schema.sql (owners and grants
included), and the previous release's named queries — what its bridges and API send,
each as the login of its role — still prepare with the same result columns and still do
their work: during a rolling deploy `arm-core migrate` runs first, while the previous
release's processes are still running (docs/upgrading.md). tests/e2e/test_rolling_deploy.py
runs those processes themselves."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from arm_core.db import query
from arm_core.devtools.schema_snapshot import overloads
from arm_core.devtools.testbed.sql import (
    API_LOGIN,
    BRIDGE_LOGIN,
    UPLOADER_LOGIN,
    Login,
    as_login,
    dict_conn,
    ensure_logins,
    scalar,
)
from arm_core.devtools.testbed.sql import upload as new_upload
from arm_core.migrate import SQL_DIR, ensure_roles, migrate
from tests.integration.test_roles import (
    assert_functions_owned_pinned_and_granted,
    assert_table_privileges,
)
from tests.integration.test_schema_snapshot import assert_matches_snapshot
from tests.support.previous_release import migrate as migrate_previous
from tests.support.previous_release import names, read, unpacked

pytestmark = pytest.mark.integration

TABLES = ("setting", "periodic_task", "s3_object", "stored_file", "recognition_job", "retry_audit")
DictConn = psycopg.Connection[dict[str, Any]]


# --- the previous release, installed by its own `arm-core migrate` ------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's wheel, unpacked: its `arm-core` runs from here."""
    return unpacked(tmp_path_factory.mktemp("previous_release"))


def _migration_ids(files: list[str]) -> list[str]:
    stems = (Path(f).stem for f in files if f.endswith(".sql"))
    return sorted(s for s in stems if not s.endswith(".rollback"))


NEW_MIGRATIONS = _migration_ids([p.name for p in (SQL_DIR / "migrations").glob("*.sql")])
OLD_MIGRATIONS = _migration_ids(names("arm_core/sql/migrations/"))


_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PARAM = re.compile(r"%\((\w+)\)s")


def previous_queries() -> dict[str, str]:
    """The named queries of the previous release's arm_core/queries.sql."""
    chunks = _NAME.split(read("arm_core/queries.sql"))
    found = {name: body.strip() for name, body in zip(chunks[1::2], chunks[2::2], strict=True)}
    assert found, "the previous release's arm_core/queries.sql holds no named queries"
    return found


OLD = previous_queries()
# What the previous release's `serve` sends as the login of arm_api, and its `migrate` as
# the migrating login (the URL's user); its bridges send the rest as arm_bridge's login.
API_QUERIES = frozenset(
    {"retry_file", "retry_files", "get_file", "list_files", "status_view", "status_series"}
)
MIGRATE_QUERIES = frozenset({"set_setting"})


class OldBridge:
    """Sends the previous release's queries, each as the login its process uses (`serve`'s
    as arm_api's, `migrate`'s as the URL's user, the bridges' as arm_bridge's), and
    records which. `conn` is the URL's user's, also for what upstream and a DBA do."""

    def __init__(self, conn: DictConn, bridge: DictConn, api: DictConn) -> None:
        self.conn, self.bridge_conn, self.api_conn = conn, bridge, api
        self.sent: set[str] = set()

    def __call__(self, query: str, /, **params: Any) -> list[dict[str, Any]]:
        self.sent.add(query)
        conn = (
            self.api_conn
            if query in API_QUERIES
            else self.conn
            if query in MIGRATE_QUERIES
            else self.bridge_conn
        )
        try:
            return conn.execute(OLD[query], params).fetchall()
        except psycopg.Error as exc:
            raise AssertionError(
                f"the previous release's query {query!r} fails here: {exc}\n{OLD[query]}"
            ) from exc


@contextmanager
def old_bridge(url: str, as_roles: bool = True) -> Iterator[OldBridge]:
    """`as_roles=False`: every query as the URL's own user (a deployment whose processes
    ran as one login)."""
    ensure_logins(url)
    bridge_url = as_login(url, BRIDGE_LOGIN) if as_roles else url
    api_url = as_login(url, API_LOGIN) if as_roles else url
    with (
        psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn,
        psycopg.connect(bridge_url, autocommit=True, row_factory=dict_row) as bridge,
        psycopg.connect(api_url, autocommit=True, row_factory=dict_row) as api,
    ):
        yield OldBridge(conn, bridge, api)


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
    """The plain-SQL upload the previous release documents for upstream: INSERTs of
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


def publish(bridge: OldBridge, reply_seconds: float = 600) -> list[uuid.UUID]:
    """The previous release's publisher: claim and mark published in one call (the
    sending is the bridge's). A negative `reply_seconds`: a deadline already past."""
    sent = bridge(
        "publish_queued_jobs_v2",
        limit=100,
        tabular_timeout=reply_seconds,
        image_timeout=reply_seconds,
        tabular_subject="files.tabular_uploaded",
        image_subject="files.img_uploaded",
        max_bytes=1 << 20,
    )
    assert {row["outcome"] for row in sent} <= {"published"}, sent
    return [row["job_id"] for row in sent]


def envelope(up: Upload, status: str) -> dict[str, Any]:
    """An answer as the previous release's inbox hands it to apply_envelopes_v2."""
    done = status in ("done", "needs_check")
    failed = status == "error"
    return {
        "job_id": str(up.job_id),
        "file_id": str(up.file_id),
        "msg_id": f"ack:{up.job_id}:1" if status == "processing" else f"result:{up.job_id}",
        "status": status,
        "service_name": "tabular-parser",
        "service_version": "1.0",
        "result_bucket": "arm-results" if done else None,
        "result_key": f"results/{up.job_id}/result.json" if done else None,
        "result_schema_version": "1.0" if done else None,
        "error_code": "UNREADABLE" if failed else None,
        "error_message": "not a spreadsheet" if failed else None,
        "metrics": {"rows": 3} if done else None,
    }


def apply(bridge: OldBridge, *answers: tuple[Upload, str]) -> list[str]:
    rows = bridge("apply_envelopes_v2", envelopes=Jsonb([envelope(u, s) for u, s in answers]))
    return [str(row["outcome"]) for row in rows]


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


def swept(bridge: OldBridge) -> list[tuple[str, str, str | None]]:
    ran = bridge("run_due_tasks")
    return [(r["task"], r["result"], r["error"]) for r in ran if r["task"] == "sweep_timeouts"]


def previous_release_with_data(url: str, site: Path, as_roles: bool = True) -> dict[str, Upload]:
    """The previous release installed, with jobs in every state its bridges, API and
    schedule reach, all written through its own queries (uploads as plain SQL)."""
    migrate_previous(url, site)
    ups: dict[str, Upload] = {}
    with old_bridge(url, as_roles) as bridge:
        conn = bridge.conn
        ups["dlq"] = upload(conn)
        assert publish(bridge) == [ups["dlq"].job_id]
        dead = bridge("dead_letter_unacked", ack_timeout=0, max_republish=0)
        assert [row["job_id"] for row in dead] == [ups["dlq"].job_id]

        ups["timeout"] = upload(conn)
        assert publish(bridge, reply_seconds=-1) == [ups["timeout"].job_id]
        assert swept(bridge) == [("sweep_timeouts", "1", None)]
        # Past its deadline, but the next sweep is not due yet.
        ups["overdue"] = upload(conn)
        assert publish(bridge, reply_seconds=-1) == [ups["overdue"].job_id]

        for name in ("published", "processing", "done", "error"):
            ups[name] = upload(conn, "PDF" if name == "published" else "XLSX")
        assert len(publish(bridge)) == 4
        assert (
            apply(
                bridge,
                (ups["processing"], "processing"),
                (ups["done"], "processing"),
                (ups["done"], "done"),
                (ups["error"], "error"),
            )
            == ["applied"] * 4
        )
        ups["retried"] = retried(
            bridge("retry_file", file_id=ups["error"].file_id, actor="ops", expected_job_id=None)
        )
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


def rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row, as stored (retry_audit.actor_level, which 0015 adds, is NULL for every
    retry the previous release made, as the upgrade test checks; recognition_job.lane,
    which 0016 adds, is the file's consolidation, copied for the queued jobs, as
    assert_lanes_are_the_queue checks)."""
    with psycopg.connect(url) as conn:
        return {
            t: conn.execute(
                f"SELECT to_jsonb(x) - 'actor_level' - 'lane' FROM arm.{t} x ORDER BY 1"
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
    empty_db_url: str, site: Path
) -> None:
    previous_release_with_data(empty_db_url, site)
    before = rows(empty_db_url)

    report = migrate(empty_db_url)

    assert set(OLD_MIGRATIONS) < set(NEW_MIGRATIONS)
    assert report.applied_migrations == [m for m in NEW_MIGRATIONS if m not in OLD_MIGRATIONS]
    assert rows(empty_db_url) == before
    with dict_conn(empty_db_url) as conn:
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
    empty_db_url: str, site: Path
) -> None:
    """Every statement an older bridge sends still resolves (functions, argument types)
    and returns the columns, names and types, its code reads."""
    previous_release_with_data(empty_db_url, site)
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


def test_the_previous_release_bridges_keep_working_after_the_upgrade(
    empty_db_url: str, site: Path
) -> None:
    """A rolling deploy: migrate has run, the previous release's bridges and API are still
    up. They carry the jobs they left on (ack, result, republish, dead-letter, timeout,
    retry) and new uploads, with every query of their queries.sql, as their roles."""
    ups = previous_release_with_data(empty_db_url, site)
    migrate(empty_db_url)
    the_previous_release_keeps_working(empty_db_url, ups)
    assert_counts_are_real(empty_db_url)  # the old bridges' writes are counted too
    assert_lanes_are_the_queue(empty_db_url)


def test_after_the_upgrade_the_roles_grants_are_in_place_and_the_new_release_runs_under_them(
    empty_db_url: str, site: Path
) -> None:
    previous_release_with_data(empty_db_url, site)
    migrate(empty_db_url)
    with dict_conn(empty_db_url) as conn:
        assert_functions_owned_pinned_and_granted(conn)
        assert_table_privileges(conn)
    the_new_release_runs_under_its_roles(empty_db_url)


def test_a_deployment_that_migrates_as_an_owner_login_upgrades_and_keeps_its_processes(
    empty_db_url: str, site: Path
) -> None:
    """The previous release installed by an ordinary login that owns the database (no
    superuser, no CREATEROLE), a member of arm_owner as that release asked, and its
    processes run as that one login: this tree's migrate, by the same login, upgrades it
    with every row kept, and the old processes on that login keep working."""
    app = f"arm_app_{uuid.uuid4().hex[:8]}"
    dbname = empty_db_url.rsplit("/", 1)[1]
    with psycopg.connect(empty_db_url, autocommit=True) as admin:
        # Cluster-wide, and the app login may make neither: this may be the server's first
        # migrated database.
        ensure_roles(admin)
        admin.execute(f'CREATE ROLE "{app}" LOGIN')
        admin.execute(f'ALTER DATABASE "{dbname}" OWNER TO "{app}"')
        admin.execute(f'GRANT arm_owner TO "{app}"')
    ensure_logins(empty_db_url)
    app_url = as_login(empty_db_url, Login(app, ()))
    ups = previous_release_with_data(app_url, site, as_roles=False)
    before = rows(empty_db_url)

    migrate(app_url)
    assert rows(empty_db_url) == before
    assert_matches_snapshot(empty_db_url, "a database upgraded by its owner login")
    the_previous_release_keeps_working(app_url, ups, as_roles=False)
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


def the_previous_release_keeps_working(
    url: str, ups: dict[str, Upload], as_roles: bool = True
) -> None:
    """The previous release's bridges and API, after the upgrade: every query of its
    queries.sql."""
    with old_bridge(url, as_roles) as bridge:
        conn = bridge.conn
        # Jobs published by the previous release: acked, finished.
        assert (
            apply(
                bridge,
                (ups["published"], "processing"),
                (ups["published"], "error"),
                (ups["processing"], "needs_check"),
            )
            == ["applied"] * 3
        )
        # The schedule: the sweep (a DBA makes it due now) times the overdue job out.
        bridge("set_sweep_interval", seconds=30)
        conn.execute("UPDATE arm.periodic_task SET next_run_at = now()")
        assert swept(bridge) == [("sweep_timeouts", "1", None)]
        # Jobs queued before the upgrade and an upload after it go out.
        ups["new"] = upload(conn, "PNG")
        [age] = bridge("outbox_oldest_queued_age")
        assert age["age"] > 0
        assert set(publish(bridge)) == {
            ups["queued"].job_id,
            ups["retried"].job_id,
            ups["new"].job_id,
        }
        # No ack: one cannot be republished (dead-lettered as such), the other two are
        # republished once, then dead-lettered.
        with bridge.bridge_conn.transaction():
            claimed = bridge("claim_unacked_jobs", limit=100, ack_timeout=0, max_republish=1)
            ids = [row["job_id"] for row in claimed]
            assert len(ids) == 3
            assert all(row["request"]["attempt"] == row["attempt"] for row in claimed)
            [marked] = bridge("mark_republished", job_ids=ids[:2])
            assert marked["marked"] == 2
            gone = bridge(
                "dead_letter_unrepublishable",
                job_ids=ids[2:],
                error_codes=["PAYLOAD_TOO_LARGE"],
                error_messages=["larger than the server's max_payload"],
            )
            assert [row["job_id"] for row in gone] == ids[2:]
        dead = bridge("dead_letter_unacked", ack_timeout=0, max_republish=1)
        assert {row["job_id"] for row in dead} == set(ids[:2])
        # The API's retries and reads.
        again = retried(
            bridge("retry_file", file_id=ups["new"].file_id, actor="ops", expected_job_id=None)
        )
        assert again.job_id != ups["new"].job_id
        many = bridge(
            "retry_files",
            file_ids=[ups["dlq"].file_id, ups["done"].file_id],
            actor="ops",
            expected_job_ids=None,
        )
        assert {r["file_id"]: r["outcome"] for r in many} == {
            ups["dlq"].file_id: "retried",
            ups["done"].file_id: "not_retryable",
        }
        [file] = bridge("get_file", file_id=ups["done"].file_id)
        assert file["file"]["file"]["id"] == str(ups["done"].file_id)
        listed = bridge(
            "list_files",
            limit=100,
            after_created_at=None,
            after_id=None,
            statuses=None,
            job_statuses=None,
            consolidation_id=None,
            file_types=None,
            q=None,
            updated_after=None,
            updated_before=None,
        )
        assert ups["done"].file_id in {row["id"] for row in listed}
        # The status, its series and what the bridges add to them.
        [view] = bridge("status_view", ack_timeout=30)
        assert view["jobs"] is not None
        bridge("record_waits", phase="queued", counts=[0] * 16 + [1])
        bridge("compact_counts")
        bridge("status_series", minutes=60)
        # What migrate sets.
        bridge("set_setting", name="default_max_attempts", value="3")

        assert status(conn, ups["published"]) == "error"
        assert status(conn, ups["processing"]) == "needs_check"
        assert status(conn, ups["overdue"]) == "timeout"
        assert bridge.sent == set(OLD), f"not exercised: {sorted(set(OLD) - bridge.sent)}"
