"""`arm-core bridge` as a process: two instances share the work (S-NATS-2), SIGTERM
stops cleanly in the middle of a burst, bad configuration fails at start."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import pytest
from nats.aio.client import Client

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ARM_CORE, ArmProcess, log_lines
from arm_core.devtools.testbed.proxies import NatsProxy
from arm_core.devtools.testbed.services import envelope, send
from arm_core.devtools.testbed.sql import (
    BRIDGE_LOGIN,
    dict_conn,
    job,
    publish,
    scalar,
    upload,
    upload_many,
)
from tests.support.fault_points import program

pytestmark = pytest.mark.integration


def bridge_env(db_url: str, nats_url: str, port: int, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "NATS_URL": nats_url,
        "NATS_ENABLED": "true",
        "BRIDGE_HEALTH_PORT": str(port),
        "OUTBOX_POLL_SECONDS": "0.2",
        "SCHEDULE_TICK_SECONDS": "0.2",
        **extra,
    }


async def test_S_NATS_2_two_instances_one_result_handled_once(
    db_url: str, nats_server: EmbeddedNats, client: Client, tmp_path: Path
) -> None:
    """S-NATS-2: two core instances in queue group arm-core; every envelope is handled by
    exactly one of them and the job row changes once."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(21)]
        publish(conn)
    ports = [free_port(), free_port()]
    procs = [
        # DEBUG: a log line per envelope applied, counted below.
        ArmProcess(
            "bridge", bridge_env(db_url, nats_server.url(), p, DEBUG="true"), tmp_path / f"b{i}.log"
        )
        for i, p in enumerate(ports)
    ]
    try:
        for proc, port in zip(procs, ports, strict=True):
            assert proc.wait_healthy(port)["nats"] == "ok"
        target, others = ups[0], ups[1:]
        await send(
            client, envelope(target.job_id, target.file_id, "done"), f"result:{target.job_id}:1"
        )
        for up in others:  # more traffic, so both instances are seen taking their share
            await send(client, envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1")
        with dict_conn(db_url) as conn:
            await wait_for(lambda: job(conn, target.job_id)["status"] == "done", 15)
            await wait_for(
                lambda: (
                    scalar(
                        conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
                    )
                    == len(others)
                ),
                15,
            )
    finally:
        codes = [p.stop() for p in procs]
    logs = [p.log() for p in procs]
    handled = [log_lines(text, job_id=str(target.job_id), action="result") for text in logs]
    assert sorted(len(h) for h in handled) == [0, 1], handled  # one instance, once
    assert "applied" in "".join(line for lines in handled for line in lines)
    acks = [len(log_lines(text, action="ack")) for text in logs]
    assert sum(acks) == len(others) and min(acks) > 0, acks  # both instances worked
    assert codes == [0, 0]


async def test_sigterm_mid_burst_leaves_nothing_half_done(
    db_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """SIGTERM in the middle of a burst: the bridge reaches nats-server through a proxy
    that holds everything it sends after its 250th message, so when the signal lands
    the publisher is waiting for the confirmation of a batch and no batch after the
    first two can be confirmed. Once the bridge is stopping (its LISTEN connection has
    gone) the proxy lets it all through: the batches in flight finish, no new one
    starts, the process exits 0, every job is queued or fully published, in whole
    batches, with no transaction left open, and a restarted bridge publishes the
    rest."""
    n = 4000
    with dict_conn(db_url) as conn:
        upload_many(conn, n)
    assert nats_server.port is not None
    proxy = await NatsProxy(nats_server.port).start()
    proxy.hold_after(250)  # the first batch of 100 goes through, the burst stops in the third
    port = free_port()
    proxied = bridge_env(  # unpaced: the burst goes out in full batches, nobody answers
        db_url, f"nats://127.0.0.1:{proxy.port}", port, OUTBOX_BATCH_SIZE="100", PACING="off"
    )
    proc = ArmProcess("bridge", proxied, tmp_path / "b.log")
    published = "SELECT count(*) FROM arm.recognition_job WHERE status = 'published'"
    listening = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE query LIKE 'LISTEN %%' AND usename = %s AND datname = current_database()"
    )
    try:
        with dict_conn(db_url) as conn:
            await wait_for(
                lambda: proxy.holding and scalar(conn, published) >= 100,
                30,
                lambda: f"a batch held in flight: {proc.log()[-2000:]}",
            )
            await wait_for(lambda: scalar(conn, listening, (BRIDGE_LOGIN.name,)) == 1, 10)
            proc.proc.send_signal(signal.SIGTERM)
            await wait_for(
                lambda: scalar(conn, listening, (BRIDGE_LOGIN.name,)) == 0,
                30,
                "the bridge stopping: its LISTEN connection closed",
            )
            assert proxy.holding  # nothing of the batch in flight has been confirmed
            proxy.release()
            code = await asyncio.to_thread(proc.proc.wait, 30)
            assert proc.stop() == code == 0
            mid = scalar(conn, published)
            # The batches confirmed before the hold (1 or 2), and those in flight at the
            # signal (OUTBOX_PUBLISHERS = 2 at most) if their confirmation came before
            # its timeout (else they rolled back): whole batches, far from the burst.
            assert 100 <= mid <= 400 < n
            assert mid % 100 == 0
            assert (
                scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in%%'")
                == 0
            )
            half_done = scalar(
                conn,
                "SELECT count(*) FROM arm.recognition_job WHERE status = 'published' "
                "AND (request_msg_id IS NULL OR reply_deadline IS NULL)",
            )
            assert half_done == 0
            assert scalar(conn, "SELECT count(*) FROM arm.recognition_job") == n
            direct = bridge_env(
                db_url, nats_server.url(), port, OUTBOX_BATCH_SIZE="100", PACING="off"
            )
            again = ArmProcess("bridge", direct, tmp_path / "b2.log")
            try:
                again.wait_healthy(port)
                await wait_for(lambda: scalar(conn, published) == n, 60, "rest published")
            finally:
                assert again.stop() == 0
    finally:
        if proc.proc.poll() is None:
            proc.kill()
        await proxy.close()
    assert "bridge stopped" in proc.log()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("NATS_ENABLED", "sometimes"), ("OUTBOX_POLL_SECONDS", "-5"), ("DATABASE_URL", "mysql://x")],
)
def test_bad_configuration_fails_at_start_naming_the_variable(
    db_url: str, variable: str, value: str
) -> None:
    env = {"DATABASE_URL": db_url, variable: value, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [ARM_CORE, "bridge"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert f"configuration error: {variable}: " in done.stderr


async def test_a_loop_that_keeps_crashing_stops_the_process_draining_exit_1(
    db_url: str, nats_server: EmbeddedNats, client: Client, tmp_path: Path
) -> None:
    """The schedule's loop raises on every turn (a fault point armed in the process:
    tests/support/fault_points.py): it is restarted
    SERVICE_RESTART_LIMIT times, then the process stops as on SIGTERM and exits 1. The
    drain is the SIGTERM one: 20 acks held in the inbox (a DBA's transaction holds their
    jobs, so the database calls them busy) are applied once the lock goes, after the
    fatal line, before the process exits."""
    n = 20
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(n)]
        publish(conn)
    port = free_port()
    env = bridge_env(db_url, nats_server.url(), port, SERVICE_RESTART_LIMIT="3")
    proc = ArmProcess("bridge", env, tmp_path / "b.log", program("schedule=-1"))
    processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
    try:
        proc.wait_healthy(port)
        with dict_conn(db_url) as dba, dict_conn(db_url) as conn:
            dba.execute("BEGIN")
            dba.execute("SELECT id FROM arm.recognition_job FOR UPDATE").fetchall()
            for up in ups:
                await send(
                    client, envelope(up.job_id, up.file_id, "processing"), f"ack:{up.job_id}:1"
                )
            await wait_for(
                lambda: bool(log_lines(proc.log(), action="service_failed", service="schedule")),
                30,
                lambda: f"the schedule given up on: {proc.log()[-2000:]}",
            )
            assert proc.proc.poll() is None  # still draining: the acks wait for the lock
            assert scalar(conn, processing) == 0
            dba.execute("ROLLBACK")
            code = await asyncio.to_thread(proc.proc.wait, 30)
            assert code == 1
            assert scalar(conn, processing) == n
    finally:
        if proc.proc.poll() is None:
            proc.kill()
    log = proc.log()
    assert len(log_lines(log, action="service_crashed", service="schedule")) == 3
    assert "arm-core: stopped: schedule crashed 4 times within 300 s" in log
    assert log_lines(log, action="bridge_stopped", count="0")


@pytest.mark.parametrize("moment", ["first log line", "retrying NATS"])
async def test_sigterm_during_start_up_with_nothing_reachable_stops_it(
    moment: str, tmp_path: Path
) -> None:
    """Neither the database nor NATS answers (free ports nobody listens on), and SIGTERM
    comes while the bridge starts: as soon as it logs, or once it is retrying NATS. It
    stops, saying so, and exits 0 — start-up waits for neither, and a cancellation the
    NATS client's connect loop loses is sent again."""
    env = bridge_env(
        f"postgresql://arm@127.0.0.1:{free_port()}/arm",
        f"nats://127.0.0.1:{free_port()}",
        free_port(),
        DEBUG="true",
    )
    proc = ArmProcess("bridge", env, tmp_path / "bridge.log")
    try:
        wanted = "bridge health on" if moment == "first log line" else "action=nats_error"
        await wait_for(lambda: wanted in proc.log(), within=30, what=proc.log)
    finally:
        assert proc.stop() == 0, proc.log()
    assert log_lines(proc.log(), action="bridge_stopped"), proc.log()
