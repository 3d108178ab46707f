"""`python -m benchmarks [--quick] [--only publish,sweep] [--durability off] [--doc PATH]`
(what `make bench` runs).

Only a full run at production durability (every section, no --quick, durability on)
rewrites docs/benchmarks.md and docs/pacing-trace.svg, the report the other pages quote.
Any other run prints its table, and writes it only to a --doc it is given (other than
docs/benchmarks.md), with the pacing trace beside it."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from benchmarks import (
    contracts,
    files,
    lifecycle,
    pacing,
    pacing_claim,
    pgbench,
    pgqueuer_drain,
    pooler,
    publish,
    retry,
    stream_sync,
    sweep,
    upload_scaling,
    wal,
)
from benchmarks.harness import Bench, Sizes
from benchmarks.pacing import TRACE
from benchmarks.report import Report, durability_sentence, machine, markdown, server_settings

Section = Callable[[Bench, Report], Awaitable[None] | None]

# Each section is a module with a `run(bench, report)`; its docstring says how it measures.
MODULES: dict[str, ModuleType] = {
    "pgbench": pgbench,
    "uploads": upload_scaling,
    "wal": wal,
    "pgqueuer": pgqueuer_drain,
    "publish": publish,
    "lifecycle": lifecycle,
    "sweep": sweep,
    "retry": retry,
    "files": files,
    "pacing": pacing,
    "claim": pacing_claim,
    "pgbouncer": pooler,
    "stream": stream_sync,
    "contracts": contracts,
}
SECTIONS: dict[str, Section] = {name: module.run for name, module in MODULES.items()}

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=(__doc__ or "").strip()
    )
    parser.add_argument("--quick", action="store_true", help="smaller N: a smoke run")
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated sections to run (default: all): {', '.join(SECTIONS)}",
    )
    parser.add_argument(
        "--durability",
        choices=("on", "off"),
        default="on",
        help="on (default): PostgreSQL with initdb's defaults, fsync, synchronous_commit and "
        "full_page_writes on, as in production; off: all three off, as the tests run it",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        default=None,
        help=f"where to write the table (default: {DOC} on a full, durable run; "
        "nowhere, only printed, on a partial, quick or non-durable one)",
    )
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.sections = [s for s in SECTIONS if s in chosen]  # always in the table's order
    full = args.sections == list(SECTIONS) and not args.quick and args.durability == "on"
    if args.doc is None:
        args.doc = DOC if full else None
    elif not full and args.doc.resolve() == DOC:
        parser.error(
            f"--doc {args.doc}: only a full run at production durability (no --quick, no "
            "--only, no --durability off) writes the report; give another path"
        )
    args.trace = None
    if args.doc is not None:
        args.trace = TRACE if args.doc.resolve() == DOC else trace_beside(args.doc)
    return args


def trace_beside(doc: Path) -> Path:
    """The pacing trace of a report written to `doc`: `<doc's stem>-pacing-trace.svg`."""
    return doc.with_name(f"{doc.stem}-pacing-trace.svg")


async def run_sections(bench: Bench, report: Report, names: list[str]) -> None:
    for name in names:
        started = time.perf_counter()
        print(f"-- {name} …", file=sys.stderr, flush=True)
        try:
            result = SECTIONS[name](bench, report)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            traceback.print_exc()
            report.add(f"{name}.failed", name, "section failed", text=f"{type(exc).__name__}")
            report.note(f"Section {name} failed: {type(exc).__name__}: {str(exc)[:500]}")
        print(f"-- {name} took {time.perf_counter() - started:.0f} s", file=sys.stderr)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes()
    report = Report()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="arm-bench-") as tmp:
        workdir = Path(tmp)
        pg = EmbeddedPostgres(base_dir=workdir / "pg", durable=args.durability == "on")
        nats = EmbeddedNats(log_dir=workdir / "nats")
        try:
            pg.start()
            nats.start()
            settings = server_settings(pg.url())  # what the server runs with, not what we asked
            print(durability_sentence(settings), file=sys.stderr, flush=True)
            machine_lines = machine(settings)  # before: others may commit while the run goes on
            bench = Bench(pg, nats, workdir, sizes, pacing_trace=args.trace)
            asyncio.run(run_sections(bench, report, args.sections))
        finally:
            nats.stop()
            pg.destroy()
    wall = time.perf_counter() - started
    command = "make bench" + (f" BENCH_ARGS={shlex.quote(' '.join(argv))}" if argv else "")
    print()
    print(durability_sentence(settings))
    print()
    print(report.table())
    print()
    for note in report.notes:
        print(f"- {note}")
    if args.doc is None:
        print(f"\n{command}: {wall:.0f} s; not written: {DOC} holds full, durable runs only")
        return 0
    print(f"\n{command}: {wall:.0f} s; table written to {args.doc}")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    methods = {
        f"{name} (`benchmarks/{Path(MODULES[name].__file__ or '').name}`)": MODULES[name].__doc__
        or ""
        for name in args.sections
    }
    args.doc.write_text(
        markdown(report, machine_lines, command, wall, methods, settings), encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
