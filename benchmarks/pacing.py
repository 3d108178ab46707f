"""Pacing: a real `arm-core bridge` and `arm-core reference` with a stated capacity
(REFERENCE_WORKERS workers × REFERENCE_DELAY_SECONDS a file); the core is told nothing of
it. The reply deadline is DEADLINE seconds, so capacity × deadline files fit in it.

(a) a burst of 1.5 × (capacity × deadline) files of one consolidation, first with
    PACING=off (the reference: every request published at once) then with PACING=auto:
    the jobs that end `timeout` or `dlq`; the time until every job is final ÷ (files ÷
    capacity); the service's utilisation while the burst lasts (files done × time per
    file ÷ (workers × that time)). 5 s into the paced burst another consolidation uploads
    5 files: their worst upload → done, against 3 × the time per file + 2 s;
(b) the same paced with 10 × (capacity × deadline) files;
(c) the burst of (a), paced, through two bridges: in flight against the limit, sampled
    every 0.1 s (the limit is shared through the database: never above it but for the
    limit shrinking under what is already in flight, and by no more than a batch);
(d) the service away for 4 republish budgets (ACK_TIMEOUT_SECONDS × (1 +
    OUTBOX_MAX_REPUBLISH)) while 300 files are uploaded, then back: the jobs dead-lettered,
    against the floor (TABULAR_MIN_IN_FLIGHT).

During (a) arm.pace_view() is read every half second: the limit, in flight, answers per
second and latency; the trace is drawn in docs/pacing-trace.svg.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from arm_core.config import Settings
from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, log_lines
from arm_core.devtools.testbed.sql import upload_consolidations
from benchmarks.harness import Bench, connect, progress
from benchmarks.report import Report

SECTION = "10 pacing"
WORKERS = 4
PER_FILE = 0.1  # seconds: the service does 40 files a second
DEADLINE = 20  # seconds: 800 files of its work fit in it
FLOOR = 1
ROOT = Path(__file__).resolve().parents[1]
# The full run's trace, beside docs/benchmarks.md (benchmarks/__main__.py says where others go).
TRACE = ROOT / "docs" / "pacing-trace.svg"
LIVE = ("queued", "published", "processing")
BATCH = Settings().outbox_batch_size  # the default OUTBOX_BATCH_SIZE


def capacity() -> float:
    return WORKERS / PER_FILE


def upload(url: str, n: int, consolidation: uuid.UUID) -> tuple[list[uuid.UUID], float]:
    """n files of one consolidation in one call of arm.upload_files; their job ids and
    the moment the upload committed."""
    with connect(url) as conn:
        jobs = upload_consolidations(conn, n, [consolidation])
    return jobs, time.time()


def counts(url: str, jobs: list[uuid.UUID] | None = None) -> dict[str, int]:
    where, params = ("WHERE id = ANY(%s)", (jobs,)) if jobs is not None else ("", ())
    with connect(url) as conn:
        rows = conn.execute(
            f"SELECT status::text, count(*) FROM arm.recognition_job {where} GROUP BY 1", params
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def final(url: str, jobs: list[uuid.UUID]) -> bool:
    c = counts(url, jobs)
    return sum(v for k, v in c.items() if k not in LIVE) == len(jobs)


@contextlib.asynccontextmanager
async def service(bench: Bench, **env: Any) -> AsyncIterator[ArmProcess]:
    """`arm-core reference` with the capacity, once both its services listen."""
    values = {
        "NATS_URL": bench.nats_url,
        "REFERENCE_WORKERS": str(WORKERS),
        "REFERENCE_DELAY_SECONDS": str(PER_FILE),
        "REFERENCE_RESULTS_DIR": str(bench.workdir / "results"),
        **{k: str(v) for k, v in env.items()},
    }
    proc = ArmProcess("reference", values, bench.workdir / f"reference-{free_port()}.log")
    try:
        await wait_for(
            lambda: len(log_lines(proc.log(), action="ref_start")) >= 2, 30, "reference up"
        )
        yield proc
    finally:
        if proc.proc.poll() is None:
            proc.stop(within=30)


def core_env(pacing: str, **extra: Any) -> dict[str, str]:
    return {
        "PACING": pacing,
        "TABULAR_REPLY_TIMEOUT_SECONDS": str(DEADLINE),
        "TABULAR_MIN_IN_FLIGHT": str(FLOOR),
        "TIMEOUT_SWEEP_SECONDS": "1",
        **{k: str(v) for k, v in extra.items()},
    }


async def burst(
    bench: Bench,
    pacing: str,
    n: int,
    trace: list[tuple[float, Any]] | None = None,
    bridges: int = 1,
) -> dict[str, Any]:
    """One burst of n files on a fresh database through `bridges` bridges; what became
    of them, how long it took, and the few files of another consolidation uploaded 5 s
    in (paced runs)."""
    url = bench.fresh_database(f"pacing_{pacing}_{n}_{bridges}")
    async with contextlib.AsyncExitStack() as running:
        await running.enter_async_context(service(bench))
        for _ in range(bridges):
            await running.enter_async_context(bench.bridge(url, **core_env(pacing)))
        jobs, started = upload(url, n, uuid.uuid4())
        few: list[uuid.UUID] = []
        few_at = 0.0
        done_at: dict[uuid.UUID, float] = {}
        deadline = time.monotonic() + 4 * n / capacity() + 4 * DEADLINE + 60
        while time.monotonic() < deadline:
            now = time.time()
            if pacing != "off" and not few and now - started >= 5:
                few, few_at = upload(url, 5, uuid.uuid4())
            if trace is not None:
                with connect(url) as conn:
                    row = conn.execute(
                        "SELECT in_flight_limit, in_flight, answers_per_second, "
                        "latency_seconds FROM arm.pace_view() WHERE pipeline = 'tabular'"
                    ).fetchone()
                trace.append((now - started, row))
            if few:
                with connect(url) as conn:
                    for job_id, at in conn.execute(
                        "SELECT id, extract(epoch FROM finished_at) FROM arm.recognition_job "
                        "WHERE id = ANY(%s) AND finished_at IS NOT NULL",
                        (few,),
                    ).fetchall():
                        done_at.setdefault(job_id, float(at))
            if final(url, jobs) and (not few or final(url, few)):
                break
            await asyncio.sleep(0.5 if bridges == 1 else 0.1)  # two: sampled finer
        with connect(url) as conn:
            last = conn.execute(
                "SELECT extract(epoch FROM max(finished_at)) FROM arm.recognition_job "
                "WHERE id = ANY(%s)",
                (jobs,),
            ).fetchone()
        outcome = counts(url, jobs)
    bench.drop_database(url)
    took = float(last[0]) - started if last and last[0] else float("nan")
    done = outcome.get("done", 0)
    return {
        "counts": outcome,
        "failed": outcome.get("timeout", 0) + outcome.get("dlq", 0),
        "took": took,
        "utilisation": done * PER_FILE / (WORKERS * took) if took > 0 else float("nan"),
        "few_worst": max((done_at.get(j, float("inf")) - few_at for j in few), default=None),
    }


async def outage(bench: Bench) -> dict[str, Any]:
    """The service away for 4 republish budgets while 300 files are uploaded, then back."""
    ack, republish = 3, 2
    budget = ack * (1 + republish)
    url = bench.fresh_database("pacing_outage")
    env = core_env("auto", ACK_TIMEOUT_SECONDS=ack, OUTBOX_MAX_REPUBLISH=republish)
    async with bench.bridge(url, **env):
        jobs, _ = upload(url, 300, uuid.uuid4())
        await asyncio.sleep(4 * budget)  # the outage: nobody subscribes meanwhile
        async with service(bench):
            await wait_for(lambda: final(url, jobs), 300, "every job final after the outage")
        outcome = counts(url, jobs)
    bench.drop_database(url)
    return {"counts": outcome, "budget": budget}


def shown(path: Path) -> str:
    """`path` as the report names it: from the repository's root when it is inside."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def chart(trace: list[tuple[float, Any]], path: Path) -> None:
    """The limit and in flight (left axis, jobs), answers per second and latency (each
    scaled to its own maximum) over the burst, as an SVG line chart."""
    width, height, pad = 720, 300, 40
    points = [(t, r) for t, r in trace if r is not None]
    if not points:
        return
    t_max = max(t for t, _ in points) or 1.0

    def series(index: int) -> list[tuple[float, float]]:
        return [(t, float(r[index])) for t, r in points if r[index] is not None]

    lines = []
    jobs_max = max([v for i in (0, 1) for _, v in series(i)] + [1.0])
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
    names = ("in-flight limit", "in flight", "answers/s (scaled)", "latency (scaled)")
    for index, (colour, name) in enumerate(zip(colours, names, strict=True)):
        values = series(index)
        if not values:
            continue
        top = jobs_max if index < 2 else max(v for _, v in values) or 1.0
        xy = " ".join(
            f"{pad + (width - 2 * pad) * t / t_max:.1f},"
            f"{height - pad - (height - 2 * pad) * v / top:.1f}"
            for t, v in values
        )
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{xy}"/>')
        lines.append(
            f'<text x="{pad + 10}" y="{pad + 14 * index}" fill="{colour}" '
            f'font-size="12">{name}</text>'
        )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        f'stroke="black"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" '
        f'stroke="black"/>'
        f'<text x="{pad}" y="{height - 10}" font-size="12">0 s</text>'
        f'<text x="{width - pad - 30}" y="{height - 10}" font-size="12">{t_max:.0f} s</text>'
        f'<text x="5" y="{pad - 5}" font-size="12">{jobs_max:.0f} jobs</text>'
        + "".join(lines)
        + "</svg>\n"
    )
    path.write_text(svg, encoding="utf-8")


async def run(bench: Bench, report: Report) -> None:
    fits = int(capacity() * DEADLINE)
    quick = bench.sizes.pgbench_seconds < 10
    big = 3 * fits if quick else 10 * fits
    progress(f"pacing: {int(1.5 * fits)} files at once, PACING=off")
    off = await burst(bench, "off", int(1.5 * fits))
    progress(f"pacing: {int(1.5 * fits)} files at once, PACING=auto")
    trace: list[tuple[float, Any]] = []
    auto = await burst(bench, "auto", int(1.5 * fits), trace)
    if bench.pacing_trace is not None:
        chart(trace, bench.pacing_trace)
    progress(f"pacing: {big} files at once, PACING=auto")
    large = await burst(bench, "auto", big)
    progress(f"pacing: {int(1.5 * fits)} files at once, PACING=auto, two bridges")
    shared: list[tuple[float, Any]] = []
    two = await burst(bench, "auto", int(1.5 * fits), shared, bridges=2)
    over = max((r[1] - r[0] for _, r in shared if r is not None), default=0)
    progress("pacing: the service away while 300 files are uploaded")
    away = await outage(bench)

    n = int(1.5 * fits)
    report.add(
        "pacing.off",
        SECTION,
        f"{n:,} files at once, PACING=off: ended timeout or dlq",
        off["failed"],
        "jobs",
        short="PACING=off",
    )
    report.add(
        "pacing.auto",
        SECTION,
        f"{n:,} files at once (1.5 × capacity × deadline), PACING=auto: ended timeout or dlq",
        auto["failed"],
        "jobs",
        ref="pacing.off",
    )
    report.add(
        "pacing.ideal",
        SECTION,
        f"files ÷ capacity ({capacity():.0f} files/s)",
        n / capacity(),
        "s",
        digits=1,
        short="files ÷ capacity",
    )
    report.add(
        "pacing.took",
        SECTION,
        "the same, paced: until every job is final",
        auto["took"],
        "s",
        ref="pacing.ideal",
        digits=1,
    )
    report.add(
        "pacing.util",
        SECTION,
        "the same: the service's utilisation (busy workers ÷ workers)",
        100 * auto["utilisation"],
        "%",
    )
    report.add(
        "pacing.few.bound",
        SECTION,
        "3 × time per file + 2 s",
        3 * PER_FILE + 2,
        "s",
        digits=1,
        short="3 × per file + 2 s",
    )
    report.add(
        "pacing.few",
        SECTION,
        "another consolidation's 5 files, 5 s into the burst: upload → done, worst",
        auto["few_worst"],
        "s",
        ref="pacing.few.bound",
        digits=1,
    )
    report.add(
        "pacing.large",
        SECTION,
        f"{big:,} files at once ({big // fits} × capacity × deadline), PACING=auto: "
        "ended timeout or dlq",
        large["failed"],
        "jobs",
        ref="pacing.off",
        text=f"{large['failed']} (until final {large['took']:.0f} s, "
        f"{big / capacity():.0f} s of work)",
    )
    report.add(
        "pacing.batch", SECTION, "OUTBOX_BATCH_SIZE: one batch", BATCH, "jobs", short="one batch"
    )
    report.add(
        "pacing.two",
        SECTION,
        f"the same burst through two bridges: in flight above the limit, the most of "
        f"{len(shared)} samples (0.1 s apart)",
        over,
        "jobs",
        ref="pacing.batch",
        text=f"{over} ({two['failed']} ended timeout or dlq)",
    )
    report.add("pacing.floor", SECTION, "TABULAR_MIN_IN_FLIGHT", FLOOR, "jobs", short="the floor")
    report.add(
        "pacing.away",
        SECTION,
        f"the service away 4 × {away['budget']} s (the republish budget) while 300 files "
        "are uploaded: dlq",
        away["counts"].get("dlq", 0),
        "jobs",
        ref="pacing.floor",
    )
    report.note(
        f"Pacing: PACING=off ended {off['counts']}; PACING=auto {auto['counts']} in "
        f"{auto['took']:.1f} s; {big:,} files {large['counts']}; after the outage "
        f"{away['counts']}; through two bridges {two['counts']}."
        + (
            f" The limit's trace over the paced burst: {shown(bench.pacing_trace)}."
            if bench.pacing_trace
            else ""
        )
    )
