"""RESULTS_STREAM end to end: kill -9 of the only bridge in the middle
of a burst, restarted seconds later, with nats-server -js. The answers published while
no core instance was running are kept by the stream and applied after the restart:
every job done, every result applied once, nothing left live."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, log_lines, running_stack
from arm_core.devtools.testbed.services import envelope, nats_client
from arm_core.devtools.testbed.sql import dict_conn, scalar, upload_many

pytestmark = pytest.mark.e2e


@pytest.fixture
def js_stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(db_url, tmp_path, ["-js", "-sd", str(tmp_path / "js")])


@dataclass
class SlowService:
    """Acks at once and answers `done` `delay` seconds later, with core NATS publishes.
    Only the first `first` requests are answered on their own; the others wait for
    `release` — so the test decides that answers go out while no bridge runs, however
    fast the machine. Counts what it sent when."""

    client: Client
    delay: float
    first: int = 100
    release: asyncio.Event = field(default_factory=asyncio.Event)
    received: int = 0
    sent: int = 0
    answered: Counter[str] = field(default_factory=Counter)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def on_request(self, msg: Msg) -> None:
        request = json.loads(msg.data)
        job_id, file_id = uuid.UUID(request["job_id"]), uuid.UUID(request["file_id"])
        attempt = request["attempt"]
        held = self.received >= self.first
        self.received += 1
        await self._send(envelope(job_id, file_id, "processing"), f"ack:{job_id}:{attempt}")
        task = asyncio.create_task(self._answer(job_id, file_id, attempt, held))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(
        self, job_id: uuid.UUID, file_id: uuid.UUID, attempt: int, held: bool
    ) -> None:
        await asyncio.sleep(self.delay)  # the service's work, not a wait for a condition
        if held:
            await self.release.wait()
        await self._send(envelope(job_id, file_id, "done"), f"result:{job_id}:{attempt}")
        self.answered[str(job_id)] += 1

    async def _send(self, body: dict[str, object], msg_id: str) -> None:
        data = json.dumps(body).encode()
        await self.client.publish("files.tabular_parsed", data, headers={"Nats-Msg-Id": msg_id})
        self.sent += 1


async def test_kill_9_of_the_only_bridge_loses_nothing_with_the_results_stream(
    js_stack: Stack,
) -> None:
    n = 1000
    stack = js_stack
    service = SlowService(await nats_client(stack.nats.url()), delay=0.5)
    await service.client.subscribe("files.tabular_uploaded", cb=service.on_request)
    await service.client.flush()
    env = {
        "RESULTS_STREAM": "ARM_RESULTS",
        "OUTBOX_BATCH_SIZE": 50,
        "DEBUG": "true",  # a log line per envelope applied, counted below
        # Long: an answer lost would leave its job `processing`, never a quiet timeout.
        "TABULAR_REPLY_TIMEOUT_SECONDS": 600,
        "ACK_TIMEOUT_SECONDS": 30,
        "PACING": "off",  # unpaced: hundreds of answers on their way when the bridge dies
    }
    done = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"
    try:
        with dict_conn(stack.db_url) as conn:
            upload_many(conn, n)
            bridge = stack.bridge(**env)
            await wait_for(lambda: scalar(conn, done) >= 100, 60, "answers being applied")
            # More requests are in the service's hands, their answers held back.
            await wait_for(lambda: service.received >= 300, 60, "300 requests received")
            bridge.proc.send_signal(signal.SIGKILL)
            bridge.proc.wait()
            at_kill = sum(service.answered.values())
            # The held answers go out while no core instance runs: wait for some of them
            # before the restart, so the gap is real.
            service.release.set()
            await wait_for(
                lambda: sum(service.answered.values()) >= at_kill + 20, 30, "answers in the gap"
            )
            restarted = stack.bridge(**env)
            await wait_for(lambda: scalar(conn, done) == n, 180, lambda: f"{n} done")
            assert scalar(conn, "SELECT count(*) FROM arm.recognition_job") == n
            assert (
                scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE status <> 'done'") == 0
            )
        assert restarted.stop() == 0
    finally:
        await service.client.close()
    applied: Counter[str] = Counter()
    for line in log_lines(bridge.log() + restarted.log(), action="result"):
        if "result applied" in line:
            applied[line.split(" job_id=")[1].split()[0]] += 1
    # Never twice. (A kill -9 may land between a batch's commit and its log lines, so
    # the log may name fewer than n; the database's count above is the exact one.)
    assert set(applied.values()) == {1} and len(applied) <= n


def buffered(port: int) -> float:
    """The `arm_inbox_buffered` gauge on a bridge's health port (0 while it does not
    answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("arm_inbox_buffered "):
            return float(line.split()[1])
    return 0


async def test_kill_9_of_one_of_two_bridges_loses_nothing_with_the_results_stream(
    js_stack: Stack,
) -> None:
    """Two bridges consume RESULTS_STREAM; one is killed with answers in its buffers
    (received, not yet applied, so not acked). The stream delivers every one of them again
    to the other after its ack_wait (5 s here): every job done, each result applied once.
    Without the stream those answers are lost (docs/reliability.md)."""
    n = 2000
    stack = js_stack
    env = {
        "RESULTS_STREAM": "ARM_RESULTS",
        "DEBUG": "true",  # a log line per envelope applied
        # Small batches behind a large buffer: answers wait inside a bridge (with the
        # stream, up to two batches per worker are fetched ahead: 40 here).
        "INBOX_BATCH_SIZE": 10,
        "INBOX_BUFFER_SIZE": 200,
        # What A held comes back to B after 5 s, and a job waiting for its ack is not
        # republished meanwhile (ACK_TIMEOUT_SECONDS is far beyond).
        "RESULTS_STREAM_ACK_WAIT_SECONDS": 5,
        "ACK_TIMEOUT_SECONDS": 120,
        "TABULAR_REPLY_TIMEOUT_SECONDS": 600,
        "IMAGE_REPLY_TIMEOUT_SECONDS": 600,
    }
    ports = [free_port(), free_port()]
    bridges = [stack.start("bridge", BRIDGE_HEALTH_PORT=port, **env) for port in ports]
    for bridge, port in zip(bridges, ports, strict=True):
        bridge.wait_healthy(port)
    reference = stack.reference(REFERENCE_DELAY_SECONDS=0)
    await wait_for(
        lambda: bool(log_lines(reference.log(), action="ref_stream")),
        30,
        "the reference on the stream",
    )
    done = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"
    with dict_conn(stack.db_url) as conn:
        upload_many(conn, n, mixed=True)
        await wait_for(lambda: scalar(conn, done) >= n // 5, 60, "a fifth done")
        # The kill lands while the victim holds answers it has not applied yet: a DBA's
        # transaction holds the rows of the jobs in flight, so their answers come back
        # `busy` and wait in the bridges' buffers (not acked) until it ends.
        with psycopg.connect(stack.db_url) as dba:
            dba.execute(
                "SELECT id FROM arm.recognition_job "
                "WHERE status IN ('published', 'processing') FOR UPDATE"
            )
            await wait_for(lambda: buffered(ports[0]) >= 20, 60, "answers waiting in bridge A")
            bridges[0].proc.send_signal(signal.SIGKILL)
            bridges[0].proc.wait()
            killed = time.monotonic()
            dba.rollback()
        await wait_for(lambda: scalar(conn, done) == n, 120, lambda: f"{n} done")
        drained = time.monotonic() - killed
        assert scalar(conn, "SELECT count(*) FROM arm.recognition_job") == n
        results = scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'")
    assert results == n

    def again() -> int:
        return sum(
            int(line.split(" count=")[1].split()[0])
            for line in log_lines(bridges[1].log(), action="inbox_redelivered")
        )

    # The jobs can all be done before A's answers come again: what A held may be acks
    # alone (A fetches no more than two batches per worker ahead, so the results of
    # those jobs went to B). Every message of the stream is acked only once they have.
    nc = await nats_client(stack.nats.url())
    try:
        js = nc.jetstream()

        async def settled() -> bool:
            info = await js.consumer_info("ARM_RESULTS", "arm-core")
            return info.num_ack_pending == 0 and info.num_pending == 0

        await wait_for(settled, 90, "every message of the stream acked")
    finally:
        await nc.close()
    acked = time.monotonic() - killed
    applied: Counter[str] = Counter()
    for line in log_lines(bridges[0].log() + bridges[1].log(), action="result"):
        if "result applied" in line:
            applied[line.split(" job_id=")[1].split()[0]] += 1
    print(
        f"\nkill -9 of one of two bridges, RESULTS_STREAM: {n} jobs, {n} done, 0 lost, "
        f"{again()} answers delivered again to the survivor, all done {drained:.1f} s "
        f"and all acked {acked:.1f} s after the kill"
    )
    # The victim's answers came back through the stream, and none was applied twice.
    assert again() > 0
    assert set(applied.values()) == {1}
