"""The one table the benchmark prints: each figure next to the reference it is read
against (measured in the same run), and the machine it ran on."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from arm_core.devtools.embedded_postgres import find_pg_bindir


@dataclass
class Row:
    key: str  # how other rows name this one as their reference
    section: str
    measure: str
    value: float | None = None
    unit: str = ""
    ref: str | None = None  # key of the reference row; the ratio is value ÷ reference
    text: str | None = None  # a figure that is not one number (counts, percentiles)
    digits: int = 0
    short: str = ""  # how the row is named where it is a reference


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(
        self,
        key: str,
        section: str,
        measure: str,
        value: float | None = None,
        unit: str = "",
        ref: str | None = None,
        text: str | None = None,
        digits: int = 0,
        short: str = "",
    ) -> Row:
        row = Row(key, section, measure, value, unit, ref, text, digits, short or measure)
        self.rows.append(row)
        return row

    def note(self, text: str) -> None:
        self.notes.append(text)

    def value(self, key: str) -> float | None:
        for row in self.rows:
            if row.key == key:
                return row.value
        return None

    def _find(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def table(self) -> str:
        """A Markdown pipe table, aligned so that it also reads well in a terminal."""
        header = ["section", "measure", "figure", "reference (same run)", "ratio"]
        lines = [header]
        for row in self.rows:
            lines.append([row.section, row.measure, _figure(row), *self._reference(row)])
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        right = {2, 4}

        def render(cells: list[str]) -> str:
            padded = [
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "| " + " | ".join(padded) + " |"

        rule = "|" + "|".join(
            "-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)
        )
        rule += "|"
        return "\n".join([render(lines[0]), rule, *(render(cells) for cells in lines[1:])])

    def _reference(self, row: Row) -> tuple[str, str]:
        if row.ref is None:
            return "", ""
        ref = self._find(row.ref)
        if ref is None or ref.value is None:
            return f"{row.ref}: not measured in this run", ""
        if row.value is None or ref.value == 0:
            return f"{ref.short}: {_figure(ref)}", ""
        return f"{ref.short}: {_figure(ref)}", f"{row.value / ref.value:.2f}"


def _figure(row: Row) -> str:
    if row.text is not None:
        return row.text
    if row.value is None:
        return "—"
    return f"{row.value:,.{row.digits}f} {row.unit}".rstrip()


def command_output(cmd: list[str]) -> str:
    """The first line a command prints (stdout, else stderr), for a report's Machine."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"({exc})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


# What the embedded server runs with unless told otherwise (EmbeddedPostgres(durable=False):
# the tests', `arm-core dev`'s and `make chaos`'s cluster).
FAST_SETTINGS = "fsync=off, synchronous_commit=off, full_page_writes=off, shared_buffers=128MB"
SETTINGS_SHOWN = ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers")


def server_settings(url: str) -> str:
    """`fsync=on, synchronous_commit=on, …` as the running server reports them (SHOW), so
    the header says what was measured, not what was asked for."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
            (list(SETTINGS_SHOWN),),
        ).fetchall()
    return ", ".join(f"{name}={value}" for name, value in rows)


def durability(settings: str) -> str:
    """`on` when fsync, synchronous_commit and full_page_writes are all on, `off` when all
    three are off, else `mixed`."""
    values = dict(part.split("=", 1) for part in settings.split(", "))
    three = {values.get(k) for k in SETTINGS_SHOWN[:3]}
    return "on" if three == {"on"} else "off" if three == {"off"} else "mixed"


def machine(settings: str = FAST_SETTINGS) -> list[str]:
    """nproc, memory, CPU model, the server versions (with the embedded PostgreSQL's
    durability `settings`) and the date, one per line."""
    cpu = "unknown"
    mem_kb = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    nats_binary = shutil.which("nats-server") or str(Path(sys.executable).with_name("nats-server"))
    postgres = command_output([str(find_pg_bindir() / "postgres"), "--version"])
    return [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"cpus (nproc): {os.cpu_count()}; cpu: {cpu}; memory: {mem_kb / 1024 / 1024:.1f} GiB",
        f"os: {platform.platform()}; python {platform.python_version()}",
        f"PostgreSQL: {postgres} (embedded: {settings})",
        f"nats-server: {command_output([nats_binary, '--version']).removeprefix('nats-server: ')}",
        f"arm-core: {_tree()}",
    ]


def _tree() -> str:
    """The commit measured, and any uncommitted changes to the code under test."""
    root = str(Path(__file__).resolve().parents[1])
    head = command_output(["git", "-C", root, "log", "-1", "--format=%h %s"])
    out = subprocess.run(
        ["git", "-C", root, "status", "--porcelain", "--", "src", "bridge", "http", "db"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.split("\n")
    changed = [line[3:] for line in out if line.strip()]
    return f"commit {head}" + (
        f"; with uncommitted changes in {', '.join(changed)}" if changed else ""
    )


def markdown(
    report: Report,
    machine_lines: list[str],
    command: str,
    wall: float,
    methods: dict[str, str],
    settings: str = FAST_SETTINGS,
) -> str:
    """docs/benchmarks.md: how it was run, on what, the table, the notes, and how each
    section measures (the docstrings of the section modules)."""
    parts = [
        "# Benchmarks",
        "",
        "Written by `make bench` at the end of every full run at production durability "
        "(overwritten; a run with `--quick`, `--only` or `--durability off` only prints its "
        "table, or writes it to its `--doc`). Each figure stands "
        "next to the reference it is read against, measured in the same run on the same "
        "PostgreSQL cluster: the machine varies about two-fold from run to run, so read the "
        "ratios, not the absolute numbers.",
        "",
        f"Command: `{command}`; the whole run took {wall:.0f} s.",
        "",
        durability_sentence(settings),
        "",
        "## Machine",
        "",
        *[f"- {line}" for line in machine_lines],
        "",
        "## Results",
        "",
        report.table(),
        "",
        "## Notes",
        "",
        *([f"- {n}" for n in report.notes] or ["(none)"]),
        "",
        "## How each section measures",
        "",
    ]
    for name, doc in methods.items():
        parts += [f"**{name}**: " + " ".join(doc.split("\n\n")[0].split()), ""]
        for paragraph in doc.split("\n\n")[1:]:
            parts += [" ".join(paragraph.split()), ""]
    return "\n".join(parts)


def durability_sentence(settings: str) -> str:
    """What the run's PostgreSQL promised about a commit, in one sentence."""
    mode = durability(settings)
    if mode == "on":
        return (
            "Durability: **on**: the embedded PostgreSQL ran with initdb's defaults "
            f"({settings}), as in production: every commit waits for its WAL flush. "
            '(`make bench BENCH_ARGS="--durability off"` runs with fsync, '
            "synchronous_commit and full_page_writes off, as the tests do.)"
        )
    if mode == "off":
        return (
            f"Durability: **off** ({settings}): commits do not wait for a WAL flush and no "
            "full-page images are written, so the figures are higher than production's "
            "(`make bench` without `--durability off` measures with initdb's defaults)."
        )
    return f"Durability: **mixed** ({settings})."
