"""Pacing against a recognition service of bounded capacity (`arm-core reference` with
REFERENCE_WORKERS and a per-file time), processes as users run them. The core is told
nothing about the capacity: PACING=auto finds it.

- A burst of one consolidation larger than the service can finish within the reply
  deadline: with PACING=off (the release before pacing) jobs end `timeout`; paced, every
  one ends `done`.
- Another consolidation's few files uploaded mid-burst are done long before the burst:
  they are not queued behind it.
- The service away while files are uploaded: paced, nobody listening holds them queued
  (no dead letter), and they flow when it is back."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, listening, log_lines
from arm_core.devtools.testbed.sql import Conn, dict_conn, scalar, upload_consolidations

pytestmark = pytest.mark.e2e

WORKERS = 4
PER_FILE = 0.1  # seconds: 40 files a second
DEADLINE = 8  # seconds of reply deadline: 320 files of the service's work fit in it


def burst(conn: Conn, n: int, consolidation: uuid.UUID) -> list[uuid.UUID]:
    """n files of one consolidation in one call of arm.upload_files (one statement)."""
    return upload_consolidations(conn, n, [consolidation])


def statuses(conn: Conn, jobs: list[uuid.UUID] | None = None) -> Counter[str]:
    where, params = ("WHERE id = ANY(%s)", (jobs,)) if jobs is not None else ("", ())
    rows = conn.execute(
        f"SELECT status::text AS status, count(*) AS n FROM arm.recognition_job {where} GROUP BY 1",
        params,
    ).fetchall()
    return Counter({r["status"]: r["n"] for r in rows})


def env(pacing: str) -> dict[str, Any]:
    return {
        "PACING": pacing,
        "TABULAR_REPLY_TIMEOUT_SECONDS": DEADLINE,
        "TIMEOUT_SWEEP_SECONDS": 1,
        "ACK_TIMEOUT_SECONDS": 5,
    }


def capacity() -> dict[str, Any]:
    return {"REFERENCE_WORKERS": WORKERS, "REFERENCE_DELAY_SECONDS": PER_FILE}


@pytest.mark.parametrize("pacing", ["auto", "off"])
async def test_a_burst_beyond_the_deadline_ends_done_only_when_paced(
    stack: Stack, pacing: str
) -> None:
    n = int(1.5 * WORKERS / PER_FILE * DEADLINE)  # 480: half again what fits
    await listening(stack.reference(**capacity()))
    await asyncio.to_thread(stack.bridge, **env(pacing))
    with dict_conn(stack.db_url) as conn:
        jobs = burst(conn, n, uuid.uuid4())
        await wait_for(
            lambda: sum(v for k, v in statuses(conn).items() if k not in LIVE) == n,
            4 * n * PER_FILE / WORKERS + 60,
            lambda: f"every job final: {statuses(conn)}",
        )
        final = statuses(conn, jobs)
    if pacing == "auto":
        assert final == {"done": n}
    else:  # every request went out at once; the service's queue held them past it
        assert final["timeout"] > 0, final


LIVE = ("queued", "published", "processing")


async def test_a_few_files_of_another_consolidation_are_not_behind_a_burst(
    stack: Stack,
) -> None:
    await listening(stack.reference(**capacity()))
    await asyncio.to_thread(stack.bridge, **env("auto"))
    with dict_conn(stack.db_url) as conn:
        big = burst(conn, 400, uuid.uuid4())
        await wait_for(lambda: statuses(conn, big)["done"] >= 40, 60, "the burst flowing")
        few = burst(conn, 3, uuid.uuid4())
        await wait_for(
            lambda: statuses(conn, few)["done"] == 3,
            60,
            lambda: f"the few done: {statuses(conn, few)}",
        )
        # The burst still had most of its files to go: the few were not behind it.
        left = statuses(conn, big)
        assert left["queued"] + left["published"] + left["processing"] > 200, left
        await wait_for(lambda: statuses(conn, big)["done"] == 400, 120, "the burst done")


async def test_a_service_away_holds_the_uploads_queued_and_they_flow_when_it_is_back(
    stack: Stack,
) -> None:
    """ACK_TIMEOUT_SECONDS 1 and OUTBOX_MAX_REPUBLISH 1: a republish budget of 2 s. The
    service is away four budgets while 60 files are uploaded: nothing of them is
    dead-lettered (nobody listens: the probes stay queued), and all are done after."""
    await asyncio.to_thread(
        stack.bridge, PACING="auto", ACK_TIMEOUT_SECONDS=1, OUTBOX_MAX_REPUBLISH=1
    )
    with dict_conn(stack.db_url) as conn:
        # The pipeline learnt the service was gone: a first job went out to nobody.
        jobs = burst(conn, 60, uuid.uuid4())
        await wait_for(
            lambda: scalar(
                conn, "SELECT NOT answering FROM arm.pipeline_pace WHERE pipeline = 'tabular'"
            ),
            30,
            "the pipeline not answering",
        )
        await asyncio.sleep(8)  # four republish budgets away
        assert statuses(conn, jobs)["dlq"] <= 1  # the floor: what was in flight at most
        await listening(stack.reference())
        await wait_for(
            lambda: statuses(conn, jobs)["done"] + statuses(conn, jobs)["dlq"] == 60,
            60,
            lambda: f"every job final: {statuses(conn, jobs)}",
        )
        assert statuses(conn, jobs)["dlq"] <= 1


async def test_two_bridges_share_one_limit_and_never_exceed_it(stack: Stack) -> None:
    """Two bridge processes, PACING=fixed at 6 in flight, against a service of 4 workers:
    sampled from the database all through a burst, the pipeline's in flight never passes
    the limit, though both bridges publish and the limit is reached."""
    limit, n = 6, 200
    paced = {**env("fixed"), "TABULAR_MAX_IN_FLIGHT": limit, "OUTBOX_BATCH_SIZE": 50}
    await listening(stack.reference(REFERENCE_WORKERS=WORKERS, REFERENCE_DELAY_SECONDS=0.05))
    bridges = [await asyncio.to_thread(stack.bridge, **paced) for _ in range(2)]
    in_flight = (
        "SELECT count(*) FROM arm.recognition_job "
        "WHERE pipeline = 'tabular' AND status IN ('published', 'processing')"
    )
    samples: list[int] = []
    with dict_conn(stack.db_url) as conn, dict_conn(stack.db_url) as watch:
        jobs = burst(conn, n, uuid.uuid4())

        def sampled_until_done() -> bool:
            samples.append(scalar(watch, in_flight))
            return statuses(conn, jobs)["done"] == n

        await wait_for(
            sampled_until_done, 120, lambda: f"every job done: {statuses(conn, jobs)}", every=0.02
        )
    assert max(samples) <= limit, sorted(samples)[-10:]
    assert max(samples) == limit, samples  # the limit was used, not avoided
    shares = [published(b.log()) for b in bridges]
    assert sum(shares) == n and min(shares) > 0, shares


def published(log: str) -> int:
    """Jobs a bridge's log says it published (its `published N jobs` lines)."""
    lines = [line for line in log_lines(log, action="publish") if "published " in line]
    return sum(int(line.split(" count=")[1].split()[0]) for line in lines)
