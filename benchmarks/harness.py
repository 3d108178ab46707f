"""What every section shares: the sizes, the servers, fresh databases, `arm-core`
subprocesses and a few small SQL helpers."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.processes import ArmProcess, log_lines
from arm_core.migrate import migrate
from benchmarks import cpu
from benchmarks.cpu import CpuMeter


@dataclass(frozen=True)
class Sizes:
    """How much work each section does; `--quick` shrinks everything for a smoke run."""

    pgbench_scale: int = 10
    pgbench_seconds: int = 10
    pgqueuer_jobs: int = 30_000
    publish_small: int = 10_000
    publish_large: int = 100_000
    compare_jobs: int = 30_000  # arm-core's publish drain at PgQueuer's N
    burst_files: int = 30_000
    latency_seconds: float = 10.0
    sweep_live: tuple[int, int] = (10_000, 100_000)
    sweep_history: tuple[int, int] = (10_000, 1_000_000)
    sweep_due: int = 100
    sweep_repeats: int = 7
    retry_files: int = 5_000
    retry_concurrency: int = 32
    file_list: tuple[int, int] = (10_000, 1_000_000)
    wal_files: int = 10_000
    stream_jobs: int = 3_000  # benchmarks/stream_sync.py, each setting

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            pgbench_scale=1,
            pgbench_seconds=3,
            pgqueuer_jobs=3_000,
            publish_small=2_000,
            publish_large=10_000,
            compare_jobs=3_000,
            burst_files=3_000,
            latency_seconds=4.0,
            sweep_live=(2_000, 10_000),
            sweep_history=(2_000, 50_000),
            sweep_repeats=3,
            retry_files=500,
            file_list=(10_000, 100_000),
            wal_files=2_000,
            stream_jobs=500,
        )


@dataclass
class Bench:
    """One PostgreSQL cluster and one nats-server for the whole run."""

    pg: EmbeddedPostgres
    nats: EmbeddedNats
    workdir: Path
    sizes: Sizes
    # Where the pacing section draws its trace: docs/pacing-trace.svg on a full run, beside
    # a given --doc otherwise, nowhere (None) when the run writes no report.
    pacing_trace: Path | None = None
    _databases: list[str] = field(default_factory=list)

    @property
    def nats_url(self) -> str:
        return self.nats.url()

    def cpu_meter(self, **pids: int) -> CpuMeter:
        """CPU of PostgreSQL, nats-server, this process and the given processes."""
        postmaster = int((self.pg.data_dir / "postmaster.pid").read_text().split()[0])
        nats = [p for p in cpu.children(os.getpid()) if cpu.command(p) == "nats-server"]
        return CpuMeter({**pids, **({"nats-server": nats[0]} if nats else {})}, postmaster)

    def fresh_database(self, name: str, migrated: bool = True) -> str:
        """A new, empty database (migrated for arm-core unless told otherwise)."""
        self.pg.drop_database(name)
        self.pg.create_database(name)
        self._databases.append(name)
        url = self.pg.url(name)
        if migrated:
            migrate(url)
        return url

    def drop_database(self, url: str) -> None:
        """Frees the disk of a section that is done with its database."""
        self.pg.drop_database(url.rsplit("/", 1)[1])

    @contextlib.contextmanager
    def arm_core(self, command: str, env: dict[str, str], port: int) -> Iterator[ArmProcess]:
        """`arm-core <command>` as users run it, healthy on `port` before the body runs;
        SIGTERM at the end. Its log stays in the work folder for the sections to read."""
        log_path = self.workdir / f"arm-core-{command}-{port}.log"
        proc = ArmProcess(command, env, log_path)
        try:
            proc.wait_healthy(port, within=30)
            yield proc
        finally:
            if proc.proc.poll() is None:
                try:
                    proc.stop(within=30)
                except AssertionError:
                    proc.kill()

    @contextlib.asynccontextmanager
    async def bridge(self, db_url: str, **env: str) -> AsyncIterator[ArmProcess]:
        """A real `arm-core bridge` on `db_url`: short poll period, its own health port."""
        port = free_port()
        values = {
            "DATABASE_URL": db_url,
            "NATS_URL": self.nats_url,
            "HTTP_HOST": "127.0.0.1",
            "BRIDGE_HEALTH_PORT": str(port),
            "OUTBOX_POLL_SECONDS": "0.5",
            **env,
        }
        with self.arm_core("bridge", values, port) as proc:
            yield proc


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def scalar(url: str, sql: str, params: Any = None) -> Any:
    with connect(url) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]


def commits(url: str) -> int:
    """Transactions committed in the database of `url` so far (pg_stat_database)."""
    with connect(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def describe_counts(counts: dict[str, int], first: tuple[str, ...]) -> str:
    """`done 30,000 · processing 0 · other 0`: the statuses in `first`, then the rest."""
    parts = [f"{s} {counts.get(s, 0):,}" for s in first]
    rest = sum(n for s, n in counts.items() if s not in first)
    return " · ".join([*parts, f"other {rest:,}"])


def dropped_envelopes(log: str) -> int:
    """Envelopes the bridge says it dropped (action=inbox_drop), plus the NATS client's
    slow-consumer reports (each one stands for at least one lost message)."""
    return len(log_lines(log, action="inbox_drop")) + log.count("SlowConsumerError")


def publish_batches(log: str) -> int:
    """Publish transactions the bridge committed, from its `published N jobs` lines."""
    return len([line for line in log_lines(log, action="publish") if "published " in line])


def progress(what: str) -> None:
    """A line on stderr while a long step runs (the table goes to stdout at the end)."""
    print(f"   {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Stopwatch:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.started
