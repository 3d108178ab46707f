"""pg_cron for real: a PostgreSQL of its own with
shared_preload_libraries = 'pg_cron', arm.schedule_with_pg_cron() called by a DBA of
arm_owner, and the timeout sweep happening with no bridge running — pg_cron alone calls
arm.run_due_tasks(). Skipped where the extension is not installed (Debian:
postgresql-15-cron, which `.ci/run` installs).

pg_cron 1.4 (Debian's) schedules by the minute, so the sweep comes at the next minute
boundary: this test waits up to about a minute for it (deadline 150 s)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from arm_core.devtools.embedded_postgres import EmbeddedPostgres, find_pg_bindir
from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.devtools.testbed.sql import (
    OWNER_LOGIN,
    Conn,
    ack,
    as_login,
    ensure_logins,
    job,
    publish,
    scalar,
    stored_file,
    upload,
)
from arm_core.migrate import migrate

CRON_DB = "arm_cron"
JOB_NAME = "arm-run-due-tasks"
INSTALL_HINT = "apt-get install postgresql-15-cron"
# pg_cron 1.4 runs a job at the start of a minute: the next boundary is under 60 s away.
SWEEP_DEADLINE_SECONDS = 150.0


def _pg_cron_files() -> list[Path]:
    """Where the server of the suite (find_pg_bindir) would find pg_cron: its library
    (pg_cron.so under pkglibdir) and its control file (under sharedir/extension)."""
    bindir = find_pg_bindir()
    pg_config = bindir / "pg_config"
    if pg_config.is_file():
        out = subprocess.run(
            [str(pg_config), "--pkglibdir", "--sharedir"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        lines = out.stdout.split()
        if out.returncode == 0 and len(lines) == 2:
            return [Path(lines[0]) / "pg_cron.so", Path(lines[1]) / "extension/pg_cron.control"]
    # No pg_config beside the server: Debian's layout (/usr/lib/postgresql/15/bin).
    major = bindir.parent.name
    return [
        bindir.parent / "lib/pg_cron.so",
        Path(f"/usr/share/postgresql/{major}/extension/pg_cron.control"),
    ]


def _missing_pg_cron() -> str | None:
    missing = [str(path) for path in _pg_cron_files() if not path.is_file()]
    if missing:
        return f"pg_cron is not installed ({', '.join(missing)} missing): {INSTALL_HINT}"
    return None


def _connect(url: str) -> Conn:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


@pytest.fixture(scope="module")
def cron_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL that preloads pg_cron, its scheduler on database arm_cron, jobs run in
    background workers (no login by password), with arm migrated and pg_cron created."""
    reason = _missing_pg_cron()
    if reason is not None:
        pytest.skip(reason)
    server = EmbeddedPostgres(
        base_dir=tmp_path_factory.mktemp("pg_cron"),
        settings={
            "shared_preload_libraries": "pg_cron",
            "cron.database_name": CRON_DB,
            "cron.use_background_workers": "on",
        },
    )
    server.start()
    try:
        server.create_database(CRON_DB)
        url = server.url(CRON_DB)
        migrate(url)
        ensure_logins(url)
        with _connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
            # docs/dbas.md (pg_cron): a DBA who is not a superuser schedules their own jobs.
            conn.execute(f"GRANT USAGE ON SCHEMA cron TO {OWNER_LOGIN.name}")
        yield server
    finally:
        server.destroy()


def test_pg_cron_sweeps_with_no_bridge_running(cron_server: EmbeddedPostgres) -> None:
    url = cron_server.url(CRON_DB)
    with _connect(url) as conn, _connect(as_login(url, OWNER_LOGIN)) as dba:
        # Called twice by the DBA: one job, the same id, every minute on pg_cron 1.4.
        first = scalar(dba, "SELECT arm.schedule_with_pg_cron()")
        second = scalar(dba, "SELECT arm.schedule_with_pg_cron()")
        assert first == second
        jobs = conn.execute(
            "SELECT jobid, schedule, command, database, username, active FROM cron.job"
        ).fetchall()
        version = scalar(conn, "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'")
        seconds = not version.startswith(("1.0", "1.1", "1.2", "1.3", "1.4"))
        assert jobs == [
            {
                "jobid": first,
                "schedule": "10 seconds" if seconds else "* * * * *",
                "command": "SELECT * FROM arm.run_due_tasks()",
                "database": CRON_DB,
                "username": OWNER_LOGIN.name,
                "active": True,
            }
        ]

        # A job past its reply deadline (processing, deadline now), and a sweep due every
        # second, set as the owner role — nothing but pg_cron calls run_due_tasks here.
        up = upload(conn)
        publish(conn, tabular_timeout=0)
        ack(conn, up.job_id, up.file_id)
        dba.execute(
            "SELECT arm.set_periodic_task('sweep_timeouts', 'arm.sweep_timeouts()', "
            "interval '1 second')"
        )
        assert job(conn, up.job_id)["status"] == "processing"

        wait_for_sync(
            lambda: job(conn, up.job_id)["status"] == "timeout",
            SWEEP_DEADLINE_SECONDS,
            "the job timed out by pg_cron's call of arm.run_due_tasks()",
            every=0.5,
        )
        swept = job(conn, up.job_id)
        assert swept["error_code"] == "TIMEOUT"
        assert stored_file(conn, up.file_id)["status"] == "ERROR"
        task = conn.execute(
            "SELECT last_result, last_error, run_count FROM arm.periodic_task "
            "WHERE name = 'sweep_timeouts'"
        ).fetchone()
        assert task is not None and task["last_error"] is None and task["run_count"] >= 1

        # The run that did it is pg_cron's: a succeeded run of our job around the sweep.
        def run_of_the_sweep() -> dict[str, Any] | None:
            row: dict[str, Any] | None = conn.execute(
                "SELECT status, command, return_message, start_time, end_time "
                "FROM cron.job_run_details WHERE jobid = %s AND status = 'succeeded' "
                "AND start_time <= %s AND end_time >= %s",
                (first, swept["finished_at"], swept["finished_at"]),
            ).fetchone()
            return row

        wait_for_sync(
            lambda: run_of_the_sweep() is not None,
            30,
            "its run in cron.job_run_details",
            every=0.5,
        )
        run = run_of_the_sweep()
        assert run is not None and run["command"] == "SELECT * FROM arm.run_due_tasks()"

        # The way off: the job goes, a second call finds nothing.
        assert scalar(dba, "SELECT arm.unschedule_pg_cron()") == 1
        assert scalar(conn, "SELECT count(*) FROM cron.job") == 0
        assert scalar(dba, "SELECT arm.unschedule_pg_cron()") == 0
        # Scheduling again after the way off works (a new job).
        again = scalar(dba, "SELECT arm.schedule_with_pg_cron()")
        assert scalar(conn, "SELECT count(*) FROM cron.job") == 1
        assert again != first
        assert scalar(conn, "SELECT arm.unschedule_pg_cron()") == 1


def test_unschedule_is_harmless_without_pg_cron(conn: Conn) -> None:
    """The way off on the suite's database, which has no pg_cron: nothing to remove, no
    error (the way on raises: test_transitions)."""
    assert scalar(conn, "SELECT arm.unschedule_pg_cron()") == 0
