"""LOG_FORMAT as users set it: a real `arm-core bridge` with
LOG_FORMAT=json writes one JSON object a line for a job's whole path (publish, ack,
result), typed and with UTC milliseconds; a forged job_id stays inside its one line and
reads back as it was; no secret is written; and any other value of LOG_FORMAT stops the
process at start, naming the variable. The formats themselves: tests/unit/test_logs.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ARM_CORE, ArmProcess, Stack, listening
from arm_core.devtools.testbed.services import envelope, nats_client, send
from arm_core.devtools.testbed.sql import dict_conn, upload

pytestmark = pytest.mark.e2e

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
DB_PASSWORD = "Db-S3cret-9xQ2-json"


def records(text: str) -> list[dict[str, Any]]:
    """Every line of a JSON log, parsed; a line that is not one JSON object fails."""
    parsed = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            doc = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line!r}") from None
        assert isinstance(doc, dict), line
        assert STAMP.match(doc["timestamp"]), line
        assert {"level", "logger", "message"} <= doc.keys(), line
        parsed.append(doc)
    return parsed


def about(docs: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    return [d for d in docs if all(d.get(k) == v for k, v in fields.items())]


def job_status(db_url: str, job_id: uuid.UUID) -> str:
    with dict_conn(db_url) as conn:
        row = conn.execute(
            "SELECT status::text AS status FROM arm.recognition_job WHERE id = %s", (job_id,)
        ).fetchone()
    return row["status"] if row else "missing"


async def test_a_bridge_logs_a_jobs_whole_path_in_json(stack: Stack) -> None:
    # DEBUG: the per-job lines (published, applied) are debug lines; psycopg's and
    # nats-py's own lines must parse as well.
    bridge = stack.bridge(LOG_FORMAT="json", DEBUG="true")
    await listening(stack.reference())  # else the 1 s ack timeout may run out first
    with dict_conn(stack.db_url) as conn:
        up = upload(conn, "XLSX")
    await wait_for(lambda: job_status(stack.db_url, up.job_id) == "done", 30, bridge.log)
    job = str(up.job_id)
    await wait_for(lambda: bool(about(records(bridge.log()), job_id=job, action="result")), 10)
    assert bridge.stop() == 0
    docs = records(bridge.log())
    lines = about(docs, job_id=job)
    assert {d["action"] for d in lines} >= {"publish", "ack", "result"}, lines
    for d in lines:
        assert d["attempt"] == 1 and d["msg_id"].endswith(f"{job}:1"), d  # a number; text
        assert d["logger"].startswith("arm_core.bridge.")
    assert about(docs, action="bridge", level="info")  # the start line, from the cli
    assert about(docs, action="bridge_stopped")  # and the last


async def test_a_forged_job_id_stays_inside_its_json_line(stack: Stack) -> None:
    bridge = stack.bridge(LOG_FORMAT="json")
    forged = "\n2026-11-30T05:00:00.123Z INFO x\r\x1b[2J\u2028"
    nc = await nats_client(stack.nats.url())
    try:
        body = envelope(uuid.uuid4(), uuid.uuid4(), "done")
        body["job_id"] = forged
        await send(nc, body, f"{uuid.uuid4()}:1")
    finally:
        await nc.close()
    await wait_for(lambda: bool(about(records(bridge.log()), action="inbox_drop")), 20, bridge.log)
    text = bridge.log()
    assert len(text.splitlines()) == text.count("\n")  # only newlines break the lines
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text
    [drop] = about(records(text), action="inbox_drop")
    assert drop["job_id"] == forged and drop["reason"] == "schema" and drop["level"] == "warning"


def test_json_lines_show_no_secret(tmp_path: Path) -> None:
    # libpq quotes an option's value it cannot use, here the password (as a connection
    # string gone wrong might have it), and the pool logs that message on every attempt.
    # Every line parses, and none holds the password.
    url = f"postgresql://admin:{DB_PASSWORD}@127.0.0.1:{free_port()}/arm?sslmode={DB_PASSWORD}"
    env = {
        "DATABASE_URL": url,
        "NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "BRIDGE_HEALTH_PORT": str(free_port()),
        "LOG_FORMAT": "json",
        "DEBUG": "true",
    }
    proc = ArmProcess("bridge", env, tmp_path / "bridge.log")
    try:
        proc.wait_until(lambda: 'invalid sslmode value: \\"***\\"' in proc.log(), 30)
    finally:
        assert proc.stop() == 0
    text = proc.log()
    assert "S3cret" not in text, text
    assert records(text)


@pytest.mark.parametrize("command", ["serve", "bridge", "migrate", "dev"])
def test_an_unknown_log_format_stops_at_start_naming_it(command: str) -> None:
    # Each command refuses at start; which values are refused is the parser's, and
    # tests/unit/test_logs.py checks them without a process each.
    value = "JSONL"
    # The timeout is a deadline on a process that starts instead of refusing.
    done = subprocess.run(
        [ARM_CORE, command],
        env={"PATH": os.environ["PATH"], "LOG_FORMAT": value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"arm-core: configuration error: LOG_FORMAT: expected one of text, json, got {value!r}\n"
    )
    assert done.stdout == ""
