"""RESULTS_STREAM turned on in a running deployment, as docs/high-availability.md says:
two bridges on core NATS under a steady flow of uploads, a service answering with core
NATS; then the bridges are rolled one at a time to RESULTS_STREAM (the first new one
creates the stream), old and new sharing the queue group meanwhile. Every job ends
`done` and each result is applied once: no answer depends on which kind of bridge got
it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, log_lines, running_stack
from arm_core.devtools.testbed.services import instant_service
from arm_core.devtools.testbed.sql import dict_conn, scalar
from tests.support.flow import DONE, Flow, applied_results

pytestmark = pytest.mark.e2e

# A long reply deadline: a lost answer shows as a job left `processing`, never as a quiet
# `timeout`. DEBUG: a line per envelope applied, counted per job.
ENV = {
    "DEBUG": "true",
    "TABULAR_REPLY_TIMEOUT_SECONDS": 600,
    "ACK_TIMEOUT_SECONDS": 30,
}
STREAM = {"RESULTS_STREAM": "ARM_RESULTS"}


@pytest.fixture
def js_stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(db_url, tmp_path, ["-js", "-sd", str(tmp_path / "js")])


async def test_rolling_the_bridges_to_results_stream_under_a_flow_loses_nothing(
    js_stack: Stack,
) -> None:
    stack = js_stack
    service = await instant_service(stack.nats.url())
    try:
        old = [await asyncio.to_thread(stack.bridge, **ENV) for _ in range(2)]
        new = []
        with Flow(stack.db_url) as flow, dict_conn(stack.db_url) as conn:

            async def more_done(n: int, what: str) -> None:
                target = scalar(conn, DONE) + n
                await wait_for(lambda: scalar(conn, DONE) >= target, 60, what)

            await more_done(100, "the flow through the core bridges")
            # One at a time: a new bridge with the stream, then an old one stopped. While
            # both kinds run they share the queue group.
            for bridge in old:
                new.append(await asyncio.to_thread(stack.bridge, **ENV, **STREAM))
                await more_done(100, "the flow through old and new bridges together")
                assert await asyncio.to_thread(bridge.stop) == 0
            await more_done(100, "the flow through the stream's bridges")
            n = flow.stop()
        with dict_conn(stack.db_url) as conn:
            await wait_for(lambda: scalar(conn, DONE) == n, 120, lambda: f"{n} jobs done")
            assert scalar(conn, "SELECT count(*) FROM arm.recognition_job") == n
    finally:
        await service.client.close()
    logs = [p.log() for p in stack.procs]
    applied = applied_results(logs)
    assert len(applied) == n and set(applied.values()) == {1}  # each once, none twice
    # The first new bridge made the stream; both new ones read it.
    assert log_lines(new[0].log(), action="stream_created")
    assert all("consuming files.tabular_parsed from stream ARM_RESULTS" in b.log() for b in new)
    # Old bridges applied answers by core NATS while the stream existed: the mix was real.
    assert all(applied_results([b.log()]) for b in old)
