"""`python -m benchmarks.suite_time JUNIT.xml [--workers N]` (what `make test-durations`
runs): where the test suite's time went, by folder, from the JUnit XML report the last
`make test` wrote (.dev/junit.xml), written to docs/test-durations.md.

The page keeps the run before as well (its "This run" section becomes "The run before"),
so a change to the suite shows its effect beside the last measurement. Each section says
its commit, date, machine and the number of workers: with several workers the sum of the
tests' times is larger than the wall-clock time, and a folder's share of the sum is what
it costs the machine, not how long one waits for it."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.report import machine

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "test-durations.md"
THIS_RUN, RUN_BEFORE = "## This run", "## The run before"


@dataclass
class Folder:
    tests: int = 0
    seconds: float = 0.0
    failed: int = 0
    skipped: int = 0
    slowest: list[tuple[float, str]] = field(default_factory=list)


def folders(report: ET.Element) -> dict[str, Folder]:
    """tests/<folder>/ → its tests' count, summed time (setup, call and teardown, as JUnit
    records them) and failures."""
    found: dict[str, Folder] = defaultdict(Folder)
    for case in report.iter("testcase"):
        # tests.e2e.test_soak_sampler; a module skipped whole has only a name.
        classname = case.get("classname") or case.get("name") or ""
        parts = classname.split(".")
        folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else "(other)"
        seconds = float(case.get("time", "0") or 0)
        entry = found[folder]
        entry.tests += 1
        entry.seconds += seconds
        entry.failed += sum(1 for child in case if child.tag in ("failure", "error"))
        entry.skipped += sum(1 for child in case if child.tag == "skipped")
        entry.slowest.append((seconds, f"{'/'.join(parts[1:])}.py::{case.get('name')}"))
    return dict(found)


@dataclass
class Worker:
    busy: float = 0.0  # seconds of tests
    first: float = float("inf")  # the first test's start (epoch seconds)
    last: float = 0.0  # the last test's end
    last_test: str = ""


def workers_of(report: ET.Element) -> dict[str, Worker]:
    """Each pytest-xdist worker's tests, from the properties tests/conftest.py records
    (which worker, when the test started); empty for a report without them."""
    found: dict[str, Worker] = defaultdict(Worker)
    for case in report.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "worker" not in props or "started" not in props:
            continue
        started, seconds = float(props["started"] or 0), float(case.get("time", "0") or 0)
        entry = found[props["worker"] or ""]
        entry.busy += seconds
        entry.first = min(entry.first, started)
        if started + seconds > entry.last:
            entry.last = started + seconds
            entry.last_test = f"{(case.get('classname') or '').split('.')[-1]}::{case.get('name')}"
    return dict(found)


def worker_lines(report: ET.Element) -> list[str]:
    """When each worker ran out of work: the wall-clock time is the last one's end, so a
    worker that ends early while another runs a long group is time the order could save."""
    found = workers_of(report)
    if not found:
        return []
    start = min(w.first for w in found.values())
    lines = [
        "",
        "Each worker (seconds from the first test's start; busy = its tests' summed time):",
        "",
        "| worker | busy | done at | its last test |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, w in sorted(found.items(), key=lambda item: item[1].last):
        lines.append(f"| {name} | {w.busy:.0f} | {w.last - start:.0f} | `{w.last_test}` |")
    return lines


def section(title: str, junit: Path, workers: int) -> str:
    report = ET.parse(junit).getroot()
    found = folders(report)
    # The run's own length (pytest's, from its start to its end), as the report says it.
    wall = float(next(report.iter("testsuite")).get("time", "0"))
    total = sum(f.seconds for f in found.values())
    lines = [
        title,
        "",
        *(f"- {line}" for line in machine()),
        f"- workers (pytest-xdist `-n`): {workers}; the suite's wall-clock time: "
        f"{wall:.0f} s ({wall / 60:.1f} min); the tests' summed time: {total:.0f} s",
        "",
        "| folder | tests | summed seconds | share | failed | skipped | slowest test (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, f in sorted(found.items(), key=lambda item: -item[1].seconds):
        top_seconds, top = max(f.slowest)
        lines.append(
            f"| {name} | {f.tests} | {f.seconds:.0f} | {f.seconds / total:.0%} | {f.failed} "
            f"| {f.skipped} | `{top}` ({top_seconds:.0f}) |"
        )
    lines += worker_lines(report)
    slowest = sorted(((s, name) for f in found.values() for s, name in f.slowest), reverse=True)[
        :15
    ]
    lines += ["", "The 15 slowest tests (seconds, setup and teardown included):", ""]
    lines += [f"- {s:.1f} `{name}`" for s, name in slowest]
    return "\n".join(lines) + "\n"


def page(new: str, old_page: str | None) -> str:
    head = [
        "# Where the test suite's time goes",
        "",
        "Written by `make test-durations` (`python -m benchmarks.suite_time`) from the JUnit "
        "report of the last `make test`; the run before is kept below it. Measured on a shared "
        "2-core machine: between runs and machines the times vary 2–5×, the shares less.",
        "",
        "",
    ]
    before = ""
    if old_page and THIS_RUN in old_page:
        before = old_page.split(THIS_RUN, 1)[1].split(RUN_BEFORE, 1)[0]
        before = "\n" + RUN_BEFORE + before.rstrip() + "\n"
    return "\n".join(head) + new + before


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    old = args.page.read_text() if args.page.exists() else None
    args.page.write_text(page(section(THIS_RUN, args.junit, args.workers), old))
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
