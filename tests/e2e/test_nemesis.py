"""The nemesis (src/arm_core/devtools/testbed/nemesis.py): for each seed, a random but replayable
schedule of real faults over a steady flow, a service that fails some first attempts
and an operator double-clicking retry; then the whole history is checked. A failure
names its seed; give it back with NEMESIS_SEEDS=<seed> (and NEMESIS_FAULTS=<n>) to run
that schedule again, or `make chaos CHAOS_ARGS="--nemesis --seeds 20"` for many."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arm_core.devtools.testbed import nemesis
from arm_core.devtools.testbed.faults import iptables_missing

pytestmark = pytest.mark.e2e

SEEDS = [int(s) for s in os.environ.get("NEMESIS_SEEDS", "1,2,3").split(",") if s.strip()]
FAULTS = int(os.environ.get("NEMESIS_FAULTS", "4"))


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
async def test_a_random_schedule_of_faults_breaks_no_promise(seed: int, tmp_path: Path) -> None:
    if missing := iptables_missing():
        pytest.skip(missing)
    result = await nemesis.run(tmp_path, seed, FAULTS)
    print(f"\n{result.summary()}")
    for fault in result.faults:
        print(
            f"  {fault.kind} on {fault.target} for {fault.seconds:g} s, {fault.live_at_start} live"
        )
    assert len(result.faults) == FAULTS and all(f.live_at_start > 0 for f in result.faults)
    assert result.problems == [], (
        f"seed {seed} (NEMESIS_SEEDS={seed} NEMESIS_FAULTS={FAULTS} to replay): "
        + "; ".join(result.problems[:20])
    )
