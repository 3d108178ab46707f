"""`make bench` rewrites docs/benchmarks.md and docs/pacing-trace.svg — the report the pages
quote, at production durability — only on a full, durable run. A run with --quick, --only
or --durability off prints its table, and writes it only to another --doc it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import DOC, SECTIONS, parse_args
from benchmarks.pacing import TRACE

PARTIAL = [["--quick"], ["--only", "files"], ["--only", "sweep,retry"], ["--durability", "off"]]


def test_a_full_durable_run_writes_the_report_and_its_trace() -> None:
    args = parse_args([])
    assert (args.doc, args.trace) == (DOC, TRACE)
    # Every section named is a full run too.
    args = parse_args(["--only", ",".join(SECTIONS), "--durability", "on"])
    assert (args.doc, args.trace) == (DOC, TRACE)


@pytest.mark.parametrize("flags", PARTIAL, ids=" ".join)
def test_a_partial_quick_or_non_durable_run_writes_nothing(flags: list[str]) -> None:
    args = parse_args(flags)
    assert (args.doc, args.trace) == (None, None)


@pytest.mark.parametrize("flags", PARTIAL, ids=" ".join)
def test_a_partial_run_writes_only_where_it_is_told(flags: list[str], tmp_path: Path) -> None:
    args = parse_args([*flags, "--doc", str(tmp_path / "smoke.md")])
    assert args.doc == tmp_path / "smoke.md"
    assert args.trace == tmp_path / "smoke-pacing-trace.svg"


@pytest.mark.parametrize("flags", PARTIAL, ids=" ".join)
def test_a_partial_run_may_not_be_pointed_at_the_report(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args([*flags, "--doc", str(DOC)])
    assert exited.value.code == 2
    assert "only a full run at production durability" in capsys.readouterr().err
