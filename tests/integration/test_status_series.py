"""The console's charts (migration 0010, db/functions/82_samples.sql): arm.sample_status()
samples what the status view shows, the schedule runs it, the bridges' waits add up per
sample, and arm.status_series() gives the differences, the quantiles and a bounded
window — read by a DBA the way the page reads it."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import psycopg
import pytest

from arm_core.devtools.testbed.sql import (
    Conn,
    ack,
    dict_conn,
    publish,
    result,
    sample,
    scalar,
    upload,
)

pytestmark = pytest.mark.integration

BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


def series(conn: Conn, minutes: int = 60) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM arm.status_series(%s)", (minutes,)).fetchall()


def counts(*pairs: tuple[int, int]) -> list[int]:
    """Bucket counts: (index of the bucket, count) pairs, the rest 0."""
    out = [0] * (len(BOUNDS) + 1)
    for index, n in pairs:
        out[index] = n
    return out


def test_the_bucket_bounds_are_the_histograms() -> None:
    from arm_core import instruments

    assert tuple(instruments.JOB_WAIT_BUCKETS) == BOUNDS


def test_two_samples_give_the_jobs_finished_between_them_by_outcome(conn: Conn) -> None:
    ups = [upload(conn) for _ in range(6)]
    began = time.monotonic()
    sample(conn, ago=60)
    publish(conn)
    for up in ups[:3]:
        ack(conn, up.job_id, up.file_id)
        result(conn, up.job_id, up.file_id)
    result(conn, ups[3].job_id, ups[3].file_id, status="needs_check")
    result(conn, ups[4].job_id, ups[4].file_id, status="error", error=("BAD_FILE", "broken"))
    conn.execute("SELECT arm.compact_counts()")  # folded or not, the counts are the same
    queued = upload(conn)
    sample(conn)
    between = time.monotonic() - began  # the samples' distance, beyond the 60 s forged
    first, second = series(conn)
    assert first["finished"] is None and first["seconds"] is None  # nothing before it
    assert first["queued"] == 6
    assert second["finished"] == {"done": 3, "needs_check": 1, "error": 1, "timeout": 0, "dlq": 0}
    assert second["queued"] == 1
    assert 60 <= second["seconds"] <= 60 + between + 0.5
    age = scalar(
        conn,
        "SELECT extract(epoch FROM now() - requested_at) FROM arm.recognition_job WHERE id = %s",
        (queued.job_id,),
    )
    assert 0 <= second["oldest_queued_age_seconds"] <= float(age) + 5


def test_a_count_that_fell_counts_as_nothing_finished(conn: Conn) -> None:
    up = upload(conn)
    publish(conn)
    result(conn, up.job_id, up.file_id)
    sample(conn, ago=60)
    with conn.transaction():  # a DBA's purge of the file and its job
        conn.execute(
            "UPDATE arm.stored_file SET current_recognition_job_id = NULL WHERE id = %s",
            (up.file_id,),
        )
        conn.execute("DELETE FROM arm.recognition_job WHERE file_id = %s", (up.file_id,))
    assert scalar(conn, "SELECT n FROM arm.job_counts() WHERE status = 'done'") == 0
    sample(conn)
    assert series(conn)[-1]["finished"]["done"] == 0


def test_each_sample_takes_the_waits_the_bridges_handed_over_since_the_one_before(
    conn: Conn,
) -> None:
    sample(conn, ago=120)
    # Before the second sample: two bridges' rows of the queued phase, one of ack.
    conn.execute("SELECT arm.record_waits('queued', %s)", (counts((2, 60)),))  # 0.05–0.1 s
    conn.execute("SELECT arm.record_waits('queued', %s)", (counts((2, 39), (7, 1)),))
    conn.execute("SELECT arm.record_waits('ack', %s)", (counts((16, 4)),))  # over an hour
    conn.execute("SELECT arm.record_waits('processing', %s)", (counts(),))  # none: not kept
    assert scalar(conn, "SELECT count(*) FROM arm.wait_sample") == 3
    sample(conn, ago=60)
    assert scalar(conn, "SELECT count(*) FROM arm.wait_sample") == 0  # taken, deleted
    conn.execute("SELECT arm.record_waits('queued', %s)", (counts((0, 10)),))
    sample(conn)
    first, second, third = series(conn)
    assert first["waits"] is None
    assert second["waits"] == {
        # rank 50 of 100, all of the first 99 between 0.05 and 0.1 s: interpolated
        "queued": {
            "n": 100,
            "p50": pytest.approx(0.05 + 0.05 * 50 / 99, abs=1e-3),
            "p99": pytest.approx(0.1, abs=1e-3),
        },
        # above the highest bound: the highest bound, as Prometheus says
        "ack": {"n": 4, "p50": 3600, "p99": 3600},
    }
    assert third["waits"] == {
        "queued": {
            "n": 10,
            "p50": pytest.approx(0.005, abs=1e-3),
            "p99": pytest.approx(0.0099, abs=1e-3),
        }
    }
    stored = conn.execute(
        "SELECT queued_waits, ack_waits, processing_waits FROM arm.status_sample "
        "ORDER BY sampled_at"
    ).fetchall()
    assert stored[1] == {
        "queued_waits": counts((2, 99), (7, 1)),
        "ack_waits": counts((16, 4)),
        "processing_waits": [],
    }


def test_a_wait_handed_over_while_a_sample_runs_goes_to_the_next_one(db_url: str) -> None:
    """Two transactions: a bridge's row committed after the sample's snapshot is neither
    taken nor deleted by it."""
    with dict_conn(db_url) as sampler, dict_conn(db_url) as bridge:
        sampler.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        sampler.execute("SELECT 1")  # the snapshot
        bridge.execute("SELECT arm.record_waits('queued', %s)", (counts((1, 5)),))
        sampler.execute("SELECT arm.sample_status()")
        sampler.execute("COMMIT")
        assert scalar(sampler, "SELECT count(*) FROM arm.wait_sample") == 1
        sample(sampler)
        waits = sampler.execute(
            "SELECT queued_waits FROM arm.status_sample ORDER BY sampled_at"
        ).fetchall()
        assert [sum(w["queued_waits"]) for w in waits] == [0, 5]


def test_waits_left_from_before_a_gap_are_dropped_not_charted(conn: Conn) -> None:
    conn.execute("SELECT arm.record_waits('queued', %s)", (counts((1, 5)),))
    conn.execute("UPDATE arm.wait_sample SET recorded_at = now() - interval '11 minutes'")
    conn.execute("SELECT arm.record_waits('queued', %s)", (counts((3, 2)),))
    sample(conn)
    assert scalar(conn, "SELECT count(*) FROM arm.wait_sample") == 0
    assert scalar(conn, "SELECT queued_waits FROM arm.status_sample") == counts((3, 2))


@pytest.mark.parametrize(
    "phase, values, message",
    [
        ("lost", counts((0, 1)), "unknown phase"),
        ("queued", [1, 2, 3], "17 counts expected"),
        ("queued", counts((3, -1)), "17 counts expected"),
        ("queued", None, "17 counts expected"),
    ],
)
def test_record_waits_refuses_what_no_bridge_sends(
    conn: Conn, phase: str, values: list[int] | None, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute("SELECT arm.record_waits(%s, %s)", (phase, values))
    assert scalar(conn, "SELECT count(*) FROM arm.wait_sample") == 0


def test_the_series_is_the_window_asked_for_and_the_samples_keep_a_day(conn: Conn) -> None:
    sample(conn, ago=2 * 3600)
    sample(conn, ago=30 * 60)
    conn.execute("INSERT INTO arm.status_sample VALUES (now() - interval '25 hours', '{}', 0)")
    sample(conn)  # prunes what is older than a day
    assert [r["seconds"] is None for r in series(conn, 60)] == [True, False]
    assert len(series(conn, 180)) == 3
    assert scalar(conn, "SELECT count(*) FROM arm.status_sample") == 3
    for minutes in (0, 1441, None):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="1 to 1440"):
            series(conn, minutes)  # type: ignore[arg-type]


def test_the_schedule_samples_every_minute(conn: Conn) -> None:
    task = conn.execute(
        "SELECT function_name::text AS f, run_every, enabled FROM arm.periodic_task "
        "WHERE name = 'sample_status'"
    ).fetchone()
    assert task == {
        "f": "arm.sample_status()",
        "run_every": dt.timedelta(minutes=1),
        "enabled": True,
    }
    upload(conn)
    conn.execute("UPDATE arm.periodic_task SET next_run_at = now() WHERE name = 'sample_status'")
    ran = conn.execute("SELECT * FROM arm.run_due_tasks() WHERE task = 'sample_status'").fetchall()
    assert [(r["error"], r["result"].startswith("queued 1, oldest")) for r in ran] == [(None, True)]
    assert [r["queued"] for r in series(conn)] == [1]
