"""The rolling deploy of docs/upgrading.md from the previous release to this tree, every
process real: the previous release (tests/fixtures/previous_release, its wheel) installed
by its own `arm-core migrate`, its two bridges and its `serve` running, the reference
service answering, uploads flowing. Then, without stopping the flow: this tree's
`arm-core migrate`; the previous release's processes carry on against the new schema;
its bridges are replaced one at a time by this tree's, then its `serve`. Failed files
are retried through whichever `serve` runs at each step.

Nothing lost (every file's current job ends `done`, every job answered), nothing applied
twice (each job's result applied once, over every bridge's log), every retry audited
(one arm.retry_audit row per file retried, with the level this tree records, none for
the previous release's), and every process stopped cleanly (exit 0)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arm_core.devtools.release import wheel_version
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import (
    ARM_CORE,
    ArmProcess,
    Stack,
    listening,
    log_lines,
    running_stack,
)
from arm_core.devtools.testbed.sql import Conn, dict_conn, scalar, upload_many
from arm_core.version import installed
from tests.e2e.test_e2e import http
from tests.support.flow import DONE, Flow, applied_results
from tests.support.previous_release import PROGRAM, environment, previous_wheel, unpacked
from tests.support.previous_release import migrate as migrate_previous

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# The form of API_TOKENS the previous release reads, and every 1.x after it (with every
# level, and a WARNING at start).
TOKEN = "ops-token-of-the-rolling-deploy"
SERVE_ENV = {"NATS_ENABLED": "false", "AUTH_MODE": "token", "API_TOKENS": f"ops={TOKEN}"}
# DEBUG: one log line per envelope applied, counted per job. The reply deadline and the
# ack timeout are long (tests/e2e/test_rolling_restart.py says why): a lost answer shows
# as a job left unanswered, never as a quiet timeout or a republish.
BRIDGE_ENV = {
    "DEBUG": "true",
    "OUTBOX_BATCH_SIZE": 50,
    "TABULAR_REPLY_TIMEOUT_SECONDS": 600,
    "ACK_TIMEOUT_SECONDS": 30,
}
PER_STEP = 60  # more jobs done in each step before the next
FAILING = 4  # files of each retry round ("[fail-once]": an error, then done on retry)

CURRENT_NOT_DONE = """
SELECT count(*) FROM arm.stored_file f
JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id
WHERE j.status <> 'done'
"""


@pytest.fixture
def stack(empty_db_url: str, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(empty_db_url, tmp_path)


def version_of(site: Path) -> str:
    """What the previous release's `arm-core --version` says."""
    told = subprocess.run(
        [*PROGRAM, "--version"],
        env={**environment(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return told.stdout.strip().removeprefix("arm-core ")


def says(serve: ArmProcess, api: str) -> str | None:
    """The version GET /healthcheck says (None: a version that does not say)."""
    health = serve.health(int(api.rsplit(":", 1)[1]))
    assert health is not None
    return health.get("version")


async def more_done(conn: Conn, what: str) -> None:
    target = scalar(conn, DONE) + PER_STEP
    await wait_for(lambda: scalar(conn, DONE) >= target, 90, f"{what}: {PER_STEP} more done")


async def retry_round(conn: Conn, api: str, single: bool) -> list[Any]:
    """FAILING files that fail once, retried through `api` once each has failed (one
    request per file, or one batch); returns their ids."""
    suffix = f"-{uuid.uuid4().hex[:8]}[fail-once]"
    upload_many(conn, FAILING, name_suffix=suffix)
    mine = "SELECT id FROM arm.stored_file WHERE original_name LIKE %s ORDER BY id"
    files = [r["id"] for r in conn.execute(mine, (f"%{suffix}",))]
    assert len(files) == FAILING
    failed = (
        "SELECT count(*) FROM arm.stored_file f JOIN arm.recognition_job j "
        "ON j.id = f.current_recognition_job_id WHERE f.id = ANY(%s) AND j.status = 'error'"
    )
    await wait_for(lambda: scalar(conn, failed, (files,)) == FAILING, 60, "the files failed")
    if single:
        for file_id in files:
            code, body = http("POST", f"{api}/api/v1/files/{file_id}/retry", {}, TOKEN)
            assert code == 201, body
    else:
        code, body = http(
            "POST", f"{api}/api/v1/files/retry", {"file_ids": [str(f) for f in files]}, TOKEN
        )
        assert code == 200, body
        assert [r["outcome"] for r in body["results"]] == ["retried"] * FAILING, body
    return files


async def test_a_rolling_deploy_from_the_previous_release_loses_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    site = unpacked(tmp_path / "previous_release")
    previous = wheel_version(previous_wheel())
    assert await asyncio.to_thread(version_of, site) == previous  # what runs below
    old = environment(site)
    migrate_previous(stack.db_url, site)

    stopped: list[tuple[ArmProcess, int]] = []
    retried: dict[Any, str | None] = {}  # file → the level its retry records
    # Processes start and stop off the event loop (tests/e2e/test_rolling_restart.py).
    run = asyncio.to_thread
    await listening(await run(stack.reference))
    bridges = [await run(stack.bridge_as, PROGRAM, **old, **BRIDGE_ENV) for _ in range(2)]
    serve, api = await run(stack.serve_as, PROGRAM, **old, **SERVE_ENV)
    assert says(serve, api) in (None, previous)  # /healthcheck's version came with 1.1
    with Flow(stack.db_url) as flow, dict_conn(stack.db_url) as conn:
        await more_done(conn, f"{previous} alone")
        for file_id in await retry_round(conn, api, single=False):
            retried[file_id] = None  # 1.0.0 records no level (actor_level came with 1.1)

        # This tree's migrate, while the previous release runs.
        done = await run(
            subprocess.run,
            [ARM_CORE, "migrate"],
            env={"DATABASE_URL": stack.db_url, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        await more_done(conn, f"{previous} on the new schema")
        for file_id in await retry_round(conn, api, single=True):
            retried[file_id] = None

        # The bridges, one at a time, then serve.
        for i, bridge in enumerate(bridges):
            stopped.append((bridge, await run(bridge.stop)))
            bridges[i] = await run(stack.bridge, **BRIDGE_ENV)
            await more_done(conn, f"bridge {i + 1} replaced")
        stopped.append((serve, await run(serve.stop)))
        serve, api = await run(stack.serve, **SERVE_ENV)
        assert says(serve, api) == installed()
        for file_id in await retry_round(conn, api, single=False):
            retried[file_id] = "all"  # a token without a level holds every level
        await more_done(conn, "everything replaced")
        uploaded = flow.stop()

    with dict_conn(stack.db_url) as conn:
        # Nothing lost: every file's current job ends done, every job was answered.
        await wait_for(lambda: scalar(conn, CURRENT_NOT_DONE) == 0, 120, "every file done")
        files = scalar(conn, "SELECT count(*) FROM arm.stored_file")
        assert files == uploaded + len(retried)
        jobs = scalar(conn, "SELECT count(*) FROM arm.recognition_job")
        assert jobs == files + len(retried)  # a retry is one more attempt
        assert (
            scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE result_msg_id IS NULL")
            == 0
        )
        # Every retry audited, once, with the level it was made with.
        audit = conn.execute(
            "SELECT file_id, actor, actor_level FROM arm.retry_audit ORDER BY file_id"
        ).fetchall()
        assert {(r["file_id"], r["actor"], r["actor_level"]) for r in audit} == {
            (f, "ops", level) for f, level in retried.items()
        }
        assert len(audit) == len(retried)

    stopped += [
        (p, p.stop()) for p in stack.procs if p.proc.poll() is None and p.command != "reference"
    ]
    assert [(p.command, code) for p, code in stopped if code != 0] == []
    logs = [p.log() for p in stack.procs]
    # Nothing applied twice: each job's result applied once, whichever bridge applied it.
    applied = applied_results(logs)
    assert len(applied) == jobs and set(applied.values()) == {1}
    for text in logs:
        assert not log_lines(text, action="inbox_drop"), log_lines(text, action="inbox_drop")
    # Each release's bridges took answers; this tree's serve warned about the token.
    assert applied_results([p.log() for p, _ in stopped if p.command == "bridge"])
    assert applied_results([p.log() for p in bridges])
    assert log_lines(serve.log(), action="deprecated")
