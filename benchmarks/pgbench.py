"""The ceiling: `pgbench -N` (simple updates, no branch/teller contention) on the same
cluster, in its own database. Every other figure is read against this one."""

from __future__ import annotations

import re
import subprocess

from arm_core.devtools.embedded_postgres import find_pg_bindir
from benchmarks.harness import Bench
from benchmarks.report import Report

KEY = "pgbench"
CLIENTS = 4
THREADS = 2


def run(bench: Bench, report: Report) -> None:
    s = bench.sizes
    bench.fresh_database("pgbench", migrated=False)
    pgbench = str(find_pg_bindir() / "pgbench")
    common = ["-h", "127.0.0.1", "-p", str(bench.pg.port), "-U", bench.pg.user]
    run_pgbench([pgbench, "-i", "-q", "-s", str(s.pgbench_scale), *common, "pgbench"])
    out = run_pgbench(
        [
            pgbench,
            "-N",
            "-c",
            str(CLIENTS),
            "-j",
            str(THREADS),
            "-T",
            str(s.pgbench_seconds),
            *common,
            "pgbench",
        ]
    )
    report.add(
        KEY,
        "1 pgbench",
        f"pgbench -N, {CLIENTS} clients, -j {THREADS}, scale {s.pgbench_scale}, "
        f"{s.pgbench_seconds} s",
        tps(out),
        "tps",
        short="pgbench -N",
    )
    bench.drop_database(bench.pg.url("pgbench"))


def tps(out: str) -> float:
    """The tps pgbench printed (without the initial connection time)."""
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    if match is None:
        raise RuntimeError(f"no tps in pgbench's output:\n{out}")
    return float(match.group(1))


def run_pgbench(cmd: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout + done.stderr
