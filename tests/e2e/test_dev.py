"""`arm-core dev` as a newcomer runs it: the demo files reach their final statuses, the
API answers, Ctrl-C stops everything it started, and a second run reuses its data. Its
stdout is a readable feed — the console's URL first, then the banner and the status
changes — with the processes' logs in files under the dev folder, or on stderr when
DEBUG is set."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.devtools.testbed.processes import ARM_CORE

pytestmark = pytest.mark.e2e

FAST = {
    "ACK_TIMEOUT_SECONDS": "0.5",
    "OUTBOX_POLL_SECONDS": "0.2",
    "SCHEDULE_TICK_SECONDS": "0.2",
    "TIMEOUT_SWEEP_SECONDS": "1",
    "TABULAR_REPLY_TIMEOUT_SECONDS": "3",
    "IMAGE_REPLY_TIMEOUT_SECONDS": "3",
    "REFERENCE_DELAY_SECONDS": "0.1",
}


# A log line of either format: a timestamp first, or a JSON object.
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d|\{)")


def run_dev(dev_dir: Path, log: Path, **env: str) -> tuple[subprocess.Popen[bytes], int]:
    """`arm-core dev`, its stdout in `log`, its stderr in `log` + ".err"."""
    port = free_port()
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "NATS_URL", "DEBUG", "LOG_FORMAT")
    }
    full.update(FAST, ARM_DEV_DIR=str(dev_dir), HTTP_PORT=str(port), **env)
    out, err = open(log, "wb"), open(errors_of(log), "wb")
    proc = subprocess.Popen([ARM_CORE, "dev"], env=full, stdout=out, stderr=err)
    return proc, port


def errors_of(log: Path) -> Path:
    return log.with_name(log.name + ".err")


def wait_text(log: Path, text: str, within: float) -> str:
    wait_for_sync(
        lambda: text in log.read_text(errors="replace"),
        within,
        lambda: f"{text!r} printed:\n{log.read_text(errors='replace')[-4000:]}",
        every=0.2,
    )
    return log.read_text(errors="replace")


def alive(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True, check=False)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def left_behind(text: str) -> list[str]:
    """What of a run whose stdout is `text` still runs or answers after it stopped."""
    url = re.search(r"psql '(postgresql://[^']+)'", text)
    nats_port = re.search(r"NATS\s+nats://127.0.0.1:(\d+)", text)
    assert url is not None and nats_port is not None
    found = alive(f"nats-server.*{nats_port.group(1)}")
    try:
        psycopg.connect(url.group(1), connect_timeout=2).close()
        found.append(f"PostgreSQL at {url.group(1)}")
    except psycopg.OperationalError:
        pass
    return found


def stored_files(text: str) -> int:
    url = re.search(r"psql '(postgresql://[^']+)'", text)
    assert url is not None
    with psycopg.connect(url.group(1)) as conn:
        row = conn.execute("SELECT count(*) FROM arm.stored_file").fetchone()
    assert row is not None
    return int(row[0])


def test_dev_runs_the_demo_stops_cleanly_and_a_second_run_reuses_its_data(
    tmp_path: Path,
) -> None:
    """The first run as a newcomer's; the second with DEBUG and LOG_FORMAT=json (its logs
    stay on stderr) and the scan reference alone (a team tests its tabular service in
    its place: the banner promises nothing for the tabular files)."""
    dev_dir = tmp_path / "dev"
    log = tmp_path / "dev1.log"
    proc, port = run_dev(dev_dir, log)
    try:
        text = wait_text(log, "every demo file reached a final status", 60)
        first_files = stored_files(text)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    for line in (
        "ok ОСВ 60 сентябрь 2026.xlsx: attempt 1 done",
        "ok Акт сверки (скан).pdf: attempt 1 done",
        "!! ОСВ повреждённая [fail].xlsb: attempt 1 error (UNSUPPORTED_FORMAT)",
        "!! Счёт-фактура [noack].png: attempt 1 dlq (NO_ACK)",
        "!! ОСВ 41 [silent].xlsx: attempt 1 timeout (TIMEOUT)",
    ):
        assert line in text
    assert f"http://127.0.0.1:{port}/healthcheck" in text
    assert "arm-core dev stopped" in log.read_text()
    # The feed is readable: the console first, no log line on stdout nor stderr.
    assert text.splitlines()[0] == f"console: http://127.0.0.1:{port}/"
    assert [line for line in text.splitlines() if LOG_LINE.match(line)] == []
    assert errors_of(log).read_text() == ""
    # The logs are in the files the banner names: the reference services' apart.
    serve_log, reference_log = (
        dev_dir / "logs" / "serve.log",
        dev_dir / "logs" / "reference.log",
    )
    assert f"logs         {serve_log} (API, bridge), {reference_log}" in text
    served, referenced = serve_log.read_text(), reference_log.read_text()
    assert "action=nats_connected" in served and "action=inbox_batch" in served
    # The production shape: answers captured by a JetStream stream on the embedded
    # server (its store under the dev folder), read through the durable consumer.
    assert "(answers kept in JetStream stream arm_results)" in text
    assert "from stream arm_results" in served
    assert "action=ref_result" in referenced and "arm_core.devtools.reference" not in served
    assert all(LOG_LINE.match(line) or line.startswith("  ") for line in served.splitlines())
    assert left_behind(text) == []  # nothing it started is left behind
    assert (dev_dir / "postgres").is_dir()  # the data lives under the dev folder

    second = {"DEBUG": "true", "LOG_FORMAT": "json", "REFERENCE_SERVICES": "scan-gateway"}
    log = tmp_path / "dev2.log"
    proc, _ = run_dev(dev_dir, log, **second)
    try:
        wait_text(log, "Status changes:", 60)
        second_files = stored_files(log.read_text())
        # It works on the data it found: its own scan is recognised as the first's was.
        text = wait_text(log, "ok Акт сверки (скан).pdf: attempt 1 done", 60)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    assert (first_files, second_files) == (6, 12)  # the first run's files are still there
    # DEBUG: the logs on stderr (here in JSON, debug lines included), not in the files
    assert serve_log.read_text() == served
    logged = [json.loads(line) for line in errors_of(log).read_text().splitlines()]
    assert any(d.get("action") == "nats_connected" for d in logged)
    assert any(d["level"] == "debug" for d in logged)
    assert "stderr (DEBUG is set)" in text
    promised = dict(re.findall(r"^  \S+  (.+?)\s+→ (.+)$", text, flags=re.M))
    assert promised["ОСВ 60 сентябрь 2026.xlsx"] == "whatever your tabular-parser answers"
    assert promised["Акт сверки (скан).pdf"] == "done"
    assert left_behind(text) == []
