"""The one way the suite and the benchmarks wait for something: poll a condition until
it holds, fail with a message naming what did not happen when a deadline passes. Never
a bare sleep-and-hope.

`wait_for` for async code (the condition may be a coroutine function), `wait_for_sync`
for code that runs without a loop; both return the seconds the wait took and raise
:class:`NotWithin` (an AssertionError, so a test fails with the message) at the
deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

# What to say when the deadline passes: a text, or a function that gives one then (the
# state worth showing: a log's tail, the servers' answers).
What = str | Callable[[], str]


class NotWithin(AssertionError):
    """The condition did not hold within the deadline."""


def _failure(within: float, what: What, condition: object) -> NotWithin:
    said = what() if callable(what) else what
    return NotWithin(f"not within {within:g} s: {said or condition}")


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]],
    within: float = 10.0,
    what: What = "",
    every: float = 0.05,
) -> float:
    """Polls `condition` every `every` seconds until it holds; the seconds it took."""
    began = time.monotonic()
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return time.monotonic() - began
        if time.monotonic() - began > within:
            raise _failure(within, what, condition)
        await asyncio.sleep(every)


def wait_for_sync(
    condition: Callable[[], bool],
    within: float = 10.0,
    what: What = "",
    every: float = 0.05,
) -> float:
    """The same without an event loop (blocking between polls)."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > within:
            raise _failure(within, what, condition)
        time.sleep(every)
    return time.monotonic() - began
