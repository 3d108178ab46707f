"""`python -m benchmarks.soak [--minutes 60]` (what `make soak` runs): the exchange run
for an hour, as it runs for months, with what time does to it measured.

The world is the nemesis's (src/arm_core/devtools/testbed/nemesis.py): a PostgreSQL and a
nats-server of its own, two bridges with RESULTS_STREAM behind proxies, `arm-core serve`,
the reference services, an operator double-clicking retry on failed files. The flow is steady, at a
quarter of the capacity a burst through this same world measured at the start; a fault
of the nemesis lands every few minutes (none in the last row's window). Every `--every`
seconds (5 minutes) a row: the enqueue → done p50 and p99 of the jobs of the window that
no fault overlapped; the RSS of each arm-core process; the database's connections; the
size and dead tuples of the job and file tables and of the live queues' indexes; the
results stream's bytes. It ends with the nemesis's history checker.

It fails (exit 1) when anything is lost, applied twice or stuck, or when after the
warm-up (10 minutes; a third of a shorter run) a process's RSS grows more than 10 % (a
process a fault restarted is judged from the end of its own warm-up), the last row's p99
exceeds 1.5× the warm-up row's, or a live queue's index grows with the history (to more
than 1.5× its size after the warm-up, plus 256 KiB). A run of 60 minutes or more writes
docs/soak.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import psycopg

from arm_core.devtools.reference import REMEMBER_SECONDS
from arm_core.devtools.testbed import nemesis
from arm_core.devtools.testbed.faults import iptables_missing
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess
from arm_core.devtools.testbed.sql import upload_many
from benchmarks.report import machine

DOC = Path(__file__).resolve().parents[1] / "docs" / "soak.md"
QUEUE_INDEXES = (
    "recognition_job_queued_idx",
    "recognition_job_unacked_idx",
    "recognition_job_live_deadline_idx",
    "recognition_job_one_live_per_file_idx",
)
TABLES = ("recognition_job", "stored_file")


@dataclass
class Row:
    minute: float
    jobs_done: int
    p50: float | None
    p99: float | None
    rss_mib: dict[str, float]
    connections: int
    tables: dict[str, tuple[int, int]]  # name → (bytes, dead tuples)
    indexes: dict[str, int]  # name → bytes
    stream_bytes: int | None


@dataclass
class Soak:
    minutes: float
    rate: float = 0.0
    capacity: float = 0.0
    rows: list[Row] = field(default_factory=list)
    faults: list[nemesis.FaultRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # pid → samples of (seconds into the soak, RSS in MiB, name, the process's age in s)
    rss_by_pid: dict[int, list[tuple[float, float, str, float]]] = field(default_factory=dict)


def rss_mib(proc: ArmProcess) -> float | None:
    try:
        for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def age_seconds(pid: int) -> float | None:
    """How long the process has run (/proc/PID/stat's start time against the uptime)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def stream_bytes(url: str) -> int | None:
    with contextlib.suppress(Exception):
        nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
        try:
            info = await nc.jetstream().stream_info(nemesis.STREAM)
            return int(info.state.bytes)
        finally:
            await nc.close()
    return None


async def sample(world: nemesis.World, soak: Soak, began: float, since: float) -> Row:
    """One row: the window [since, now] (monotonic) mapped onto the database's clock."""
    now = time.monotonic()
    quiet = [(f.started_at, f.started_at + f.seconds + 30) for f in soak.faults]
    window = now - since
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - requested_at), "
            "extract(epoch FROM finished_at - requested_at) FROM arm.recognition_job "
            "WHERE status = 'done' AND finished_at > clock_timestamp() - %s * interval '1 s'",
            (window,),
        ).fetchall()
        connections = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
        tables = {
            name: conn.execute(
                "SELECT pg_total_relation_size(c.oid), coalesce(s.n_dead_tup, 0) "
                "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE c.oid = %s::regclass",
                (f"arm.{name}",),
            ).fetchone()
            for name in TABLES
        }
        indexes = {
            name: conn.execute("SELECT pg_relation_size(%s::regclass)", (f"arm.{name}",)).fetchone()
            for name in QUEUE_INDEXES
        }
    waits = []
    for age, took in rows:
        requested = now - float(age)
        finished = requested + float(took)
        if not any(start <= finished and requested <= end for start, end in quiet):
            waits.append(float(took))
    rss: dict[str, float] = {}
    for proc in world.processes():
        value, age = rss_mib(proc), age_seconds(proc.proc.pid)
        if value is not None and age is not None:
            name = f"{proc.command}:{proc.proc.pid}"
            rss[name] = value
            soak.rss_by_pid.setdefault(proc.proc.pid, []).append((now - began, value, name, age))
    return Row(
        minute=(now - began) / 60,
        jobs_done=len(rows),
        p50=quantile(waits, 0.5),
        p99=quantile(waits, 0.99),
        rss_mib=rss,
        connections=int(connections[0]) if connections else 0,
        tables={k: (int(v[0]), int(v[1])) for k, v in tables.items() if v},
        indexes={k: int(v[0]) for k, v in indexes.items() if v},
        stream_bytes=await stream_bytes(world.nats.url()),
    )


async def sampled(world: nemesis.World, soak: Soak, began: float, since: float) -> Row:
    """sample(), tried again for a minute while the database does not answer."""
    rows: list[Row] = []
    errors: list[psycopg.OperationalError] = []

    async def answered() -> bool:
        try:
            rows.append(await sample(world, soak, began, since))
        except psycopg.OperationalError as exc:
            errors.append(exc)
            return False
        return True

    await wait_for(answered, 60, lambda: f"a sample: the database answers ({errors[-1]})", every=1)
    return rows[0]


async def calibrate(world: nemesis.World, jobs: int = 1500) -> float:
    """Files per second a burst of `jobs` takes through this world, from queued to done."""
    with psycopg.connect(world.db_url, autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM arm.recognition_job").fetchone()
        started = time.monotonic()
        upload_many(conn, jobs, mixed=True)
    base = int(before[0]) if before else 0
    await wait_for(
        lambda: (nemesis.scalar(world.db_url, "SELECT count(*) FROM arm.recognition_job "
                                "WHERE status = 'done'") or 0) >= base + jobs,
        300, "the calibration burst done", every=0.1,
    )  # fmt: skip
    return jobs / (time.monotonic() - started)


def judge(soak: Soak, warmup: float) -> list[str]:
    """The time-based failures (the history's are the checker's)."""
    said: list[str] = []
    warm = [r for r in soak.rows if r.minute >= warmup]
    if len(warm) < 2:
        return said
    first, last = warm[0], warm[-1]
    for series in soak.rss_by_pid.values():
        # The reference service remembers the jobs of its last REMEMBER_SECONDS: before
        # that it fills up by design, so a warm-up shorter than that cannot judge it.
        if series[0][2].startswith("reference") and warmup * 60 < REMEMBER_SECONDS:
            continue
        # From the soak's warm-up and the process's own: a bridge a fault restarted late
        # fills its pool and buffers then, as every process did in the first minutes.
        after = [(t, v) for t, v, _, age in series if t / 60 >= warmup and age / 60 >= warmup]
        if len(after) >= 2 and after[-1][1] > 1.10 * after[0][1]:
            name = series[0][2]
            said.append(
                f"{name}: RSS grew {after[0][1]:.0f} → {after[-1][1]:.0f} MiB after the warm-up"
            )
    if first.p99 is not None and last.p99 is not None and last.p99 > 1.5 * first.p99:
        said.append(f"p99 grew {first.p99:.3f} → {last.p99:.3f} s after the warm-up")
    for name in QUEUE_INDEXES:
        a, b = first.indexes.get(name, 0), last.indexes.get(name, 0)
        if b > 1.5 * a + 256 * 1024:
            said.append(f"{name} grew {a} → {b} bytes with the history")
    return said


async def run(workdir: Path, minutes: float, every: float, fault_every: float) -> Soak:
    soak = Soak(minutes)
    world = nemesis.World(workdir)
    rng = random.Random(int(minutes * 1000) + 7)
    uploads: nemesis.Uploads | None = None
    stop = asyncio.Event()
    try:
        await world.start()
        soak.capacity = await calibrate(world)
        soak.rate = soak.capacity / 4
        per_step = 4
        uploads = nemesis.Uploads(world.db_url, per_step=per_step, pause=per_step / soak.rate)
        operator = nemesis.Operator(world.api)

        async def operate() -> None:
            while not stop.is_set():
                await operator.round()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)

        began = time.monotonic()
        uploads.start()
        operating = asyncio.create_task(operate())
        end = began + minutes * 60
        next_row, next_fault = began + every, began + fault_every
        last_row_at = began
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_row:
                row = await sampled(world, soak, began, last_row_at)
                soak.rows.append(row)
                print(format_row(row), flush=True)
                last_row_at, next_row = now, now + every
            elif now >= next_fault and end - now > every + 60:
                kind = rng.choice(sorted(nemesis.FAULTS))
                fault, low, high = nemesis.FAULTS[kind]
                bridge = world.bridges[rng.randrange(2)]
                seconds = round(rng.uniform(low, high), 1)
                live = nemesis.scalar(world.db_url, nemesis.LIVE) or 0
                record = nemesis.FaultRecord(kind, bridge.name, seconds, live, time.monotonic())
                soak.faults.append(record)
                print(f"  fault: {kind} on {bridge.name} for {seconds} s ({live} live)", flush=True)
                await fault(world, bridge, seconds)
                next_fault = time.monotonic() + fault_every
            else:
                await asyncio.sleep(1)  # the soak's clock: rows and faults are due by time
        soak.rows.append(await sampled(world, soak, began, last_row_at))
        print(format_row(soak.rows[-1]), flush=True)
        uploads.stop()
        with contextlib.suppress(AssertionError):
            await wait_for(
                lambda: (
                    nemesis.scalar(world.db_url, nemesis.LIVE) == 0
                    and nemesis.scalar(
                        world.db_url, "SELECT count(*) FROM arm.stored_file WHERE status = 'ERROR'"
                    )
                    == 0
                ),
                300,
                "healed",
                every=0.1,
            )
        stop.set()
        await operating
        soak.problems = nemesis.check(world.db_url, operator.clicks, world.processes())
        soak.problems += judge(soak, min(10.0, minutes / 3))
    finally:
        stop.set()
        if uploads is not None:
            uploads.stop()
        await world.stop()
    return soak


def format_row(row: Row) -> str:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.0f} ms"

    rss = ", ".join(f"{k.split(':')[0]} {v:.0f}" for k, v in sorted(row.rss_mib.items()))
    job_bytes, job_dead = row.tables.get("recognition_job", (0, 0))
    queue = sum(row.indexes.values())
    stream = "—" if row.stream_bytes is None else f"{row.stream_bytes / 1024:.0f} KiB"
    return (
        f"| {row.minute:.0f} | {row.jobs_done:,} | {ms(row.p50)} | {ms(row.p99)} | {rss} | "
        f"{row.connections} | {job_bytes / (1 << 20):.1f} MiB, {job_dead:,} dead | "
        f"{queue / 1024:.0f} KiB | {stream} |"
    )


def markdown(soak: Soak, command: str, machine_lines: list[str]) -> str:
    lines = [
        "# Soak: an hour of flow and faults",
        "",
        "Written by `make soak` (`python -m benchmarks.soak`) at the end of a run of 60 "
        "minutes or more (overwritten).",
        "",
        f"Command: `{command}`.",
        "",
        "## Machine",
        "",
        *[f"- {line}" for line in machine_lines],
        "",
        "## Flow",
        "",
        f"- a burst through the same world at the start: {soak.capacity:.0f} files/s; the "
        f"flow: a quarter of it, {soak.rate:.0f} files/s, one in ten named `[fail-once]` "
        "(its first attempt fails; the operator retries it)",
        f"- faults: {len(soak.faults)} — "
        + ", ".join(f"{f.kind} on {f.target} ({f.seconds:g} s)" for f in soak.faults),
        "",
        "## Rows",
        "",
        "| minute | jobs done in the window | enqueue → done p50 | p99 (jobs no fault met) "
        "| RSS (MiB) | connections | recognition_job | live queues' indexes | stream |",
        "| ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |",
        *[format_row(r) for r in soak.rows],
        "",
        "## Verdict",
        "",
        *([f"- {p}" for p in soak.problems] or ["- nothing lost, applied twice or stuck; "
                                                "no growth past the bounds"]),
        "",
        "## How it measures",
        "",
        " ".join((__doc__ or "").split("\n\n")[1].split()),
        "",
        " ".join((__doc__ or "").split("\n\n")[2].split()),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=300.0, help="seconds between rows")
    parser.add_argument("--fault-every", type=float, default=180.0, help="seconds")
    args = parser.parse_args(argv)
    if missing := iptables_missing():  # a fault drops packets: say so now, not minutes in
        print(f"python -m benchmarks.soak: {missing}", file=sys.stderr)
        return 2
    machine_lines = machine()  # the commit measured: others may commit during the hour
    with tempfile.TemporaryDirectory(prefix="arm-soak-") as tmp:
        soak = await run(Path(tmp), args.minutes, args.every, args.fault_every)
        # The verdict and the report come before the clean-up: an hour leaves a
        # result file per job, and removing them can take longer than the hour.
        for problem in soak.problems:
            print(f"FAILED: {problem}", file=sys.stderr)
        if args.minutes >= 60:
            command = shlex.join(["python", "-m", "benchmarks.soak", *argv])
            DOC.write_text(markdown(soak, command, machine_lines))
            print(f"written to {DOC}")
        print("passed" if not soak.problems else "failed", "; removing", tmp, flush=True)
    return 1 if soak.problems else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
