"""Every loop of the bridge is supervised (bridge/service.py): an exception injected at
each loop's fault point (tests/support/fault_points.py) is one ERROR line naming the
loop, with its traceback, at once; the loop starts again; and a job uploaded after the
fault still reaches `done`. An answer in the inbox's hands when its worker crashed is
applied after the restart; a real fault of the kind a rolling deploy makes (the database
returns an outcome this bridge does not know) is survived the same way."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import envelope, instant_service, nats_client, send
from arm_core.devtools.testbed.sql import dict_conn, job, publish, scalar, upload
from tests.support.bridge import fast_settings, logged, running_bridge
from tests.support.fault_points import InjectedFault, armed

pytestmark = pytest.mark.integration

STREAM = "RESULTS"

# fault point → the loop it is in, and whether it needs RESULTS_STREAM.
POINTS = {
    "publisher": ("publisher", False),
    "inbox": ("inbox-", False),
    "listen": ("listen", False),
    "schedule": ("schedule", False),
    "waits": ("schedule", False),
    "connect": ("nats-connect", False),
    "stream": ("stream", True),
    "replay": ("replay", True),
}


def crashes(records: list[logging.LogRecord], loop: str) -> list[logging.LogRecord]:
    return [
        r
        for r in logged(records, action="service_crashed")
        if str(getattr(r, "service", "")).startswith(loop)
    ]


async def advisory(client: Client) -> None:
    """What the stream's servers publish when it has elected a leader."""
    body = {"type": "io.nats.jetstream.advisory.v1.stream_leader_elected", "leader": "n2"}
    await client.publish(
        f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{STREAM}", json.dumps(body).encode()
    )
    await client.flush()


async def done(db_url: str, job_id: Any, within: float = 30) -> float:
    """Waits for the job to be done; returns when it was (monotonic)."""
    with dict_conn(db_url) as conn:
        await wait_for(lambda: job(conn, job_id)["status"] == "done", within, f"{job_id} done")
    return time.time()


@pytest.mark.parametrize("point", list(POINTS))
async def test_an_exception_in_each_loop_is_logged_at_once_and_the_loop_restarted(
    point: str, db_url: str, js_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    loop, needs_stream = POINTS[point]
    extra: dict[str, Any] = {"results_stream": STREAM} if needs_stream else {}
    settings = fast_settings(db_url, js_server.url(), **extra)
    service = await instant_service(js_server.url())
    observer = await nats_client(js_server.url())
    with dict_conn(db_url) as conn:
        first = upload(conn)
    with armed((point, 1)):
        try:
            async with running_bridge(settings) as bridge:
                if point == "replay":
                    await advisory(observer)
                await wait_for(lambda: bool(crashes(caplog.records, loop)), 30, f"{loop} crashed")
                [crash] = crashes(caplog.records, loop)
                assert crash.levelno == logging.ERROR and crash.exc_info is not None
                assert isinstance(crash.exc_info[1], InjectedFault)
                name = str(crash.service)  # type: ignore[attr-defined]

                def restarted() -> list[logging.LogRecord]:
                    return logged(caplog.records, action="service_restarted", service=name)

                await wait_for(lambda: bool(restarted()), 10, f"{name} restarted")
                with dict_conn(db_url) as conn:
                    second = upload(conn)  # after the fault
                finished = await done(db_url, second.job_id)
                await done(db_url, first.job_id)
                if point == "replay":  # the restarted loop replays the next election
                    replays = len(logged(caplog.records, action="stream_replay"))
                    await advisory(observer)
                    await wait_for(
                        lambda: len(logged(caplog.records, action="stream_replay")) > replays,
                        10,
                        "a replay after the restart",
                    )
                assert bridge.supervisor.live()[0], bridge.supervisor.live()
                assert bridge.fatal is None and len(crashes(caplog.records, loop)) == 1
                raised = crash.exc_info[1].raised_at
                print(
                    f"\n{point}: from the exception, the ERROR line "
                    f"+{crash.created - raised:.4f} s, the restart "
                    f"+{restarted()[0].created - raised:.2f} s, the next job done "
                    f"+{finished - raised:.2f} s"
                )
        finally:
            await service.client.close()
            await observer.close()


async def test_the_answers_in_a_crashed_workers_hands_are_applied_after_its_restart(
    db_url: str, js_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """The inbox's batch stays with its worker across the crash: core NATS would not
    deliver those answers again."""
    caplog.set_level(logging.INFO)
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(20)]
    settings = fast_settings(db_url, js_server.url(), inbox_workers=1)
    service = await instant_service(js_server.url())
    with armed(("inbox", 1)):
        try:
            async with running_bridge(settings) as bridge:
                for up in ups:
                    await done(db_url, up.job_id)
                assert len(crashes(caplog.records, "inbox-0")) == 1
                assert bridge.inbox.dropped() == 0
        finally:
            await service.client.close()


def unknown_outcome(when: str, setup: str = "", first: str = "false", before: str = "") -> str:
    """What a newer release's apply_envelopes_v2 returns to an older bridge: an outcome it
    does not know, for the rows where `when` (SQL over the row `r`, the envelope `e` and
    `v_first`, a boolean computed as `first` says) holds; `setup` runs once, `before` at
    each call. The real function is kept under another name and called through."""
    return f"""
ALTER FUNCTION arm.apply_envelopes_v2(jsonb) RENAME TO apply_envelopes_v2_real;
{setup}
CREATE FUNCTION arm.apply_envelopes_v2(p_envelopes jsonb)
RETURNS TABLE (ord integer, outcome text, attempt integer, status arm.job_status,
               wait_seconds double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, arm, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_first boolean := {first};
BEGIN
    {before}
    RETURN QUERY
    SELECT r.ord, CASE WHEN {when} THEN 'deferred_for_mapping' ELSE r.outcome END,
           r.attempt, r.status, r.wait_seconds
    FROM arm.apply_envelopes_v2_real(p_envelopes) AS r
    JOIN jsonb_array_elements(p_envelopes) WITH ORDINALITY AS e(value, n) ON e.n = r.ord;
END;
$$;
GRANT EXECUTE ON FUNCTION arm.apply_envelopes_v2(jsonb) TO arm_bridge;
"""


# Once, for a whole batch: the first call only.
UNKNOWN_OUTCOME_ONCE = unknown_outcome(
    "v_first",
    setup="CREATE TABLE arm.fault_fired (fired boolean);",
    first="NOT EXISTS (SELECT FROM arm.fault_fired)",
    before="INSERT INTO arm.fault_fired SELECT true WHERE v_first;",
)
# One answer always, whatever batch it is in: a poison envelope.
UNKNOWN_OUTCOME_FOR_ONE = unknown_outcome("e.value->>'msg_id' = 'poison'")


async def test_an_outcome_this_bridge_does_not_know_is_logged_restarted_and_survived(
    db_url: str, js_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """With RESULTS_STREAM, as an operator met it: the inbox's worker raises ValueError on
    the unknown outcome. Before supervision that worker died without a word, the fetch
    loop waited forever for room in its buffer, and jobs stayed `processing`; now the
    crash is one ERROR line at once, the worker starts again, and every job uploaded
    after it is done."""
    caplog.set_level(logging.INFO)
    with dict_conn(db_url) as conn:
        conn.execute(UNKNOWN_OUTCOME_ONCE)
        first = upload(conn)
    settings = fast_settings(
        db_url, js_server.url(), results_stream=STREAM, inbox_workers=1, inbox_buffer_size=10
    )
    service = await instant_service(js_server.url())
    try:
        async with running_bridge(settings) as bridge:
            await wait_for(lambda: bool(crashes(caplog.records, "inbox-0")), 30, "crashed")
            [crash] = crashes(caplog.records, "inbox-0")
            assert crash.exc_info is not None and isinstance(crash.exc_info[1], ValueError)
            assert "deferred_for_mapping" in crash.getMessage()
            with dict_conn(db_url) as conn:
                later = [upload(conn) for _ in range(60)]
            for up in [first, *later]:
                await done(db_url, up.job_id)
            assert bridge.supervisor.live()[0] and bridge.fatal is None
    finally:
        await service.client.close()


async def test_a_poison_envelope_fails_alone_after_the_restart_and_takes_nothing_down(
    db_url: str, js_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch a worker crashed on is applied one envelope at a time after the
    restart: the one that raises alone is `failed` (logged with the error), the others of
    its batch and every later one are applied, and the loop crashed once, not until the
    process gave up."""
    caplog.set_level(logging.INFO)
    with dict_conn(db_url) as conn:
        conn.execute(UNKNOWN_OUTCOME_FOR_ONE)
        ups = [upload(conn) for _ in range(10)]
        publish(conn)
    # Unpaced: the ten published here by SQL are in flight past a paced floor, and the
    # later job must go out at once.
    settings = fast_settings(
        db_url, js_server.url(), inbox_workers=1, service_restart_limit=2, pacing="off"
    )
    client = await nats_client(js_server.url())
    try:
        async with running_bridge(settings) as bridge:
            # One batch: the inbox's worker is held until all ten are buffered.
            with dict_conn(db_url) as dba:
                dba.execute("BEGIN")
                dba.execute("SELECT id FROM arm.recognition_job FOR UPDATE")
                for i, up in enumerate(ups):
                    msg_id = "poison" if i == 4 else f"ack:{up.job_id}:1"
                    await send(client, envelope(up.job_id, up.file_id, "processing"), msg_id)
                await wait_for(lambda: bridge.inbox.counts["received"] == 10, 10, "received")
                dba.execute("ROLLBACK")
            with dict_conn(db_url) as conn:
                processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
                await wait_for(lambda: scalar(conn, processing) == 10, 30, "all ten applied")
                later = upload(conn)
            await done_later(db_url, later, client)
            assert len(crashes(caplog.records, "inbox-0")) == 1
            assert bridge.fatal is None and bridge.supervisor.live()[0]
            [failed] = logged(caplog.records, reason="apply_error")
            assert failed.msg_id == "poison" and "deferred_for_mapping" in failed.getMessage()
    finally:
        await client.close()


async def done_later(db_url: str, up: Any, client: Client) -> None:
    """A job uploaded after the poison: published, answered, done."""
    with dict_conn(db_url) as conn:
        await wait_for(lambda: job(conn, up.job_id)["status"] == "published", 10, "published")
    await send(client, envelope(up.job_id, up.file_id, "done"), f"result:{up.job_id}:1")
    await done(db_url, up.job_id)


async def test_the_callback_never_waits_for_a_worker_that_has_failed(
    db_url: str, js_server: EmbeddedNats
) -> None:
    """A worker that failed past the limit drains nothing: the NATS callback drops (and
    counts) instead of waiting for room in its buffer forever."""
    settings = fast_settings(
        db_url,
        js_server.url(),
        inbox_workers=1,
        inbox_buffer_size=2,
        inbox_batch_size=1,
        service_restart_limit=0,
    )
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(8)]
        publish(conn)
    client = await nats_client(js_server.url())
    with armed(("inbox", -1)):
        try:
            async with running_bridge(settings) as bridge:
                counts = bridge.inbox.counts
                # The first answer reaches the worker, which fails at once, past its limit.
                await send(client, envelope(ups[0].job_id, ups[0].file_id, "processing"), "a:0")
                await wait_for(lambda: bridge.fatal is not None, 30, "the inbox failed")
                fatal = bridge.fatal
                assert fatal is not None and fatal.reason.startswith("inbox-0 crashed")
                assert not bridge.supervisor.live()[0]

                # Two fill the buffer; each one after is handed over and dropped at once: the
                # callback is free for the next.
                def received(n: int) -> Callable[[], bool]:
                    return lambda: counts["received"] == n

                for i, up in enumerate(ups[1:], 1):
                    await send(client, envelope(up.job_id, up.file_id, "processing"), f"a:{i}")
                    await wait_for(received(i + 1), 10, f"answer {i} taken")
                assert counts["dropped.shutdown"] == 8 - 1 - 2
                assert bridge.inbox.buffered() == 2
        finally:
            await client.close()
