"""The soak (benchmarks/soak.py) for three minutes: the flow at a quarter of the world's
measured capacity, a fault, a row a minute, and the same verdict as the hour-long run —
the history checked, no growth past its bounds after the warm-up (a third of the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import soak
from tests.support.faults import iptables_missing

pytestmark = pytest.mark.e2e


async def test_three_minutes_of_flow_and_faults_break_no_promise(tmp_path: Path) -> None:
    if missing := iptables_missing():
        pytest.skip(missing)
    result = await soak.run(tmp_path, minutes=3, every=60, fault_every=30)
    for row in result.rows:
        print(soak.format_row(row))
    assert len(result.rows) >= 3 and result.faults
    assert all(row.jobs_done > 0 for row in result.rows[1:])
    assert result.problems == [], result.problems
