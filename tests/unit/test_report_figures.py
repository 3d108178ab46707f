"""The pages quote measured figures only from the reports the repository regenerates.

A report is a page that code under benchmarks/ writes (docs/benchmarks.md by `make bench`,
docs/reliability.md by `make chaos`, docs/soak.md by `make soak`, docs/growth.md by
`python -m benchmarks.growth`, docs/container-figures.md by `make container-figures`),
each with the commit and date it measured in its Machine section.

In the page that quotes figures (docs/capacity.md), every number
with a decimal point, a thousands separator, a % or × or a unit (ms, s, B, KiB, MB/s,
files/s, jobs/s, …) must be in one of the reports, as it is written there — or be one of
the few below: a setting or limit (read from the code where it lives), an assumption
the page states, or a figure the page works out from a report's, with the working
checked here against the report. Pure text: no database, no server."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from arm_core.bridge.envelope import TEXT_CAPS
from arm_core.config import EnvSettings, Settings
from arm_core.devtools.config_doc import env_fields
from arm_core.devtools.reference import ReferenceConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REPORTS = ["benchmarks.md", "reliability.md", "soak.md", "growth.md", "container-figures.md"]
# Pages that quote the reports' figures.
PAGES = ["capacity.md"]
# Pages that state settings, limits and examples, and quote no measurement: no rate, no
# share of a core may appear in them (a figure there belongs in capacity.md, checked).
NO_MEASUREMENTS = ["README.md", "docs/operators.md"]

UNITS = (
    "files/s", "jobs/s", "req/s", "MB/s", "tps", "ms", "s", "B", "KB", "KiB", "MB", "MiB",
    "GB", "GiB", "TB", "%", "hours", "minutes",
)  # fmt: skip
_UNIT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
# A ratio is written `2.12×` on the pages; `360,000 × 1 KiB` is a product, not a ratio.
FIGURE = re.compile(
    r"(?<![\w.,/-])(?P<number>\d+(?:,\d{3})*(?:\.\d+)*)"
    r"(?:\s?(?P<unit>" + _UNIT + r")|(?P<times>×))?(?![\w/])"
)
RATES = re.compile(r"files/s|jobs/s|req/s|\btps\b|of a core|files a second")


def figures(text: str) -> list[str]:
    """The figures of `text` the rule covers, each as `number unit` (one space)."""
    found = []
    for m in FIGURE.finditer(text):
        number, unit = m["number"], m["unit"] or m["times"] or ""
        if unit or "," in number or "." in number:
            found.append(f"{number} {unit}".strip())
    return found


def in_report(figure: str, reports: str) -> bool:
    """`figure` written in a report: the same digits, the unit after at most one space."""
    number, _, unit = figure.partition(" ")
    pattern = r"(?<![\d.,])" + re.escape(number) + r"(?![\d]|[.,]\d)"
    if unit:
        pattern += r"\s?" + re.escape(unit)
    return re.search(pattern, reports) is not None


def reports_text() -> str:
    return "\n".join((DOCS / name).read_text(encoding="utf-8") for name in REPORTS)


# --- what benchmarks.md says, for the figures worked out from it --------------------------


def result(measure: str) -> str:
    """The figure cell of the one row of benchmarks.md's table whose measure has `measure`."""
    rows = []
    for line in (DOCS / "benchmarks.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and measure in cells[1]:
            rows.append(cells[2])
    assert len(rows) == 1, f"benchmarks.md: {len(rows)} rows measure {measure!r}"
    return rows[0]


def number(text: str) -> float:
    found = re.search(r"\d+(?:,\d{3})*(?:\.\d+)?", text)
    assert found, text
    return float(found[0].replace(",", ""))


def share(cell: str, process: str) -> float:
    """A process's % of one core in a CPU row: `bridge 64% · … · postgres 127% · …`."""
    found = re.search(rf"\b{process} (\d+)%", cell)
    assert found, (process, cell)
    return float(found[1])


def burst() -> float:
    return number(result("(a) burst of"))


def burst_cpu(process: str) -> float:
    return share(result("CPU during (a)"), process) / 100


def wal() -> float:
    return number(result("WAL bytes per file, upload")) + number(
        result("WAL bytes per file, processing")
    )


def default(cls: type[EnvSettings], variable: str) -> int:
    """The default of an environment variable of `cls`, as docs/configuration.md shows it."""
    value = dict(env_fields(cls))[variable]
    assert isinstance(value, int), (variable, value)
    return value


def stream_jobs() -> float:
    """Jobs whose answers the default stream holds, at the page's 1 KiB a job."""
    return default(Settings, "RESULTS_STREAM_MAX_BYTES") / 1024


# The uploads row of the four statements from 16 writers.
SIXTEEN_WRITERS = (
    "upload: 4 statements, 1 transaction (docs/dbas.md), -M extended, role arm_uploader, 16 clients"
)

# Figures capacity.md works out (the working is written beside each on the page): the
# text → what it is, computed from the report as the page says.
DERIVED: dict[str, Callable[[], str]] = {
    # 74% of a core ÷ 6,166 files/s: PostgreSQL's time per processed file.
    "0.12 ms": lambda: f"{burst_cpu('postgres') / burst() * 1000:.2f} ms",
    # 62% of a core ÷ 6,166 files/s: the bridge's.
    "0.10 ms": lambda: f"{burst_cpu('bridge') / burst() * 1000:.2f} ms",
    # 1 ÷ 0.12 ms, about: files one PostgreSQL core processes a second.
    "8,300": lambda: f"{round(burst() / burst_cpu('postgres'), -2):,.0f}",
    # 6,166 ÷ 0.62, about: files a bridge carries a second per core.
    "9,900": lambda: f"{round(burst() / burst_cpu('bridge'), -2):,.0f}",
    # 2,848 B upload + 3,243 B processing.
    "6,091 B": lambda: f"{wal():,.0f} B",
    # … at 1,000 files a second.
    "6.1 MB/s": lambda: f"{wal() * 1000 / 1e6:.1f} MB/s",
    # The results stream: 1 GiB ÷ 1 KiB, and that at 100 files a second and at 1,569.
    "1,050,000": lambda: f"{round(stream_jobs(), -4):,.0f}",
    "2.9 hours": lambda: f"{stream_jobs() / 100 / 3600:.1f} hours",
    "11 minutes": lambda: f"{stream_jobs() / number(result(SIXTEEN_WRITERS)) / 60:.0f} minutes",
    # 100 files a second through a 1-hour outage, × 1 KiB.
    "360,000": lambda: f"{100 * 3600:,}",
    "352 MiB": lambda: f"{100 * 3600 * 1024 / 2**20:.0f} MiB",
}


def _cap(parent: str, key: str) -> int:
    return next(cap for p, k, cap in TEXT_CAPS if (p, k) == (parent, key))


# Settings and limits, not measurements: the text → what it is (checked against the code
# where the code holds it).
SETTINGS: dict[str, Callable[[], str]] = {
    "1 GiB": lambda: f"{default(Settings, 'RESULTS_STREAM_MAX_BYTES') >> 30} GiB",
    "5,000": lambda: f"{default(ReferenceConfig, 'REFERENCE_PENDING_MAX'):,}",
    "4,000": lambda: f"{_cap('error', 'message'):,}",  # error.message is stored cut to it
}
# The rest, with the reason each is no measurement.
STATED = {
    "1 KiB": "the size of a job's answers capacity.md assumes (the stream bounds test holds "
    "the contract's examples under it)",
    "1 TB": "nats-server's own ceiling on the store it takes without max_file_store",
    "0.8": "the share of a core past which capacity.md says to add a bridge (a threshold)",
}


def test_the_reports_are_written_by_the_benchmarks_with_their_commit_and_date() -> None:
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "benchmarks").glob("*.py"))
    for name in REPORTS:
        assert f'"docs" / "{name}"' in code, f"no code under benchmarks/ writes docs/{name}"
        text = (DOCS / name).read_text(encoding="utf-8")
        assert "Written by `" in text, name
        assert re.search(r"^- date: \d{4}-\d\d-\d\d", text, re.MULTILINE), name
        assert re.search(r"^- arm-core: commit [0-9a-f]{7,}", text, re.MULTILINE), name


def test_every_figure_of_the_pages_is_in_a_report_or_accounted_for() -> None:
    reports = reports_text()
    accounted = {*DERIVED, *SETTINGS, *STATED}
    missing = []
    for name in PAGES:
        for n, line in enumerate((DOCS / name).read_text(encoding="utf-8").splitlines(), 1):
            for figure in figures(line):
                if figure not in accounted and not in_report(figure, reports):
                    missing.append(f"docs/{name}:{n}: {figure}")
    assert not missing, (
        "figures in no report (take them from docs/benchmarks.md and the other reports, "
        "or remove them):\n" + "\n".join(missing)
    )


def test_the_worked_out_figures_follow_from_the_report() -> None:
    page = (DOCS / "capacity.md").read_text(encoding="utf-8")
    quoted = set(figures(page))
    for text, working in {**DERIVED, **SETTINGS}.items():
        assert text in quoted, f"capacity.md no longer says {text}: drop it from the list"
        assert working() == text, f"capacity.md says {text}; the report gives {working()}"
    for text in STATED:
        assert text in quoted, f"capacity.md no longer says {text}: drop it from the list"


def test_capacity_names_the_run_its_figures_come_from() -> None:
    report = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    commit = re.search(r"^- arm-core: commit ([0-9a-f]+)", report, re.MULTILINE)
    date = re.search(r"^- date: (\d{4}-\d\d-\d\d)", report, re.MULTILINE)
    assert commit and date
    page = (DOCS / "capacity.md").read_text(encoding="utf-8")
    assert f"commit\n{commit[1]}" in page or f"commit {commit[1]}" in page, commit[1]
    assert date[1] in page, date[1]


def test_the_pages_of_settings_quote_no_measurement() -> None:
    for name in NO_MEASUREMENTS:
        for n, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            assert not RATES.search(line), f"{name}:{n} quotes a measurement: {line}"


def test_the_figure_pattern() -> None:
    line = (
        "0.40 ms (127% of a core ÷ 3,155 files/s) · 2.12× · 16 writers · p99 · "
        "`[1m]` · nats-server 2.15.1 · commit 9294c06 · 3 seconds · 1-hour · 360,000 × 1 GiB."
    )
    assert figures(line) == [
        "0.40 ms", "127 %", "3,155 files/s", "2.12 ×", "2.15.1", "360,000", "1 GiB",
    ]  # fmt: skip
    assert in_report("127 %", "postgres 127% ·") and not in_report("27 %", "postgres 127%")
    assert in_report("2.12 ×", "| 2.12 × |") and not in_report("2.1 ×", "2.12 ×")
