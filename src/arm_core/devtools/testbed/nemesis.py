"""A nemesis: a seeded, replayable schedule of real faults over a steady flow, and a
checker that reads the whole history afterwards (as Jepsen does for NATS and
PostgreSQL), for tests/e2e/test_nemesis.py, `make chaos CHAOS_ARGS=--nemesis` and the
soak (benchmarks/soak.py).

The world: a PostgreSQL and a nats-server (JetStream, file store) of its own; two
`arm-core bridge` processes with RESULTS_STREAM, each reaching PostgreSQL and NATS
through a TCP proxy of its own (so one bridge's path can be cut, or made to drop its
packets with iptables, while the other's works); `arm-core serve` for the API; the
reference services answering through JetStream publish, failing the first attempt of
the files named `[fail-once]`; a steady flow of plain-SQL uploads; and an operator who
double-clicks retry (two requests at once, naming the job they saw) on every failed
file, through the API, while the faults run.

The faults, one after another, each for a random time in its range: SIGSTOP/SIGCONT of
a bridge (longer than the ack timeout); kill -9 of a bridge, started again; kill -9 of
nats-server, started again on its store; SIGSTOP of nats-server; PostgreSQL stopped in
immediate mode, started again; a bridge's path to PostgreSQL or to NATS cut (its proxy
closes every connection and refuses new ones); a bridge's path to PostgreSQL dropping
its packets (nothing is closed: TCP's own deadlines must find it). A fault meets the
flow: it is injected only while jobs are live (queued, published or processing: the
count is read from the database just before, and recorded with the fault).

The history: a trigger records every change of every job row (its transaction, the
status before and after, the result's Nats-Msg-Id), and the database keeps the files,
their attempts and the retry audit. After the schedule the world heals, the operator
retries what is left failed, and :func:`check` reads it all."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import black_hole
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack, listening
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import ensure_logins, upload_many
from arm_core.migrate import migrate

STREAM = "NEMESIS_RESULTS"
ACK_TIMEOUT = 8.0
LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)
FINAL = ("done", "needs_check", "error", "timeout", "dlq")
Click = tuple[str, str, list[int | None]]  # file, the job it named, each answer's status

# The history: every change of a job row, with the transaction that made it.
HISTORY = """
CREATE SCHEMA nemesis;
CREATE TABLE nemesis.job_change (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    old_status text,
    new_status text NOT NULL,
    result_msg_id text
);
CREATE FUNCTION nemesis.record_job_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, nemesis AS $$
BEGIN
    INSERT INTO nemesis.job_change (job_id, old_status, new_status, result_msg_id)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status::text END,
            NEW.status::text, NEW.result_msg_id);
    RETURN NULL;
END;
$$;
CREATE TRIGGER zz_nemesis_history AFTER INSERT OR UPDATE ON arm.recognition_job
    FOR EACH ROW EXECUTE FUNCTION nemesis.record_job_change();
"""


@dataclass
class FaultRecord:
    """A fault as it happened: what, on whom, for how long, and the live jobs it met."""

    kind: str
    target: str
    seconds: float
    live_at_start: int
    started_at: float = 0.0


@dataclass
class Bridge:
    name: str
    pg_proxy: TcpProxy
    nats_proxy: TcpProxy
    proc: ArmProcess | None = None


class Uploads:
    """Plain-SQL uploads on a thread of their own, `per_step` every `pause` seconds, one
    in `fail_every` named `[fail-once]`; a database that is away is waited for."""

    def __init__(self, url: str, per_step: int, pause: float, fail_every: int = 10) -> None:
        self.url, self.per_step, self.pause, self.fail_every = url, per_step, pause, fail_every
        self.steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="uploads")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, connect_timeout=3) as conn:
                    while not self._stop.is_set():
                        self.steps += 1
                        fail = self.steps % self.fail_every == 0
                        suffix = " [fail-once]" if fail else ""
                        upload_many(conn, self.per_step, mixed=True, name_suffix=suffix)
                        self._stop.wait(self.pause)
            except psycopg.Error:
                self._stop.wait(0.5)  # PostgreSQL away (a fault): try again

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@dataclass
class Operator:
    """Retries every failed file through the API with a double click: two requests at
    once, each naming the job the list showed as the file's current one. Keeps each
    click's answer (status code, or None when the request got no clear answer)."""

    api: str
    clicks: list[Click] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.api + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except OSError:
            return None, None

    def failed_files(self) -> list[tuple[str, str]]:
        status, body = self._request("GET", "/api/v1/files?status=ERROR&limit=200")
        if status != 200 or body is None:
            return []
        return [
            (item["id"], item["current_job"]["job_id"])
            for item in body["items"]
            if item.get("retryable") and item.get("current_job")
        ]

    async def round(self) -> int:
        """One look at the failed files and a double click on each new one; how many."""
        found = await asyncio.to_thread(self.failed_files)
        clicked = 0
        for file_id, job_id in found:
            if job_id in self.tried:
                continue
            self.tried.add(job_id)
            path, body = f"/api/v1/files/{file_id}/retry", {"job_id": job_id}
            answers = await asyncio.gather(
                asyncio.to_thread(self._request, "POST", path, body),
                asyncio.to_thread(self._request, "POST", path, body),
            )
            statuses = [status for status, _ in answers]
            self.clicks.append((file_id, job_id, statuses))
            if all(status is None or status >= 500 for status in statuses):
                # No clear answer (the API or its database mid-fault): as an operator
                # would, click again on a later look if the file is still failed.
                self.tried.discard(job_id)
            clicked += 1
        return clicked


# The environment of the nemesis's processes over the Stack's own (processes.py).
ENV: dict[str, Any] = {
    "RESULTS_STREAM": STREAM,
    "OUTBOX_POLL_SECONDS": "0.5",
    "SCHEDULE_TICK_SECONDS": "0.5",
    "ACK_TIMEOUT_SECONDS": str(ACK_TIMEOUT),
    # What a killed or cut-off bridge held comes back to the other within 5 s, not 30.
    "RESULTS_STREAM_ACK_WAIT_SECONDS": "5",
    "OUTBOX_MAX_REPUBLISH": "6",
    "TABULAR_REPLY_TIMEOUT_SECONDS": "300",
    "IMAGE_REPLY_TIMEOUT_SECONDS": "300",
    "REFERENCE_FAIL_CODE": "INVALID_DOCUMENT",
}


class World:
    """The servers, their proxies, and a Stack of the processes (see the module's
    docstring). A bridge's start and stop run off the event loop: it reaches PostgreSQL
    and NATS through proxies the loop serves."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pg = EmbeddedPostgres(base_dir=workdir / "pg")
        self.nats = EmbeddedNats(
            log_dir=workdir / "nats", extra_args=["-js", "-sd", str(workdir / "js")]
        )
        self.stack = Stack(
            db_url="",
            nats=self.nats,
            tmp=workdir,
            results=workdir / "results",
            defaults=ENV,
            healthy_within=60,
        )
        self.bridges: list[Bridge] = []
        self.serve: ArmProcess | None = None
        self.reference: ArmProcess | None = None
        self.api = ""

    @property
    def db_url(self) -> str:
        return self.stack.db_url

    async def start(self) -> None:
        await asyncio.to_thread(self.pg.start)
        await asyncio.to_thread(self.nats.start)
        self.pg.create_database("arm")
        self.stack.db_url = self.pg.url("arm")
        with psycopg.connect(self.pg.url(), autocommit=True) as conn:
            # Durable as in production: a crash must not lose a commit it reported.
            conn.execute('ALTER DATABASE "arm" SET synchronous_commit = on')
        await asyncio.to_thread(migrate, self.db_url)
        await asyncio.to_thread(ensure_logins, self.db_url)
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute(HISTORY)
        assert self.pg.port is not None and self.nats.port is not None
        for name in ("a", "b"):
            bridge = Bridge(
                name,
                await TcpProxy(self.pg.port).start(),
                await TcpProxy(self.nats.port).start(),
            )
            self.bridges.append(bridge)
            await self.start_bridge(bridge)
        self.serve, self.api = await asyncio.to_thread(self.stack.serve, NATS_ENABLED="false")
        self.reference = await listening(self.stack.reference(), within=60)

    def reference_log(self) -> str:
        return self.reference.log() if self.reference else ""

    async def start_bridge(self, bridge: Bridge) -> None:
        bridge.proc = await asyncio.to_thread(
            self.stack.bridge,
            DATABASE_URL=self.db_url.replace(f":{self.pg.port}/", f":{bridge.pg_proxy.port}/"),
            NATS_URL=f"nats://127.0.0.1:{bridge.nats_proxy.port}",
        )

    def processes(self) -> list[ArmProcess]:
        """The current ones (not the bridges killed and started again)."""
        current = [b.proc for b in self.bridges if b.proc is not None]
        return [*current, *(p for p in (self.serve, self.reference) if p is not None)]

    async def stop(self) -> None:
        await asyncio.to_thread(self.stack.stop_all)
        for bridge in self.bridges:
            await bridge.pg_proxy.close()
            await bridge.nats_proxy.close()
        await asyncio.to_thread(self.nats.stop)
        await asyncio.to_thread(self.pg.destroy)


def scalar(url: str, sql: str) -> int | None:
    """None while the database does not answer (a fault may be under way)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(sql).fetchone()
    except psycopg.OperationalError:
        return None
    return int(row[0]) if row is not None and row[0] is not None else None


# --- the faults ---------------------------------------------------------------------------

Fault = Callable[["World", Bridge, float], Awaitable[None]]


async def pause_bridge(world: World, bridge: Bridge, seconds: float) -> None:
    assert bridge.proc is not None
    bridge.proc.proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(seconds)  # the fault's length, not a wait for a condition
    bridge.proc.proc.send_signal(signal.SIGCONT)


async def kill_bridge(world: World, bridge: Bridge, seconds: float) -> None:
    assert bridge.proc is not None
    bridge.proc.kill()
    await asyncio.sleep(seconds)
    await world.start_bridge(bridge)


async def kill_nats(world: World, bridge: Bridge, seconds: float) -> None:
    await asyncio.to_thread(world.nats.kill)
    await asyncio.sleep(seconds)
    await asyncio.to_thread(world.nats.start)


async def pause_nats(world: World, bridge: Bridge, seconds: float) -> None:
    pid = world.nats.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


async def postgres_immediate(world: World, bridge: Bridge, seconds: float) -> None:
    await asyncio.to_thread(world.pg.stop, "immediate")
    await asyncio.sleep(seconds)
    await asyncio.to_thread(world.pg.start)


async def cut_postgres(world: World, bridge: Bridge, seconds: float) -> None:
    bridge.pg_proxy.block()
    await asyncio.sleep(seconds)
    bridge.pg_proxy.unblock()


async def cut_nats(world: World, bridge: Bridge, seconds: float) -> None:
    bridge.nats_proxy.block()
    await asyncio.sleep(seconds)
    bridge.nats_proxy.unblock()


async def drop_postgres_packets(world: World, bridge: Bridge, seconds: float) -> None:
    with black_hole(bridge.pg_proxy.port):
        await asyncio.sleep(seconds)


# kind → (the fault, its shortest and longest length in seconds)
FAULTS: dict[str, tuple[Fault, float, float]] = {
    "pause_bridge": (pause_bridge, ACK_TIMEOUT + 1, ACK_TIMEOUT + 6),
    "kill_bridge": (kill_bridge, 0.5, 4),
    "kill_nats": (kill_nats, 0.5, 4),
    "pause_nats": (pause_nats, 2, 8),
    "postgres_immediate": (postgres_immediate, 0.5, 4),
    "cut_postgres": (cut_postgres, 3, 12),
    "cut_nats": (cut_nats, 3, 12),
    "drop_postgres_packets": (drop_postgres_packets, 10, 35),
}


@dataclass
class Schedule:
    """The faults a seed gives, in order: (kind, bridge index, seconds, pause after)."""

    seed: int
    steps: list[tuple[str, int, float, float]]

    @classmethod
    def of(cls, seed: int, faults: int, kinds: list[str] | None = None) -> Schedule:
        rng = random.Random(seed)
        names = kinds or sorted(FAULTS)
        steps = []
        for _ in range(faults):
            kind = rng.choice(names)
            _, low, high = FAULTS[kind]
            steps.append((kind, rng.randrange(2), round(rng.uniform(low, high), 1),
                          round(rng.uniform(1, 4), 1)))  # fmt: skip
        return cls(seed, steps)


# --- the run ------------------------------------------------------------------------------


@dataclass
class Run:
    seed: int
    faults: list[FaultRecord] = field(default_factory=list)
    files: int = 0
    clicks: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        said = ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items()))
        verdict = "ok" if not self.problems else f"{len(self.problems)} problem(s)"
        return (
            f"seed {self.seed}: {len(self.faults)} faults ({said}), {self.files} files, "
            f"{self.clicks} double-clicked retries, {self.seconds:.0f} s: {verdict}"
        )


async def run(
    workdir: Path,
    seed: int,
    faults: int = 4,
    kinds: list[str] | None = None,
    heal_within: float = 240.0,
    on_fault: Callable[[FaultRecord], None] | None = None,
) -> Run:
    """One seed: the world, the flow, the operator, the schedule, the heal, the check."""
    began = time.monotonic()
    schedule = Schedule.of(seed, faults, kinds)
    world = World(workdir)
    result = Run(seed)
    uploads: Uploads | None = None
    operator_task: asyncio.Task[None] | None = None
    try:
        await world.start()
        operator = Operator(world.api)
        stop_operator = asyncio.Event()

        async def operate() -> None:
            while not stop_operator.is_set():
                await operator.round()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_operator.wait(), 1.0)

        uploads = Uploads(world.db_url, per_step=4, pause=0.2)
        uploads.start()
        operator_task = asyncio.create_task(operate())
        for kind, index, seconds, pause in schedule.steps:
            bridge = world.bridges[index]
            await wait_for(
                lambda: (scalar(world.db_url, LIVE) or 0) > 0, 60, "jobs in flight", every=0.1
            )
            record = FaultRecord(
                kind, bridge.name, seconds, scalar(world.db_url, LIVE) or 0, time.monotonic()
            )
            result.faults.append(record)
            if on_fault is not None:
                on_fault(record)
            await FAULTS[kind][0](world, bridge, seconds)
            await asyncio.sleep(pause)  # the flow between two faults
        uploads.stop()

        # Heal: every fault is over; wait until nothing is live and nothing failed is
        # left to retry (the operator keeps clicking). What is not by then, the
        # checker reports.
        def settled() -> bool:
            live = scalar(world.db_url, LIVE)
            failed = scalar(
                world.db_url, "SELECT count(*) FROM arm.stored_file WHERE status = 'ERROR'"
            )
            return live == 0 and failed == 0

        with contextlib.suppress(AssertionError):
            await wait_for(settled, heal_within, "healed", every=0.1)
        stop_operator.set()
        await operator_task
        result.clicks = len(operator.clicks)
        result.problems = check(world.db_url, operator.clicks, world.processes())
        with psycopg.connect(world.db_url) as conn:
            row = conn.execute("SELECT count(*) FROM arm.stored_file").fetchone()
            result.files = int(row[0]) if row else 0
    finally:
        if uploads is not None:
            uploads.stop()
        if operator_task is not None and not operator_task.done():
            operator_task.cancel()
        await world.stop()
    result.seconds = time.monotonic() - began
    return result


# --- the checker --------------------------------------------------------------------------


def check(db_url: str, clicks: list[Click], processes: list[ArmProcess]) -> list[str]:
    """Reads the whole history; returns every broken promise it finds (empty: none)."""
    problems: list[str] = []
    with psycopg.connect(db_url) as conn:
        jobs = conn.execute(
            "SELECT j.id, j.file_id, j.attempt, j.status::text, j.result_msg_id, "
            "f.current_recognition_job_id = j.id AS current "
            "FROM arm.recognition_job j JOIN arm.stored_file f ON f.id = j.file_id"
        ).fetchall()
        changes = conn.execute(
            "SELECT job_id, xid::text, old_status, new_status, result_msg_id "
            "FROM nemesis.job_change ORDER BY id"
        ).fetchall()
        audits = conn.execute(
            "SELECT file_id, old_job_id, new_job_id, new_attempt FROM arm.retry_audit"
        ).fetchall()
    by_file: dict[uuid.UUID, list[tuple[int, str, bool]]] = defaultdict(list)
    for job_id, file_id, attempt, status, _, current in jobs:
        by_file[file_id].append((attempt, status, current))
        if current and status != "done":
            seen = [a for _, j, a in clicks if j == str(job_id)]
            problems.append(
                f"file {file_id}: its current attempt {attempt} is {status}, not done"
                f" (retries of it answered {seen or 'nothing: never clicked'})"
            )
        if attempt == 1 and status in ("timeout", "dlq"):
            problems.append(f"job {job_id}: a first attempt ended {status} (lost)")
    for file_id, attempts in by_file.items():
        numbers = sorted(a for a, _, _ in attempts)
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"file {file_id}: attempts {numbers} are not contiguous from 1")
    finals: dict[uuid.UUID, set[str]] = defaultdict(set)
    processing: dict[uuid.UUID, set[str]] = defaultdict(set)
    for job_id, xid, old, new, _ in changes:
        if old in FINAL:
            problems.append(f"job {job_id}: changed after it was final ({old} → {new}, xid {xid})")
        if new in FINAL and old not in FINAL:
            finals[job_id].add(xid)
        if new == "processing" and old != "processing":
            processing[job_id].add(xid)
    for job_id, xids in finals.items():
        if len(xids) > 1:
            problems.append(f"job {job_id}: made final by {len(xids)} transactions")
    for job_id, xids in processing.items():
        if len(xids) > 1:
            problems.append(f"job {job_id}: its ack applied by {len(xids)} transactions")
    retries_of: Counter[uuid.UUID] = Counter(new for _, _, new, _ in audits)
    later = {job_id for job_id, _, attempt, *_ in jobs if attempt > 1}
    for job_id in later:
        if retries_of[job_id] != 1:
            problems.append(f"job {job_id}: made by {retries_of[job_id]} audited retries, not 1")
    current_job = {str(f): str(j) for j, f, *_, is_current in jobs if is_current}
    for file_id, job_id, answers in clicks:
        if 201 in answers and current_job.get(file_id) == job_id:
            problems.append(
                f"file {file_id}: a retry of job {job_id} answered 201, yet it is still current"
            )
        if answers.count(201) > 1:
            problems.append(f"file {file_id}: a double click on job {job_id} made two attempts")
    for proc in processes:
        if proc.proc.poll() is not None:
            problems.append(f"arm-core {proc.command} exited ({proc.proc.returncode})")
    return problems
