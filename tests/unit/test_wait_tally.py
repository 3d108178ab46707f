"""The waits the schedule runner hands to arm.record_waits (arm_core.instruments.WaitTally):
each in the bucket whose bound it does not exceed, as the histogram counts it; taken
once; what the database did not take comes back."""

from __future__ import annotations

from arm_core.instruments import JOB_WAIT_BUCKETS, Metrics, WaitTally


def test_each_wait_lands_in_the_bucket_the_histogram_counts_it_in() -> None:
    tally = WaitTally()
    for seconds in (0.0, 0.01, 0.010001, 3600, 3600.5, -1.0):
        tally.add("queued", seconds)
    counts = tally.take()["queued"]
    assert len(counts) == len(JOB_WAIT_BUCKETS) + 1
    # 0, 0.01 and a negative (a clock step) at or below 0.01; 0.010001 above it;
    # 3600 in the last bound's bucket; 3600.5 above every bound.
    assert (counts[0], counts[1], counts[-2], counts[-1], sum(counts)) == (3, 1, 1, 1, 6)
    # The histogram's buckets, as it exposes them (le labels), are the same bounds.
    [family] = Metrics().job_wait.collect()
    bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
    assert bounds == [*JOB_WAIT_BUCKETS, float("inf")]


def test_a_take_empties_and_a_give_back_adds_to_what_came_since() -> None:
    tally = WaitTally()
    tally.add("ack", 0.2)
    taken = tally.take()
    assert tally.take() == {}
    tally.add("ack", 0.2)
    tally.add("processing", 5)
    tally.give_back(taken)
    again = tally.take()
    assert sum(again["ack"]) == 2 and again["ack"][3] == 2
    assert sum(again["processing"]) == 1
