"""Pacing in the database (db/functions/22_pacing.sql): the paced claim takes no more of
a pipeline than its in-flight limit leaves, shared by every claimer; round robin over
the consolidations; pinned by a DBA; `off` as before; nothing new published to a service
that stopped answering but a lone probe."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from arm_core.db import query
from arm_core.devtools.testbed.sql import Conn, ack, result, scalar, upload
from arm_core.store import Pacing, publish_params

pytestmark = pytest.mark.integration

IN_FLIGHT = (
    "SELECT count(*) FROM arm.recognition_job "
    "WHERE pipeline = 'tabular' AND status IN ('published', 'processing')"
)


def claim(
    conn: Conn,
    pacing: str = "fixed",
    limit: int = 100,
    tabular: tuple[int, int] = (1, 3),
    image: tuple[int, int] = (1, 1000),
    ack_timeout: float = 30.0,
    max_republish: int = 2,
) -> list[dict[str, Any]]:
    """One paced claim in its own transaction, committed: what a bridge's publisher does
    (the publish to NATS between the two aside)."""
    params = publish_params(
        limit=limit,
        tabular_timeout=600,
        image_timeout=1800,
        tabular_subject="files.tabular_uploaded",
        image_subject="files.img_uploaded",
        max_bytes=1 << 20,
        pacing=Pacing(
            pacing=pacing,
            tabular_min=tabular[0],
            tabular_max=tabular[1],
            image_min=image[0],
            image_max=image[1],
            ack_timeout=ack_timeout,
            max_republish=max_republish,
        ),
    )
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("publish_paced_jobs"), params).fetchall()


def uploads(conn: Conn, n: int, consolidation: uuid.UUID, file_type: str = "XLSX") -> list[Any]:
    return [upload(conn, file_type, consolidation_id=consolidation) for _ in range(n)]


def answer(conn: Conn, job_id: uuid.UUID) -> None:
    file_id = scalar(conn, "SELECT file_id FROM arm.recognition_job WHERE id = %s", (job_id,))
    ack(conn, job_id, file_id)
    result(conn, job_id, file_id)


def test_a_fixed_limit_publishes_no_more_than_it_leaves(conn: Conn) -> None:
    ups = uploads(conn, 10, uuid.uuid4())
    first = claim(conn)
    assert len(first) == 3 and scalar(conn, IN_FLIGHT) == 3
    assert claim(conn) == []  # at the limit: nothing
    # The oldest first, within the one consolidation.
    assert [r["job_id"] for r in first] == [u.job_id for u in ups[:3]]
    answer(conn, first[0]["job_id"])
    assert [r["job_id"] for r in claim(conn)] == [ups[3].job_id]  # one answer, one room
    # An ack alone frees nothing: the job is still in the service's hands.
    ack(conn, first[1]["job_id"], ups[1].file_id)
    assert claim(conn) == []
    # The image pipeline has its own limit.
    scans = uploads(conn, 2, uuid.uuid4(), "PDF")
    assert {r["job_id"] for r in claim(conn)} == {s.job_id for s in scans}


def test_off_publishes_every_queued_job_at_once_as_before(conn: Conn) -> None:
    uploads(conn, 7, uuid.uuid4())
    assert len(claim(conn, pacing="off", limit=5)) == 5
    assert len(claim(conn, pacing="off", limit=5)) == 2
    assert scalar(conn, IN_FLIGHT) == 7


def test_a_pinned_limit_wins_until_unpinned(conn: Conn) -> None:
    uploads(conn, 10, uuid.uuid4())
    row = conn.execute("SELECT * FROM arm.pin_in_flight_limit('tabular', 2)").fetchone()
    assert row is not None and row["pinned_limit"] == 2
    assert len(claim(conn, tabular=(1, 8))) == 2
    assert claim(conn, tabular=(1, 8)) == []
    view = conn.execute("SELECT * FROM arm.pace_view() WHERE pipeline = 'tabular'").fetchone()
    assert view is not None
    assert (view["in_flight_limit"], view["pinned"], view["in_flight"]) == (2, True, 2)
    assert (view["queued"], view["held_back"]) == (8, 8)
    conn.execute("SELECT arm.pin_in_flight_limit('tabular', NULL)")
    assert len(claim(conn, tabular=(1, 8))) == 6
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at least 1"):
        conn.execute("SELECT arm.pin_in_flight_limit('tabular', 0)")


def test_round_robin_over_consolidations_oldest_first_within_one(conn: Conn) -> None:
    big, small, late = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    bigs = uploads(conn, 30, big)
    smalls = uploads(conn, 3, small)
    first = [r["job_id"] for r in claim(conn, tabular=(1, 4))]
    # Both lanes served, in turn, each from its oldest.
    assert set(first) == {bigs[0].job_id, bigs[1].job_id, smalls[0].job_id, smalls[1].job_id}
    for job_id in first:
        answer(conn, job_id)
    lates = uploads(conn, 2, late)
    second = [r["job_id"] for r in claim(conn, tabular=(1, 4))]
    # A lane never served comes first; the small one's last file is not behind the big.
    assert set(second) == {lates[0].job_id, lates[1].job_id, smalls[2].job_id, bigs[2].job_id}
    for job_id in second:
        answer(conn, job_id)
    # The small and late lanes are empty: the next claim drops them, and the big one goes
    # on alone.
    third = [r["job_id"] for r in claim(conn, tabular=(1, 4))]
    assert third == [u.job_id for u in bigs[3:7]]
    lanes = conn.execute("SELECT lane FROM arm.pace_lane").fetchall()
    assert [r["lane"] for r in lanes] == [big]


def test_a_retry_counts_as_its_consolidations(conn: Conn) -> None:
    consolidation = uuid.uuid4()
    [up] = uploads(conn, 1, consolidation)
    [row] = claim(conn)
    file_id = up.file_id
    ack(conn, row["job_id"], file_id)
    result(conn, row["job_id"], file_id, "error", error=("UNREADABLE", "?"))
    conn.execute("SELECT * FROM arm.retry_file_v3(%s, 'op', NULL, 'operator')", (file_id,))
    lanes = conn.execute("SELECT lane FROM arm.pace_lane").fetchall()
    assert [r["lane"] for r in lanes] == [consolidation]
    retried = scalar(
        conn, "SELECT lane FROM arm.recognition_job WHERE file_id = %s AND attempt = 2", (file_id,)
    )
    assert retried == consolidation


def test_two_claimers_at_once_never_exceed_the_limit(db_url: str, conn: Conn) -> None:
    """Two publishers (each its own connection, as two bridges) claim and answer as fast as
    they can; a third samples in flight. The limit is never passed."""
    uploads(conn, 300, uuid.uuid4())
    limit = 7
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            with psycopg.connect(db_url, row_factory=dict_row) as mine:
                mine.autocommit = True
                while not stop.is_set():
                    with mine.transaction(), mine.cursor() as cur:
                        claimed = cur.execute(
                            query("publish_paced_jobs"),
                            {
                                "limit": 3,
                                "tabular_timeout": 600,
                                "image_timeout": 1800,
                                "tabular_subject": "t",
                                "image_subject": "i",
                                "max_bytes": 1 << 20,
                                "pacing": "fixed",
                                "tabular_min": 1,
                                "tabular_max": limit,
                                "image_min": 1,
                                "image_max": 1,
                                "ack_timeout": 30,
                                "max_republish": 2,
                            },
                        ).fetchall()
                        time.sleep(0.002)  # the publish to NATS, under the claim's lock
                    for row in claimed:
                        answer(mine, row["job_id"])
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=publisher) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not stop.is_set():
        seen.append(scalar(conn, IN_FLIGHT))
        if scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'") == 300:
            break
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'") == 300
    assert len(seen) > 20 and max(seen) <= limit, (len(seen), max(seen))
    assert max(seen) >= limit - 3  # and it was in use (sampled between claims and answers)


def test_a_service_that_stopped_answering_gets_nothing_new_but_a_probe(conn: Conn) -> None:
    uploads(conn, 20, uuid.uuid4())
    # A limit grown to 4 by earlier answers, adjusted a moment ago.
    conn.execute(
        "UPDATE arm.pipeline_pace SET adaptive_limit = 4, adjusted_at = clock_timestamp() "
        "WHERE pipeline = 'tabular'"
    )
    auto: dict[str, Any] = {
        "pacing": "auto",
        "tabular": (1, 100),
        "ack_timeout": 0.2,
        "max_republish": 1,
    }
    assert len(claim(conn, **auto)) == 4
    time.sleep(0.3)  # an ack timeout passes with no ack
    assert claim(conn, **auto) == []
    pace = conn.execute("SELECT * FROM arm.pace_view() WHERE pipeline = 'tabular'").fetchone()
    assert pace is not None
    assert (pace["answering"], pace["in_flight_limit"]) == (False, 1)
    assert pace["held_back"] == 16 and pace["silent_since"] is not None
    # The four in flight end (dead-lettered, as the contract says): still nothing new
    # until a probe is due (a republish budget after the silence began), then one.
    conn.execute("SELECT * FROM arm.dead_letter_unacked('0 s', 0)")
    assert claim(conn, **auto) == []
    conn.execute(
        "UPDATE arm.pipeline_pace SET probe_after = probe_after - interval '1 minute' "
        "WHERE pipeline = 'tabular'"
    )
    [probe] = claim(conn, **auto)
    assert probe["probe"] is True  # sent with a reply subject: see the bridge's test
    assert claim(conn, **auto) == []
    # The service answers the probe: answering again, and the queue flows.
    rows = conn.execute(
        query("apply_envelopes"),
        {
            "envelopes": psycopg.types.json.Jsonb(
                [
                    {
                        "job_id": str(probe["job_id"]),
                        "file_id": str(probe["file_id"]),
                        "status": "processing",
                        "service_name": "tabular-parser",
                        "service_version": "1",
                    }
                ]
            )
        },
    ).fetchall()
    assert [r["outcome"] for r in rows] == ["applied"]
    time.sleep(0.15)  # the next adjustment window
    claim(conn, **auto)
    pace = conn.execute("SELECT * FROM arm.pace_view() WHERE pipeline = 'tabular'").fetchone()
    assert pace is not None and pace["answering"] is True and pace["silent_since"] is None


def test_nobody_listening_holds_the_pipeline_and_probes_again_soon(conn: Conn) -> None:
    """The publisher's probe found no subscriber (the server's no responders; it rolled
    the probe back): the pipeline waits, and the next probe comes after the retry."""
    uploads(conn, 3, uuid.uuid4())
    auto: dict[str, Any] = {"pacing": "auto", "tabular": (1, 100), "ack_timeout": 30.0}
    conn.execute("SELECT arm.pace_unheard('tabular', 0.3)")
    assert claim(conn, **auto) == []
    pace = conn.execute("SELECT * FROM arm.pace_view() WHERE pipeline = 'tabular'").fetchone()
    assert pace is not None and (pace["answering"], pace["held_back"]) == (False, 3)
    time.sleep(0.4)
    [probe] = claim(conn, **auto)
    assert probe["probe"] is True


def test_a_lane_dropped_while_an_upload_into_it_was_open_is_found_again(db_url: str) -> None:
    """The claim drops a lane it finds empty; an upload into it that had not committed yet
    saw the lane and added none. Its job is claimed all the same once the lanes run dry
    (arm._repair_lanes)."""
    consolidation = uuid.uuid4()
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        [first] = uploads(conn, 1, consolidation)
        assert [r["job_id"] for r in claim(conn)] == [first.job_id]
        with (
            psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as uploader,
            uploader.transaction(),  # committed at the end of the block
        ):
            late = upload(uploader, consolidation_id=consolidation)
            assert claim(conn) == []  # the lane is empty to everyone: dropped
            assert scalar(conn, "SELECT count(*) FROM arm.pace_lane") == 0
        answer(conn, first.job_id)
        assert [r["job_id"] for r in claim(conn)] == [late.job_id]


READY_AGE = "SELECT arm.outbox_ready_age()"


def backdate(conn: Conn, seconds: float, job_ids: list[uuid.UUID]) -> None:
    """Moves jobs' requested_at back, as if uploaded `seconds` earlier (a job's
    requested_at never changes: the guard trigger is left out for this one statement)."""
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        "UPDATE arm.recognition_job SET requested_at = requested_at - make_interval(secs => %s) "
        "WHERE id = ANY(%s)",
        (seconds, job_ids),
    )
    conn.execute("RESET session_replication_role")


def test_the_ready_age_leaves_out_what_pacing_holds_back(conn: Conn) -> None:
    """arm.outbox_ready_age, what the health check's `outbox` and ArmCoreOutboxStuck read:
    a job its pipeline's limit holds back is not ready to publish (a long paced burst is
    not a stuck publisher); one of a pipeline with room is, and so is every queued job
    when pacing is off."""
    tabular = uploads(conn, 5, uuid.uuid4())
    backdate(conn, 600, [u.job_id for u in tabular])
    assert 599 < scalar(conn, READY_AGE) < 660  # off, as migrated: the oldest queued job
    first = claim(conn)  # fixed, at most 3 tabular in flight: two held back
    assert len(first) == 3 and scalar(conn, READY_AGE) == 0
    [scan] = uploads(conn, 1, uuid.uuid4(), "PDF")
    backdate(conn, 120, [scan.job_id])
    assert 119 < scalar(conn, READY_AGE) < 180  # the image pipeline has room
    assert [r["job_id"] for r in claim(conn)] == [scan.job_id]
    assert scalar(conn, READY_AGE) == 0
    answer(conn, first[0]["job_id"])  # room for one tabular job: the two are ready again
    assert 599 < scalar(conn, READY_AGE) < 660
    # A service that stopped answering holds back its whole pipeline (auto).
    conn.execute(
        "UPDATE arm.pipeline_pace SET mode = 'auto', answering = false WHERE pipeline = 'tabular'"
    )
    assert scalar(conn, READY_AGE) == 0
