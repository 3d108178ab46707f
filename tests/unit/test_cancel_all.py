"""Ending tasks whose first cancellation may be lost (asyncio.wait_for on Python 3.11
drops one that arrives as its inner call completes; nats-py's connect timeout is one)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from arm_core.bridge.service import cancel_all


async def swallows_cancellations(times: float, ended: list[str]) -> None:
    """Retries forever, as nats-py's connect does, and loses the first `times`
    cancellations, as a wait_for racing its inner call does (`ended[0] == "give up"`
    makes it lose no more)."""
    lost = 0
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if lost >= times or ended[:1] == ["give up"]:
                ended.append("cancelled")
                raise
            lost += 1


async def test_a_task_that_loses_a_cancellation_still_ends() -> None:
    ended: list[str] = []
    task = asyncio.create_task(swallows_cancellations(2, ended))
    await asyncio.sleep(0)  # it runs up to its first await
    assert await cancel_all([task], within=5) == 0
    assert task.cancelled() and ended == ["cancelled"]


async def test_done_and_failed_tasks_are_left_as_they_are() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fails())
    await asyncio.wait([done, failed])
    assert await cancel_all([done, failed]) == 0
    assert not done.cancelled() and isinstance(failed.exception(), ValueError)


async def test_a_task_that_never_ends_is_named_after_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ended: list[str] = []
    task = asyncio.create_task(swallows_cancellations(float("inf"), ended), name="nats-connect")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="arm_core.bridge.service"):
        assert await cancel_all([task], within=0.3) == 1
    assert "nats-connect" in caplog.text and not task.done()
    ended.append("give up")
    assert await cancel_all([task], within=5) == 0
