"""The soak's time-based verdict (benchmarks/soak.py judge): what counts as growth."""

from __future__ import annotations

import os

from benchmarks import soak


def _row(minute: float, p99: float = 0.25, index: int = 1 << 20) -> soak.Row:
    return soak.Row(
        minute=minute,
        jobs_done=1000,
        p50=0.1,
        p99=p99,
        rss_mib={},
        connections=10,
        tables={},
        indexes=dict.fromkeys(soak.QUEUE_INDEXES, index),
        stream_bytes=0,
    )


def _hour(series: dict[int, list[tuple[float, float, str, float]]]) -> soak.Soak:
    run = soak.Soak(minutes=60)
    run.rows = [_row(m) for m in range(5, 65, 5)]
    run.rss_by_pid = series
    return run


def test_a_process_that_grows_after_the_warm_up_fails_the_soak() -> None:
    # bridge 1: 87 → 96 MiB between minute 10 and the end, running since the start
    series = [
        (m * 60.0, 87 + max(0, m - 10) * 0.18, "bridge:1", m * 60.0 + 30) for m in (5, 10, 35, 60)
    ]
    assert soak.judge(_hour({1: series}), warmup=10) == [
        "bridge:1: RSS grew 87 → 96 MiB after the warm-up"
    ]


def test_a_process_restarted_late_is_judged_from_its_own_warm_up() -> None:
    # restarted at minute 48: 77 MiB two minutes in, 85 when the run ends at its 12th minute
    late = [
        (50 * 60.0, 77.0, "bridge:2", 120.0),
        (55 * 60.0, 85.0, "bridge:2", 420.0),
        (60 * 60.0, 85.0, "bridge:2", 720.0),
    ]
    assert soak.judge(_hour({2: late}), warmup=10) == []
    # the same process still growing once it is ten minutes old does fail
    later = [*late, (65 * 60.0, 94.0, "bridge:2", 1020.0)]
    assert soak.judge(_hour({2: later}), warmup=10) == [
        "bridge:2: RSS grew 85 → 94 MiB after the warm-up"
    ]


def test_the_reference_is_judged_only_once_its_job_memory_can_be_full() -> None:
    # It remembers REMEMBER_SECONDS of jobs: a 3-minute run's 1-minute warm-up cannot
    # judge it; an hour's 10-minute warm-up does.
    grows = [(m * 60.0, 78.0 + m, "reference:7", m * 60.0) for m in (1, 2, 3)]
    short = soak.Soak(minutes=3)
    short.rows = [_row(1), _row(2), _row(3)]
    short.rss_by_pid = {7: grows}
    assert soak.judge(short, warmup=1) == []
    hour = [(m * 60.0, 78.0 + m, "reference:7", m * 60.0) for m in (10, 35, 60)]
    assert soak.judge(_hour({7: hour}), warmup=10) == [
        "reference:7: RSS grew 88 → 138 MiB after the warm-up"
    ]


def test_p99_and_queue_indexes_are_read_from_the_warm_up_row_to_the_last() -> None:
    run = _hour({})
    run.rows[-1] = _row(60, p99=0.40, index=3 << 20)
    said = soak.judge(run, warmup=10)
    assert said[0] == "p99 grew 0.250 → 0.400 s after the warm-up"
    assert len(said) == 1 + len(soak.QUEUE_INDEXES)


def test_the_age_of_a_running_process_is_read_from_proc() -> None:
    age = soak.age_seconds(os.getpid())
    assert age is not None and 0 <= age < 24 * 3600
    assert soak.age_seconds(2**22 + 12345) is None  # above pid_max: no such process
