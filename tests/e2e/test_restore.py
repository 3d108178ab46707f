"""A database restored to an earlier point while NATS and the services remember later
messages (docs/dbas.md "Backup and restore").

A flow of uploads runs through two bridges on the results stream, with the reference
services answering through JetStream. Mid-flow a base backup is taken (pg_basebackup with
its WAL); the flow goes on, and every job is done. Then the database is lost: its server
is killed, and the backup is started on another port — the database as it was when the
backup ended — with new bridges on it, against the same NATS and services.

What the restored database says of the jobs done after the backup is older: they are
queued, published or processing again there, and the services, which remember those jobs,
ack their requests again but send no second result (the contract). So those jobs end
`timeout` at their reply deadline: final, retryable. Nothing is applied twice (one result
object per done job), no job stays live, and the operator's re-drive of
docs/troubleshooting.md brings every file to `done`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import by_status, count
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, listening, running_stack
from arm_core.devtools.testbed.sql import dict_conn, ensure_logins, scalar
from arm_core.migrate import migrate
from tests.support.flow import Flow

pytestmark = pytest.mark.e2e

STREAM = "ARM_RESULTS"
# Short deadlines, so what the restore left behind times out within the test.
ENV = {
    "RESULTS_STREAM": STREAM,
    "ACK_TIMEOUT_SECONDS": "3",
    "OUTBOX_MAX_REPUBLISH": "2",
    "TABULAR_REPLY_TIMEOUT_SECONDS": "8",
    "IMAGE_REPLY_TIMEOUT_SECONDS": "8",
    "TIMEOUT_SWEEP_SECONDS": "1",
}
LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)
RESULTS = "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(base_dir=tmp_path / "primary").start()
    try:
        server.create_database("arm")
        migrate(server.url("arm"))
        ensure_logins(server.url("arm"))
        yield server
    finally:
        server.destroy()


@pytest.fixture
def stack(primary: EmbeddedPostgres, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(primary.url("arm"), tmp_path, ["-js", "-sd", str(tmp_path / "js")])


def redrive_sql() -> str:
    """docs/troubleshooting.md's re-drive, as it stands (the flow uploads tabular files)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
    text = page.read_text(encoding="utf-8")
    marker = text.index("<!-- tested: tests/integration/test_troubleshooting.py")
    block: str = re.findall(r"```sql\n(.*?)```", text[marker:], re.S)[0]
    return block


async def test_a_restore_to_an_earlier_point_leaves_every_file_final_and_nothing_twice(
    primary: EmbeddedPostgres, stack: Stack, tmp_path: Path
) -> None:
    url = primary.url("arm")
    for _ in range(2):
        stack.bridge(**ENV)
    await listening(stack.reference())
    restored = EmbeddedPostgres(base_dir=tmp_path / "restored")
    try:
        with Flow(url, per_step=5, pause=0.05) as flow:
            await wait_for(lambda: count(url, DONE) >= 50, 60, lambda: str(by_status(url)))
            restored.restore_base_backup_of(primary)  # mid-flow
            await wait_for(lambda: flow.uploaded >= 250, 60, "more uploads after the backup")
            uploaded = flow.stop()
        await wait_for(lambda: count(url, LIVE) == 0, 60, lambda: str(by_status(url)))
        assert by_status(url) == {"done": uploaded}

        # The database is lost; its backup comes back, behind NATS and the services.
        for proc in stack.procs:
            if proc.command == "bridge":
                proc.stop()
        primary.kill()
        restored.start()
        back = restored.url("arm")
        with dict_conn(back) as conn:
            in_backup = scalar(conn, "SELECT count(*) FROM arm.recognition_job")
            live_in_backup = scalar(conn, LIVE)
        assert 0 < in_backup < uploaded and live_in_backup > 0, (in_backup, live_in_backup)
        for _ in range(2):
            stack.bridge(DATABASE_URL=back, **ENV)

        # What the backup had live ends final: done where an answer still came, timeout
        # where the services had answered already; none stays live, none twice.
        await wait_for(lambda: count(back, LIVE) == 0, 90, lambda: str(by_status(back)))
        settled = by_status(back)
        assert set(settled) <= {"done", "timeout", "dlq"}, settled
        assert count(back, RESULTS) == settled.get("done", 0)  # one result each
        print(
            f"\nFIGURE restore: {uploaded} uploaded, {in_backup} in the backup "
            f"({live_in_backup} live there); after the restore: {settled}"
        )

        # The operator's re-drive (docs/troubleshooting.md) for each pipeline: all done.
        with dict_conn(back) as conn:
            conn.execute(redrive_sql())
        await wait_for(
            lambda: count(back, "SELECT count(*) FROM arm.stored_file f JOIN "
                          "arm.recognition_job j ON j.id = f.current_recognition_job_id "
                          "WHERE j.status <> 'done'") == 0,
            90,
            lambda: str(by_status(back)),
        )  # fmt: skip
        with dict_conn(back) as conn:
            files = scalar(conn, "SELECT count(*) FROM arm.stored_file")
            assert files == in_backup
            assert scalar(conn, RESULTS) == files  # one result per file's done job
    finally:
        restored.destroy()
