"""Database roles (docs/dbas.md "Database roles"; db/roles.sql, db/grants.sql).

Both halves, for a login member of each role: everything the role must do works, and
everything else fails — a direct write to a table, an INSERT into arm.periodic_task, a
function of another role, and a search_path hijack (the caller's own schema, with
look-alike functions and operators, placed first). The bridge and API suites run under
their roles too (tests/support); the tests here check that they do.

And `arm-core migrate` itself: it creates the roles, is safe against a migrate of another
database creating them at the same time, and, where the migrating user may not create
roles or is not a member of arm_owner, changes nothing and prints the SQL a DBA runs once.
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from arm_core.db import query
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres, find_pg_bindir
from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.devtools.testbed.processes import ARM_CORE, runtime_env
from arm_core.devtools.testbed.sql import (
    API_LOGIN,
    BRIDGE_LOGIN,
    OWNER_LOGIN,
    READONLY_LOGIN,
    SERVE_LOGIN,
    UPLOADER_LOGIN,
    Conn,
    Login,
    as_login,
    dict_conn,
    fail_by_timeout,
    job,
    publish,
    scalar,
    stored_file,
    upload,
    upload_file,
)
from arm_core.http.keys import STORE
from arm_core.migrate import ROLES, SQL_DIR, RolesMissing, apply_functions, migrate
from tests.support.api import api_settings, running_api
from tests.support.bridge import fast_settings, running_bridge

pytestmark = pytest.mark.integration

# Who may call which function of schema arm, besides its owner: the same table as
# db/grants.sql (change both together; test_every_function_is_owned_pinned_and_granted
# fails until they agree).
CALLERS: dict[str, set[str]] = {
    "publish_queued_jobs_v2": {"arm_bridge"},
    "publish_queued_jobs_v3": {"arm_bridge"},
    "pace_unheard": {"arm_bridge"},
    "claim_unacked_jobs": {"arm_bridge"},
    "mark_republished": {"arm_bridge"},
    "dead_letter_unacked": {"arm_bridge"},
    "dead_letter_unrepublishable": {"arm_bridge"},
    "apply_envelopes_v2": {"arm_bridge"},
    "run_due_tasks": {"arm_bridge"},
    "set_sweep_interval": {"arm_bridge"},
    "retry_file": {"arm_api"},
    "retry_files": {"arm_api"},
    "retry_file_v2": {"arm_api"},
    "retry_files_v2": {"arm_api"},
    "retry_file_v3": {"arm_api"},
    "retry_files_v3": {"arm_api"},
    "get_file": {"arm_api", "arm_readonly"},
    "list_files": {"arm_api", "arm_readonly"},
    # metrics and the status view
    "compact_counts": {"arm_bridge"},
    "job_counts": {"arm_api", "arm_readonly"},
    "file_counts": {"arm_readonly"},
    "status_view": {"arm_api", "arm_bridge", "arm_readonly"},
    "pace_view": {"arm_api", "arm_bridge", "arm_readonly"},
    "outbox_ready_age": {"arm_api", "arm_bridge", "arm_readonly"},
    # the console's charts
    "record_waits": {"arm_bridge"},
    "status_series": {"arm_api", "arm_readonly"},
    # the bridges that say they are alive
    "record_bridge": {"arm_bridge"},
    "forget_bridge": {"arm_bridge"},
    "bridge_instances": {"arm_api", "arm_readonly"},
    # the upload in one call
    "upload_file": {"arm_uploader"},
    "upload_files": {"arm_uploader"},
}
# Read-only helpers called per row inside the functions: PUBLIC, no SET clause (so the SQL
# ones inline), the caller's rights.
PUBLIC_HELPERS = {
    "is_final",
    "pipeline_for",
    "setting_int",
    "_request_body",
    "_request_text",
    "job_view",
    "fold_name",
    "name_pattern",
    "is_retryable",
    "nats_message_bytes",
    "envelope_problem",
    "upload_problem",
    "wait_bucket_bounds",
    "wait_quantile",
    "wait_summary",
}
# The tables' default id: anyone's (every inserter evaluates it), no SET clause, the
# caller's rights; VOLATILE (a new id each call) but reads and writes no table.
ID_GENERATORS = {"uuid_v7"}
# Pinned but with the caller's rights: pg_cron's scheduling and unscheduling, which need
# the caller's rights on schema cron (a DBA's).
INVOKER = {"schedule_with_pg_cron", "unschedule_pg_cron"}
# Triggers that read and write no table: the writer's rights, no SET clause (they fire
# per row; inside the functions they run under the functions' pinned path), nobody's to
# call (a trigger function is only ever fired, and CREATE TRIGGER needs EXECUTE).
ROW_TRIGGERS = {
    "tg_recognition_job__guard",
    "tg_stored_file__touch",
}
PINNED = ["search_path=pg_catalog, arm, pg_temp"]
RUNTIME_ROLES = ("arm_bridge", "arm_api", "arm_uploader", "arm_readonly")
# The login of each runtime role (plus serve's, a member of two) and its roles.
RUNTIME_LOGINS = (BRIDGE_LOGIN, API_LOGIN, SERVE_LOGIN, UPLOADER_LOGIN, READONLY_LOGIN)
TABLES = (
    "setting",
    "s3_object",
    "stored_file",
    "recognition_job",
    "retry_audit",
    "periodic_task",
    "status_sample",
    "wait_sample",
    "bridge_instance",
)


def connect(db_url: str, login: Login) -> Conn:
    return dict_conn(as_login(db_url, login))


def user_of(url: str) -> str:
    return url.split("://", 1)[1].split("@", 1)[0]


# --- the catalog: owner, search_path, grants ----------------------------------------------

FUNCTIONS = """
SELECT p.proname AS name, p.proowner::regrole::text AS owner, p.prosecdef AS definer,
       p.proconfig AS config, p.provolatile AS volatility,
       p.prorettype = 'trigger'::regtype AS is_trigger,
       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public_execute,
       array(SELECT r FROM unnest(%(roles)s::text[]) AS r
             WHERE has_function_privilege(r, p.oid, 'EXECUTE') ORDER BY r) AS callers,
       format('SELECT arm.%%I(%%s)', p.proname,
              (SELECT string_agg(format('NULL::%%s', format_type(t, NULL)), ', ' ORDER BY i)
               FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i))) AS call
FROM pg_proc p
WHERE p.pronamespace = 'arm'::regnamespace
ORDER BY p.proname
"""


def functions(conn: Conn) -> dict[str, dict[str, Any]]:
    rows = conn.execute(FUNCTIONS, {"roles": list(RUNTIME_ROLES)}).fetchall()
    return {row["name"]: row for row in rows}


def test_every_function_is_owned_pinned_and_granted_as_listed(conn: Conn) -> None:
    assert_functions_owned_pinned_and_granted(conn)


def assert_functions_owned_pinned_and_granted(conn: Conn) -> None:
    """Every function of arm is arm_owner's; the PUBLIC helpers are read-only, unpinned
    and anyone's; the ROW_TRIGGERS pinned, invoker and nobody's; every other one is
    pinned, not PUBLIC's, SECURITY DEFINER unless listed in INVOKER, and callable by
    exactly the roles CALLERS names."""
    found = functions(conn)
    assert set(CALLERS) | PUBLIC_HELPERS | ID_GENERATORS | INVOKER | ROW_TRIGGERS <= set(found)
    for name, f in found.items():
        assert f["owner"] == "arm_owner", name
        if name in ROW_TRIGGERS:
            assert f["is_trigger"] and (f["definer"], f["config"]) == (False, PINNED), name
            assert not f["public_execute"] and f["callers"] == [], name
            continue
        if name in ID_GENERATORS:
            assert (f["volatility"], f["definer"], f["config"]) == ("v", False, None), name
            assert f["public_execute"], name
            assert f["callers"] == sorted(RUNTIME_ROLES), name
            continue
        if name in PUBLIC_HELPERS:
            # Read-only (IMMUTABLE or STABLE), no SET, the caller's rights, anyone's.
            assert (f["volatility"], f["definer"], f["config"]) in (
                ("i", False, None),
                ("s", False, None),
            ), name
            assert f["public_execute"], name
            assert f["callers"] == sorted(RUNTIME_ROLES), name
            continue
        assert f["config"] == PINNED, f"arm.{name} has no pinned search_path: {f['config']}"
        assert not f["public_execute"], f"PUBLIC may execute arm.{name}"
        assert f["definer"] == (name not in INVOKER), name
        assert f["callers"] == sorted(CALLERS.get(name, ())), name


def test_a_function_created_by_a_function_file_is_the_owners_alone(
    db_url: str, tmp_path: Path
) -> None:
    """A new function gets the migrating user as owner and PUBLIC's EXECUTE; grants.sql,
    in the same transaction, takes both away before anyone else can see it."""
    root = tmp_path / "db"
    shutil.copytree(SQL_DIR / "functions", root / "functions")
    shutil.copy(SQL_DIR / "grants.sql", root / "grants.sql")
    (root / "functions" / "99_new.sql").write_text(
        "CREATE OR REPLACE FUNCTION arm.brand_new() RETURNS void LANGUAGE sql "
        "SECURITY DEFINER SET search_path = pg_catalog, arm, pg_temp AS $$ "
        "DELETE FROM arm.retry_audit $$;"
    )
    with psycopg.connect(db_url, autocommit=True) as plain:
        apply_functions(plain, root)
    with dict_conn(db_url) as conn:
        new = functions(conn)["brand_new"]
    assert (new["owner"], new["public_execute"], new["callers"]) == ("arm_owner", False, [])


def test_a_function_the_owner_role_creates_by_hand_is_not_public(db_url: str) -> None:
    with connect(db_url, OWNER_LOGIN) as owner:
        owner.execute("SET ROLE arm_owner")
        owner.execute("CREATE FUNCTION arm.hand_made() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        f = functions(owner)["hand_made"]
    assert (f["owner"], f["public_execute"], f["callers"]) == ("arm_owner", False, [])


TABLE_PRIVILEGES = """
SELECT r AS role, t AS table_name, array(
    SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                               'REFERENCES', 'TRIGGER']) AS p
    WHERE has_table_privilege(r, 'arm.' || t, p)
       OR (p IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
           AND has_any_column_privilege(r, 'arm.' || t, p))
    ORDER BY p) AS privileges
FROM unnest(%(roles)s::text[]) AS r, unnest(%(tables)s::text[]) AS t
"""


def table_privileges(conn: Conn) -> dict[tuple[str, str], list[str]]:
    params = {"roles": list(RUNTIME_ROLES), "tables": list(TABLES)}
    rows = conn.execute(TABLE_PRIVILEGES, params).fetchall()
    return {(r["role"], r["table_name"]): r["privileges"] for r in rows if r["privileges"]}


def test_only_the_uploader_writes_a_table_and_only_what_an_upload_writes(conn: Conn) -> None:
    assert_table_privileges(conn)


def assert_table_privileges(conn: Conn) -> None:
    """What each runtime role may do to each table (and column) of arm, and in the
    schema; PUBLIC nothing."""
    expected = {("arm_readonly", t): ["SELECT"] for t in TABLES}
    expected |= {
        ("arm_bridge", "recognition_job"): ["SELECT"],  # status, requested_at: the health check
        ("arm_api", "recognition_job"): ["SELECT"],
        ("arm_uploader", "s3_object"): ["INSERT", "SELECT"],
        ("arm_uploader", "stored_file"): ["INSERT", "SELECT", "UPDATE"],
        ("arm_uploader", "recognition_job"): ["INSERT", "SELECT"],
    }
    assert table_privileges(conn) == expected
    columns = conn.execute(
        "SELECT grantee, table_name, privilege_type, "
        "array_agg(column_name::text ORDER BY column_name) AS columns "
        "FROM information_schema.column_privileges "
        "WHERE table_schema = 'arm' AND grantee IN ('arm_bridge', 'arm_api', 'arm_uploader') "
        "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    ).fetchall()
    assert {
        (c["grantee"], c["table_name"], c["privilege_type"]): c["columns"] for c in columns
    } == {
        ("arm_api", "recognition_job", "SELECT"): ["requested_at", "status"],
        ("arm_bridge", "recognition_job", "SELECT"): ["requested_at", "status"],
        ("arm_uploader", "recognition_job", "INSERT"): [
            "attempt",
            "file_id",
            "id",
            "max_attempts",
            "pipeline",
        ],
        ("arm_uploader", "recognition_job", "SELECT"): ["id"],
        ("arm_uploader", "s3_object", "INSERT"): [
            "bucket",
            "bucket_role",
            "created_by",
            "id",
            "key",
        ],
        ("arm_uploader", "s3_object", "SELECT"): ["id"],
        ("arm_uploader", "stored_file", "INSERT"): [
            "consolidation_id",
            "file_type",
            "id",
            "original_name",
            "s3_object_id",
        ],
        ("arm_uploader", "stored_file", "SELECT"): ["id"],
        ("arm_uploader", "stored_file", "UPDATE"): ["current_recognition_job_id"],
    }
    schema = conn.execute(
        "SELECT r, has_schema_privilege(r, 'arm', 'USAGE') AS usage, "
        "has_schema_privilege(r, 'arm', 'CREATE') AS create "
        "FROM unnest(%s::text[]) AS r",
        (list(RUNTIME_ROLES),),
    ).fetchall()
    assert all(s["usage"] and not s["create"] for s in schema), schema
    public = (
        "SELECT count(*) FROM pg_namespace, aclexplode(nspacl) a "
        "WHERE nspname = 'arm' AND a.grantee = 0"
    )
    assert scalar(conn, public) == 0  # PUBLIC: nothing at all in schema arm


# --- every login: a call of every function, allowed exactly as CALLERS says ------------


def refusal(conn: Conn, statement: str, params: Any = None) -> str | None:
    """The server's "permission denied …" for the statement, or None when it got past the
    privilege checks (in a transaction rolled back: whatever an allowed call does is
    undone; an error after the checks, e.g. for NULL arguments, is not a refusal)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement, params)
    except psycopg.errors.InsufficientPrivilege as exc:
        return str(exc)
    except psycopg.Error:
        return None
    return None


def denied(conn: Conn, statement: str, params: Any = None) -> bool:
    return refusal(conn, statement, params) is not None


@pytest.mark.parametrize("login", [*RUNTIME_LOGINS, OWNER_LOGIN], ids=lambda x: x.name)
def test_a_login_may_call_exactly_the_functions_of_its_roles(db_url: str, login: Login) -> None:
    with dict_conn(db_url) as admin:
        calls = {name: f["call"] for name, f in functions(admin).items() if not f["is_trigger"]}
    may = (
        PUBLIC_HELPERS
        | ID_GENERATORS
        | {name for name, roles in CALLERS.items() if roles & set(login.roles)}
    )
    if login is OWNER_LOGIN:
        may = set(calls)  # a DBA, member of arm_owner: every function
    with connect(db_url, login) as conn:
        refused = {
            name
            for name, call in calls.items()
            if (refusal(conn, call) or "").startswith("permission denied for function")
        }
    # A PUBLIC helper that reads a table (setting_int, job_view) is callable by anyone,
    # and then reads with the caller's rights: "permission denied for table" is not this.
    assert refused == set(calls) - may


# --- what each role must do, it does --------------------------------------------------------


def test_the_bridge_role_does_everything_the_bridge_sends(db_url: str) -> None:
    """Every query of the bridge's steps, as src/arm_core/queries.sql has them, by a login of
    arm_bridge alone."""
    with dict_conn(db_url) as admin:
        done, unacked, overdue = upload(admin), upload(admin), upload(admin, "PDF")
        admin.execute("UPDATE arm.periodic_task SET enabled = false")  # a DBA's choice
    with connect(db_url, BRIDGE_LOGIN) as bridge:
        bridge.execute("LISTEN arm_recognition_job_queued")
        assert scalar(bridge, query("outbox_ready_age")) > 0
        params = {
            "limit": 10,
            "tabular_timeout": 600,
            "image_timeout": 0,  # the PDF's deadline is now
            "tabular_subject": "files.tabular_uploaded",
            "image_subject": "files.img_uploaded",
            "max_bytes": 1 << 20,
        }
        with bridge.transaction():
            sent = bridge.execute(query("publish_queued_jobs"), params).fetchall()
        assert [r["outcome"] for r in sent] == ["published"] * 3

        envelopes = [
            {
                "job_id": str(done.job_id),
                "file_id": str(done.file_id),
                "status": "processing",
                "service_name": "tabular-parser",
            },
            {
                "job_id": str(done.job_id),
                "file_id": str(done.file_id),
                "status": "done",
                "msg_id": "r1",
                "service_name": "tabular-parser",
                "result_bucket": "arm-ka",
                "result_key": "results/r1.json",
                "result_schema_version": "1.0",
            },
        ]
        applied = bridge.execute(query("apply_envelopes"), {"envelopes": Jsonb(envelopes)})
        assert [r["outcome"] for r in applied.fetchall()] == ["applied", "applied"]

        bridge.execute(query("set_sweep_interval"), {"seconds": 7})
        with dict_conn(db_url) as admin:
            task = admin.execute(
                "SELECT * FROM arm.periodic_task WHERE name = 'sweep_timeouts'"
            ).fetchone()
            assert task is not None
            # The period changed; whether the task runs is still the DBA's.
            assert (task["run_every"].total_seconds(), task["enabled"]) == (7, False)
            admin.execute(
                "UPDATE arm.periodic_task SET enabled = true, next_run_at = now() "
                "WHERE name = 'sweep_timeouts'"
            )
        ran = bridge.execute(query("run_due_tasks")).fetchall()
        assert [(r["task"], r["result"], r["error"]) for r in ran] == [
            ("sweep_timeouts", "1", None)  # the PDF
        ]

        with bridge.transaction():
            claimed = bridge.execute(
                query("claim_unacked_jobs"), {"limit": 10, "ack_timeout": 0, "max_republish": 1}
            ).fetchall()
            assert [r["job_id"] for r in claimed] == [unacked.job_id]
            bridge.execute(query("mark_republished"), {"job_ids": [unacked.job_id]})
        dead = bridge.execute(
            query("dead_letter_unacked"), {"ack_timeout": 0, "max_republish": 1}
        ).fetchall()
        assert [r["job_id"] for r in dead] == [unacked.job_id]
    with dict_conn(db_url) as admin:
        assert [job(admin, u.job_id)["status"] for u in (done, unacked, overdue)] == [
            "done",
            "dlq",
            "timeout",
        ]


def test_the_api_role_retries_reads_and_checks_health(db_url: str) -> None:
    with dict_conn(db_url) as admin:
        failed = upload(admin)
        fail_by_timeout(admin, failed)
        other = upload(admin)
    with connect(db_url, API_LOGIN) as api:
        [row] = api.execute(
            query("retry_file"),
            {
                "file_id": failed.file_id,
                "actor": "ops",
                "expected_job_id": None,
                "actor_level": "operator",
            },
        )
        assert row["outcome"] == "retried"
        rows = api.execute(
            query("retry_files"),
            {
                "file_ids": [failed.file_id, other.file_id],
                "actor": "ops",
                "expected_job_ids": None,
                "actor_level": "operator",
            },
        ).fetchall()
        assert {r["outcome"] for r in rows} == {"not_retryable"}
        document = api.execute(query("get_file"), {"file_id": failed.file_id}).fetchone()
        assert document is not None and len(document["file"]["attempts"]) == 2
        assert scalar(api, query("outbox_ready_age")) >= 0


@pytest.mark.parametrize("role", ["results", "raw"])
def test_the_plain_sql_upload_refuses_a_source_that_is_not_an_uploads_object(
    db_url: str, role: str
) -> None:
    """A file's source is the uploaded object (role uploads). The uploader's
    plain-SQL upload of a file whose object is a result (or raw) is refused, saying so;
    nothing of it stays. A row stored before the check came is left as it is."""
    with connect(db_url, UPLOADER_LOGIN) as uploader:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            with uploader.transaction():
                obj = scalar(
                    uploader,
                    "INSERT INTO arm.s3_object (bucket, key, bucket_role) "
                    "VALUES ('arm-ka', 'results/r.json', %s) RETURNING id",
                    (role,),
                )
                uploader.execute(
                    "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
                    "VALUES ('r.json.xlsx', 'XLSX', %s)",
                    (obj,),
                )
        message = str(refused.value)
        assert f"is a {role} object; a file's source must be an uploads object" in message
    with dict_conn(db_url) as admin:
        assert scalar(admin, "SELECT count(*) FROM arm.stored_file") == 0
        # An older row (stored before the trigger existed: the trigger off for the insert)
        # carries on: its status changes; only a new source is checked.
        up = upload(admin)
        result_obj = scalar(
            admin,
            "INSERT INTO arm.s3_object (bucket, key, bucket_role) "
            "VALUES ('arm-ka', 'results/old.json', 'results') RETURNING id",
        )
        with admin.transaction():
            admin.execute("ALTER TABLE arm.stored_file DISABLE TRIGGER tg_stored_file__source_role")
            admin.execute(
                "UPDATE arm.stored_file SET s3_object_id = %s WHERE id = %s",
                (result_obj, up.file_id),
            )
            admin.execute("ALTER TABLE arm.stored_file ENABLE TRIGGER tg_stored_file__source_role")
        admin.execute("UPDATE arm.stored_file SET status = 'ERROR' WHERE id = %s", (up.file_id,))
        assert stored_file(admin, up.file_id)["status"] == "ERROR"
        with pytest.raises(psycopg.errors.CheckViolation):
            admin.execute(
                "UPDATE arm.stored_file SET s3_object_id = %s WHERE id = %s",
                (result_obj, up.file_id),
            )


def test_the_uploader_role_does_the_readme_upload_with_its_defaults(db_url: str) -> None:
    """docs/dbas.md's plain-SQL upload as a login of arm_uploader alone: the defaults trigger
    (which reads stored_file and arm.setting, which the uploader may not) fills pipeline
    and max_attempts, and the publisher is woken (once: the second job joins a queue that
    holds the first; tests/integration/test_wake_up.py has the rule)."""
    with dict_conn(db_url) as admin, psycopg.connect(db_url, autocommit=True) as listener:
        admin.execute("SELECT arm.set_setting('default_max_attempts', '5')")
        listener.execute("LISTEN arm_recognition_job_queued")
        with connect(db_url, UPLOADER_LOGIN) as uploader:
            up = upload(uploader, "PDF")
            # The pipeline may be left out, as may every id.
            with uploader.transaction():
                obj = scalar(
                    uploader,
                    "INSERT INTO arm.s3_object (bucket, key, bucket_role) "
                    "VALUES ('arm-ka', 'uploads/x.xlsx', 'uploads') RETURNING id",
                )
                file_id = scalar(
                    uploader,
                    "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
                    "VALUES ('x.xlsx', 'XLSX', %s) RETURNING id",
                    (obj,),
                )
                job_id = scalar(
                    uploader,
                    "INSERT INTO arm.recognition_job (file_id, attempt) "
                    "VALUES (%s, 1) RETURNING id",
                    (file_id,),
                )
                uploader.execute(
                    "UPDATE arm.stored_file SET current_recognition_job_id = %s WHERE id = %s",
                    (job_id, file_id),
                )
        for new_job, pipeline in ((up.job_id, "image"), (job_id, "tabular")):
            row = job(admin, new_job)
            assert (row["pipeline"], row["max_attempts"], row["status"]) == (pipeline, 5, "queued")
        assert stored_file(admin, file_id)["current_recognition_job_id"] == job_id
        notified = listener.notifies(timeout=5, stop_after=1)
        assert [n.channel for n in notified] == ["arm_recognition_job_queued"]


def test_the_readonly_role_reads_every_table_and_the_file_view(db_url: str) -> None:
    with dict_conn(db_url) as admin:
        up = upload(admin)
    with connect(db_url, READONLY_LOGIN) as readonly:
        for table in TABLES:
            readonly.execute(f"SELECT * FROM arm.{table}").fetchall()
        assert job(readonly, up.job_id)["status"] == "queued"
        document = readonly.execute(query("get_file"), {"file_id": up.file_id}).fetchone()
        assert document is not None and document["file"]["file"]["id"] == str(up.file_id)


def test_a_dba_changes_the_schedule_as_the_owner_role(db_url: str) -> None:
    with connect(db_url, OWNER_LOGIN) as dba:
        dba.execute(
            "UPDATE arm.periodic_task SET run_every = interval '10 seconds' "
            "WHERE name = 'sweep_timeouts'"
        )
        dba.execute(
            "SELECT arm.set_periodic_task('sweep_timeouts', 'arm.sweep_timeouts()', '11 s')"
        )
        assert scalar(dba, "SELECT arm.sweep_timeouts()") == 0
        period = scalar(
            dba, "SELECT run_every FROM arm.periodic_task WHERE name = 'sweep_timeouts'"
        )
    assert period.total_seconds() == 11


# --- what no runtime role may do -------------------------------------------------------------

WRITES = [
    "UPDATE arm.recognition_job SET status = 'dlq', finished_at = now(), error_code = 'X'",
    "DELETE FROM arm.recognition_job",
    "TRUNCATE arm.recognition_job CASCADE",
    "UPDATE arm.stored_file SET status = 'ERROR'",
    "INSERT INTO arm.periodic_task (name, function_name, run_every) "
    "VALUES ('mine', 'arm.retry_files(uuid[], text)', interval '1 second')",
    "UPDATE arm.periodic_task SET function_name = 'arm.sweep_timeouts()', run_every = '1 s'",
    "DELETE FROM arm.periodic_task",
    "UPDATE arm.setting SET value = '99'",
    "INSERT INTO arm.setting (name, value) VALUES ('mine', '1')",
    "DELETE FROM arm.retry_audit",
    # The uploader inserts and links, but no more than an upload does.
    "INSERT INTO arm.recognition_job (file_id, attempt, status) "
    "SELECT id, 2, 'queued' FROM arm.stored_file",
    "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id, status) "
    "SELECT 'x', 'PDF', id, 'ERROR' FROM arm.s3_object",
    "CREATE TABLE arm.mine (id int)",
    "CREATE FUNCTION arm.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
]


@pytest.mark.parametrize("login", RUNTIME_LOGINS, ids=lambda x: x.name)
def test_no_runtime_role_writes_a_table_directly(db_url: str, login: Login) -> None:
    with dict_conn(db_url) as admin:
        up = upload(admin)
        publish(admin)
        before = {t: admin.execute(f"SELECT * FROM arm.{t} ORDER BY 1").fetchall() for t in TABLES}
    with connect(db_url, login) as conn:
        allowed = [w for w in WRITES if not denied(conn, w)]
    assert allowed == []
    with dict_conn(db_url) as admin:
        after = {t: admin.execute(f"SELECT * FROM arm.{t} ORDER BY 1").fetchall() for t in TABLES}
        assert job(admin, up.job_id)["status"] == "published"
    assert after == before


# --- search_path hijack --------------------------------------------------------------------

EVIL = """
-- in_trigger: the look-alike ran inside a trigger (a trigger function called it).
CREATE TABLE evil.used (
    what text NOT NULL, who text NOT NULL,
    in_trigger boolean NOT NULL DEFAULT pg_catalog.pg_trigger_depth() > 0
);
GRANT INSERT ON evil.used TO PUBLIC;
-- Look-alikes of a built-in function and of uuid's `=`: each notes who ran it, then does
-- what the real one does (so nothing else gives it away).
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.used VALUES ('clock_timestamp()', current_user);
    RETURN pg_catalog.clock_timestamp();
END $$;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.used VALUES ('now()', current_user);
    RETURN pg_catalog.now();
END $$;
CREATE FUNCTION evil.uuid_eq(a uuid, b uuid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.used VALUES ('uuid = uuid', current_user);
    RETURN a OPERATOR(pg_catalog.=) b;
END $$;
CREATE OPERATOR evil.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = evil.uuid_eq);
CREATE FUNCTION evil.status_eq(a arm.job_status, b arm.job_status) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.used VALUES ('job_status = job_status', current_user);
    RETURN a::text OPERATOR(pg_catalog.=) b::text;
END $$;
CREATE OPERATOR evil.= (
    LEFTARG = arm.job_status, RIGHTARG = arm.job_status, FUNCTION = evil.status_eq
);
CREATE FUNCTION evil.pg_notify(channel text, payload text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evil.used VALUES ('pg_notify(text, text)', current_user);
    PERFORM pg_catalog.pg_notify(channel, payload);
END $$;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
"""
# evil before pg_catalog: a name of the caller's own schema wins over the built-in.
HIJACK_PATH = "SET search_path = evil, pg_catalog, arm, public"


def plant_evil(db_url: str, login: Login) -> None:
    """Schema evil, the login's own, with its look-alikes, created by the login."""
    with dict_conn(db_url) as admin:
        admin.execute(
            sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(sql.Identifier(login.name))
        )
    with connect(db_url, login) as conn:
        conn.execute(EVIL)
        # The look-alikes are live: a caller's own statement under the path uses them.
        conn.execute(HIJACK_PATH)
        conn.execute(
            "SELECT clock_timestamp(), now(), gen_random_uuid() = gen_random_uuid(), "
            "'queued'::arm.job_status = 'queued', pg_notify('nobody', '')"
        )
        used = conn.execute("SELECT DISTINCT what, who FROM evil.used ORDER BY 1").fetchall()
        assert [(u["what"], u["who"]) for u in used] == [
            ("clock_timestamp()", login.name),
            ("job_status = job_status", login.name),
            ("now()", login.name),
            ("pg_notify(text, text)", login.name),
            ("uuid = uuid", login.name),
        ]
        conn.execute("DELETE FROM evil.used")


def ran_as_someone_else(conn: Conn, login: Login) -> list[tuple[str, str]]:
    """Look-alikes that ran with rights other than the login's own (the owner's)."""
    rows = conn.execute(
        "SELECT DISTINCT what, who FROM evil.used WHERE who <> %s ORDER BY 1", (login.name,)
    ).fetchall()
    return [(r["what"], r["who"]) for r in rows]


def test_a_hijacked_search_path_never_reaches_the_bridges_functions(db_url: str) -> None:
    plant_evil(db_url, BRIDGE_LOGIN)
    with dict_conn(db_url) as admin:
        first, second = upload(admin), upload(admin)
        admin.execute("UPDATE arm.periodic_task SET next_run_at = now()")
    with connect(db_url, BRIDGE_LOGIN) as bridge:
        bridge.execute(HIJACK_PATH)
        with bridge.transaction():
            sent = bridge.execute(
                "SELECT * FROM arm.publish_queued_jobs_v2(10, '600 s', '1 s', 't', 'i', 1048576)"
            ).fetchall()
        assert len(sent) == 2
        ack = [
            {
                "job_id": str(first.job_id),
                "file_id": str(first.file_id),
                "status": "processing",
                "service_name": "tabular-parser",
            }
        ]
        bridge.execute("SELECT * FROM arm.apply_envelopes_v2(%s)", (Jsonb(ack),))
        bridge.execute("SELECT * FROM arm.claim_unacked_jobs(10, '0 s', 5)")
        bridge.execute("SELECT arm.mark_republished(%s)", ([second.job_id],))
        bridge.execute("SELECT * FROM arm.dead_letter_unacked('0 s', 5)")
        bridge.execute("SELECT arm.set_sweep_interval('9 s')")
        bridge.execute("SELECT * FROM arm.run_due_tasks()")
        assert ran_as_someone_else(bridge, BRIDGE_LOGIN) == []
    with dict_conn(db_url) as admin:
        assert job(admin, first.job_id)["status"] == "processing"


def test_a_hijacked_search_path_never_reaches_the_api_or_the_uploads(
    db_url: str,
) -> None:
    for login in (API_LOGIN, UPLOADER_LOGIN):
        with dict_conn(db_url) as admin:
            admin.execute("DROP SCHEMA IF EXISTS evil CASCADE")
        plant_evil(db_url, login)
        with dict_conn(db_url) as admin:
            failed = upload(admin)
            fail_by_timeout(admin, failed)
        with connect(db_url, login) as conn:
            conn.execute(HIJACK_PATH)
            if login is API_LOGIN:
                conn.execute("SELECT * FROM arm.retry_file(%s, 'ops')", (failed.file_id,))
                conn.execute("SELECT * FROM arm.retry_files(%s, 'ops')", ([failed.file_id],))
                conn.execute("SELECT arm.get_file(%s)", (failed.file_id,))
            else:
                upload(conn, "XLSB")  # the new jobs' check reads stored_file by id
                conn.execute(UPLOAD_WITHOUT_PIPELINE)  # so does the defaults trigger
                upload_file(conn, "PDF")  # the one-call upload, and its batch form
                files = [{"bucket": "b", "key": "k", "original_name": "n", "file_type": "XLS"}]
                conn.execute("SELECT * FROM arm.upload_files(%s)", (Jsonb(files),))
            assert ran_as_someone_else(conn, login) == []


# A plain-SQL upload that leaves the pipeline to the defaults trigger (it then reads the
# file's type by the file's id).
UPLOAD_WITHOUT_PIPELINE = (
    "WITH o AS (INSERT INTO arm.s3_object (bucket, key, bucket_role) "
    "VALUES ('arm-ka', 'uploads/no-pipeline.pdf', 'uploads') RETURNING id), "
    "f AS (INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
    "SELECT 'no-pipeline.pdf', 'PDF', o.id FROM o RETURNING id) "
    "INSERT INTO arm.recognition_job (file_id, attempt) SELECT f.id, 1 FROM f"
)

# What a DBA might do by hand: mark queued jobs published (the guard checks the move).
PUBLISH_BY_HAND = (
    "UPDATE arm.recognition_job SET status = 'published', published_at = now(), "
    "last_published_at = now(), request_msg_id = id::text || ':1', "
    "request_subject = 'files.tabular_uploaded', reply_deadline = now() + interval '10 min'"
)


def ran_in_a_trigger(conn: Conn) -> list[tuple[str, str]]:
    """Look-alikes a trigger function called (whoever's rights it ran with)."""
    rows = conn.execute(
        "SELECT DISTINCT what, who FROM evil.used WHERE in_trigger ORDER BY 1"
    ).fetchall()
    return [(r["what"], r["who"]) for r in rows]


def test_a_hijacked_search_path_never_reaches_the_trigger_functions(db_url: str) -> None:
    """The triggers run under the search_path of whoever fires them. The
    uploader's plain-SQL upload (its UPDATE of current_recognition_job_id fires the
    stored_file trigger) and a DBA's UPDATE of a job's status (the guard) with their own
    schema first in the path: no look-alike runs inside a trigger."""
    plant_evil(db_url, UPLOADER_LOGIN)
    with connect(db_url, UPLOADER_LOGIN) as conn:
        conn.execute(HIJACK_PATH)
        upload(conn, "XLSX")
        upload(conn, "PDF")
        assert ran_in_a_trigger(conn) == []
    with dict_conn(db_url) as dba:
        dba.execute(HIJACK_PATH)
        queued = dba.execute(
            "SELECT id FROM arm.recognition_job WHERE status = 'queued' LIMIT 1"
        ).fetchone()
        assert queued is not None
        dba.execute(PUBLISH_BY_HAND + " WHERE id = %s", (queued["id"],))
        dba.execute("UPDATE arm.stored_file SET status = status")
        assert ran_in_a_trigger(dba) == []
        # The statements' own calls did use the look-alikes: the path was live.
        assert scalar(dba, "SELECT count(*) FROM evil.used") > 0


@pytest.mark.parametrize(
    ("function", "statement"),
    [
        ("arm.tg_stored_file__touch()", "UPDATE arm.stored_file SET status = status"),
        ("arm.tg_recognition_job__guard()", PUBLISH_BY_HAND + " WHERE status = 'queued'"),
    ],
    ids=["touch", "guard"],
)
def test_without_its_pinned_path_a_trigger_runs_the_callers_look_alikes(
    db_url: str, function: str, statement: str
) -> None:
    """The counter-proof: with the trigger function's SET search_path removed (rolled
    back), the same statement makes it call the caller's look-alike."""
    plant_evil(db_url, UPLOADER_LOGIN)
    with dict_conn(db_url) as admin:
        upload(admin)
    with dict_conn(db_url) as conn, conn.transaction(force_rollback=True):
        conn.execute(f"ALTER FUNCTION {function} RESET search_path")
        conn.execute(HIJACK_PATH.replace("SET", "SET LOCAL", 1))
        conn.execute(statement)
        assert ran_in_a_trigger(conn) != []


@pytest.mark.parametrize(
    ("login", "function", "call"),
    [
        (
            BRIDGE_LOGIN,
            "arm.publish_queued_jobs_v2(integer, interval, interval, text, text, integer)",
            "SELECT * FROM arm.publish_queued_jobs_v2(10, '600 s', '1 s', 't', 'i', 1048576)",
        ),
        (UPLOADER_LOGIN, "arm.tg_recognition_job__defaults()", UPLOAD_WITHOUT_PIPELINE),
        (UPLOADER_LOGIN, "arm.tg_recognition_job__inserted()", None),
    ],
    ids=["publish_queued_jobs_v2", "defaults_trigger", "new_jobs_trigger"],
)
def test_without_its_pinned_path_the_same_call_runs_the_callers_code_as_the_owner(
    db_url: str, login: Login, function: str, call: str | None
) -> None:
    """The counter-proof of the two tests above: with the function's SET search_path
    removed (in a transaction that is rolled back), the same call runs the caller's
    look-alikes with the owner's rights — which is what the pin prevents."""
    plant_evil(db_url, login)
    with dict_conn(db_url) as admin:
        upload(admin)
    with dict_conn(db_url) as conn, conn.transaction(force_rollback=True):
        conn.execute(f"ALTER FUNCTION {function} RESET search_path")
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(login.name)))
        conn.execute(HIJACK_PATH.replace("SET", "SET LOCAL", 1))
        if call is not None:
            conn.execute(call)
        else:
            upload(conn, "PDF")
        stolen = ran_as_someone_else(conn, login)
    assert "arm_owner" in {who for _, who in stolen}, stolen


# --- the fixtures run the bridge and the API under their roles ---------------------------------


async def test_the_bridge_under_test_connects_as_the_bridges_login(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    settings = fast_settings(db_url, nats_server.url())
    assert user_of(settings.require_database_url()) == BRIDGE_LOGIN.name  # the listener's
    async with running_bridge(settings) as bridge, bridge.store.pool.connection() as conn:
        cur = await conn.execute("SELECT current_user::text")
        assert await cur.fetchone() == (BRIDGE_LOGIN.name,)


async def test_the_api_under_test_connects_as_the_apis_login(db_url: str) -> None:
    async with running_api(api_settings(db_url)) as http:
        assert (await http.get("/healthcheck")).status == 200
        async with http.app[STORE].pool.connection() as conn:
            cur = await conn.execute("SELECT current_user::text")
            assert await cur.fetchone() == (API_LOGIN.name,)
    with_bridge = api_settings(db_url, nats_enabled=True)
    assert user_of(with_bridge.require_database_url()) == SERVE_LOGIN.name


def test_arm_core_processes_under_test_connect_as_their_roles_logins(db_url: str) -> None:
    def user(command: str, **env: str) -> str:
        return user_of(runtime_env(command, {"DATABASE_URL": db_url, **env})["DATABASE_URL"])

    assert user("bridge") == BRIDGE_LOGIN.name
    assert user("serve") == SERVE_LOGIN.name
    assert user("serve", NATS_ENABLED="false") == API_LOGIN.name
    assert user("migrate") == "postgres"


# --- arm-core migrate and the roles ------------------------------------------------------------


def _new_login(admin_url: str, createrole: bool = False) -> str:
    name = f"arm_migrator_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        extra = sql.SQL(" CREATEROLE") if createrole else sql.SQL("")
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)) + extra)
    return name


def _owned_by(db_url: str, login: str) -> str:
    """db_url's database, now owned by `login` (as a deployment's database is), as login."""
    dbname = db_url.rsplit("/", 1)[1]
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(dbname), sql.Identifier(login)
            )
        )
    return as_login(db_url, Login(login, ()))


def _dba_sql(stderr: str) -> str:
    """The SQL `arm-core migrate` prints after its one-line message."""
    message, sql_text = stderr.split("\n\n", 1)
    assert "\n" not in message
    return sql_text


def test_a_migrating_user_outside_arm_owner_is_told_the_grant_and_changes_nothing(
    empty_db_url: str,
) -> None:
    login = _new_login(empty_db_url)
    url = _owned_by(empty_db_url, login)
    with pytest.raises(RolesMissing) as refused:
        migrate(url)
    assert f'"{login}" is not a member of arm_owner' in str(refused.value)
    assert refused.value.sql == f"GRANT arm_owner TO {login};\n"
    with dict_conn(empty_db_url) as admin:
        assert scalar(admin, "SELECT to_regnamespace('arm')") is None
        assert scalar(admin, "SELECT to_regclass('public._yoyo_migration')") is None
        admin.execute(refused.value.sql)  # the DBA, once

    migrate(url)
    migrate(url)  # again: nothing left to do, and nothing it may not do
    with dict_conn(empty_db_url) as admin:
        assert functions(admin)["publish_queued_jobs_v2"]["owner"] == "arm_owner"
        owners = admin.execute(
            "SELECT DISTINCT relowner::regrole::text AS o FROM pg_class "
            "WHERE relnamespace = 'arm'::regnamespace"
        ).fetchall()
        assert [o["o"] for o in owners] == ["arm_owner"]


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of its own, where the roles do not exist yet (the suite's cluster has
    them since its template was migrated)."""
    server = EmbeddedPostgres(base_dir=tmp_path_factory.mktemp("bare-postgres"))
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def no_roles(bare_cluster: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """The bare cluster without arm-core's roles (and without the databases that used
    them), before and after the test."""

    def reset() -> None:
        with psycopg.connect(bare_cluster.url(), autocommit=True) as admin:
            names = admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'arm\\_%'"
            ).fetchall()
            for (name,) in names:
                admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            for role in ROLES:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

    reset()
    try:
        yield bare_cluster
    finally:
        reset()


def _database(server: EmbeddedPostgres, owner: str | None = None) -> str:
    name = f"arm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        if owner is not None:
            admin.execute(
                sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                    sql.Identifier(name), sql.Identifier(owner)
                )
            )
    return server.url(name)


def _roles(server: EmbeddedPostgres) -> list[str]:
    with psycopg.connect(server.url()) as admin:
        rows = admin.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY rolname", (list(ROLES),)
        ).fetchall()
    return [r[0] for r in rows]


def test_migrate_without_createrole_prints_the_sql_a_dba_runs_once_and_changes_nothing(
    no_roles: EmbeddedPostgres,
) -> None:
    login = _new_login(no_roles.url())
    url = as_login(_database(no_roles, owner=login), Login(login, ()))
    env = {"DATABASE_URL": url, "PATH": "/usr/bin:/bin"}

    refused = subprocess.run(
        [ARM_CORE, "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1, refused
    assert "arm_owner, arm_bridge, arm_api, arm_uploader, arm_readonly do not exist" in (
        refused.stderr
    )
    assert f'"{login}" may not create roles' in refused.stderr
    printed = _dba_sql(refused.stderr)
    assert "CREATE ROLE %I NOLOGIN" in printed  # db/roles.sql
    assert printed.rstrip().endswith(f"GRANT arm_owner TO {login};")
    assert _roles(no_roles) == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regnamespace('arm')").fetchone() == (None,)

    with psycopg.connect(no_roles.url(), autocommit=True) as dba:
        dba.execute(printed)
        dba.execute(printed)  # harmless when run again
    assert _roles(no_roles) == sorted(ROLES)

    done = subprocess.run(
        [ARM_CORE, "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done
    with dict_conn(url) as conn:
        assert functions(conn)["apply_envelopes_v2"]["callers"] == ["arm_bridge"]


def dbas_migrating_login_sql() -> str:
    """docs/dbas.md's block that makes the migrating login and its database, but for its
    `\\password` line (psql asks for a password on a terminal)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "dbas.md").read_text()
    section = page.split('<a id="the-migrating-login"></a>', 1)[1]
    found = re.search(r"```sql\n(.*?)```", section, flags=re.S)
    assert found, "dbas.md: no SQL under The migrating login"
    return "\n".join(line for line in found[1].splitlines() if not line.startswith("\\password"))


def test_the_dbas_migrating_login_migrates_once_the_roles_are_made(
    no_roles: EmbeddedPostgres,
) -> None:
    """The login and database of docs/dbas.md, made by its SQL in psql as a superuser:
    migrate as that login prints the DBA's SQL, and once it ran, migrates."""
    block = dbas_migrating_login_sql()
    assert "CREATE ROLE arm_migrator LOGIN" in block
    psql = [str(find_pg_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
    try:
        made = subprocess.run(
            [*psql, no_roles.url()], input=block, capture_output=True, text=True, timeout=60
        )
        assert made.returncode == 0, made.stderr
        url = as_login(no_roles.url("arm"), Login("arm_migrator", ()))
        env = {"DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
        refused = subprocess.run(
            [ARM_CORE, "migrate"], env=env, capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 1, refused
        with psycopg.connect(no_roles.url(), autocommit=True) as dba:
            dba.execute(_dba_sql(refused.stderr))
        done = subprocess.run(
            [ARM_CORE, "migrate"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done
        with dict_conn(url) as conn:
            me = conn.execute(
                "SELECT rolsuper, rolcreaterole, pg_has_role('arm_owner', 'USAGE') AS owner,"
                " (SELECT datdba::regrole::text FROM pg_database WHERE datname = 'arm') AS db"
                " FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
            assert me == {"rolsuper": False, "rolcreaterole": False, "owner": True,
                          "db": "arm_migrator"}  # fmt: skip
            assert functions(conn)["apply_envelopes_v2"]["callers"] == ["arm_bridge"]
    finally:
        with psycopg.connect(no_roles.url(), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS arm WITH (FORCE)")
            admin.execute("DROP ROLE IF EXISTS arm_migrator")


def test_migrate_with_createrole_creates_the_roles_itself(no_roles: EmbeddedPostgres) -> None:
    login = _new_login(no_roles.url(), createrole=True)
    url = as_login(_database(no_roles, owner=login), Login(login, ()))
    migrate(url)
    assert _roles(no_roles) == sorted(ROLES)
    with dict_conn(url) as conn:
        assert functions(conn)["retry_file"]["owner"] == "arm_owner"
        assert scalar(conn, "SELECT pg_has_role(current_user, 'arm_owner', 'USAGE')")


def test_a_migrate_that_meets_a_role_another_one_is_creating_goes_on(
    no_roles: EmbeddedPostgres,
) -> None:
    """Roles are the cluster's: migrates of two databases may create them at the same time.
    Here the other one holds arm_owner created and not yet committed; this migrate's
    CREATE ROLE waits for it, fails on the duplicate when it commits, and carries on."""
    url = _database(no_roles)
    dbname = url.rsplit("/", 1)[1]
    with (
        psycopg.connect(no_roles.url()) as other,  # a transaction left open
        psycopg.connect(no_roles.url(), autocommit=True) as watch,
    ):
        other.execute("CREATE ROLE arm_owner NOLOGIN")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(migrate, url)

            def waiting() -> bool:
                return running.done() or watch.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND wait_event_type = 'Lock'",
                    (dbname,),
                ).fetchone() == (1,)

            wait_for_sync(waiting, 20, "migrate met the other CREATE ROLE")
            other.commit()
            report = running.result(timeout=60)
    assert report.applied_migrations
    assert _roles(no_roles) == sorted(ROLES)


def test_concurrent_migrates_of_databases_of_one_cluster_all_succeed(
    no_roles: EmbeddedPostgres,
) -> None:
    urls = [_database(no_roles) for _ in range(4)]
    barrier = threading.Barrier(len(urls))

    def run(url: str) -> list[str]:
        barrier.wait(timeout=30)
        return migrate(url).applied_migrations

    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        reports = list(pool.map(run, urls))
    assert all(reports)
    assert _roles(no_roles) == sorted(ROLES)
