"""Fault points: a real exception at a real step of one of the bridge's loops, for tests.

The bridge's code has no hook for them. A test arms a point (:func:`armed`) by wrapping
the step's function where the loop looks it up — a method on its class, or a name in
its module — for as long as the test says, as pytest's monkeypatch would: the wrapper
raises :class:`InjectedFault` on the next `times` calls (-1: on every call) and
otherwise calls the step as it is. Leaving `armed` puts the step back.

A test of a whole process (`arm-core bridge` as users run it) arms them in the child:
:func:`program` is the program that arms the points it is given, then runs the
`arm-core` command line, as :class:`tests.support.processes.ArmProcess`'s `program`.
It is run as a file (`python -P`), so it needs nothing but arm-core installed."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from arm_core.bridge import runner
from arm_core.bridge.inbox import Inbox
from arm_core.bridge.listener import Listener
from arm_core.bridge.publisher import Publisher
from arm_core.bridge.replay import Replayer
from arm_core.bridge.scheduler import Scheduler
from arm_core.bridge.stream_fetch import StreamConsumer


class InjectedFault(RuntimeError):
    """Raised at an armed fault point, with the time it was (time.time())."""

    def __init__(self, point: str) -> None:
        super().__init__(f"fault injected at {point}")
        self.raised_at = time.time()


# Each point: where its loop looks the step up, and the step's name there.
POINTS: dict[str, tuple[Any, str]] = {
    "publisher": (Publisher, "run_once"),  # a publishing cycle
    "inbox": (Inbox, "apply"),  # a batch, taken into the worker's hands
    "listen": (Listener, "conninfo"),  # (re)connecting the LISTEN connection
    "schedule": (Scheduler, "run_once"),  # a tick
    "waits": (Scheduler, "record_waits"),  # the tick's recording of the waits
    "stream": (StreamConsumer, "run_once"),  # a fetch from the results stream
    "replay": (Replayer, "run_once"),  # a replay after the stream elected a leader
    "connect": (runner, "connect"),  # the bridge's connection to NATS
}


@contextlib.contextmanager
def fault(target: Any, name: str, times: int = 1, point: str = "") -> Iterator[None]:
    """While inside: `target`'s `name` raises InjectedFault(`point`, or `name`) on its
    next `times` calls (-1: every call), and does what it did otherwise."""
    own = vars(target)
    had, before = name in own, own.get(name)
    step: Callable[..., Any] = getattr(target, name)
    left = [times]

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if left[0]:
            if left[0] > 0:
                left[0] -= 1
            raise InjectedFault(point or name)
        return step(*args, **kwargs)

    setattr(target, name, faulty)
    try:
        yield
    finally:
        if had:
            setattr(target, name, before)
        else:
            delattr(target, name)


@contextlib.contextmanager
def armed(*points: tuple[str, int]) -> Iterator[None]:
    """While inside, each (point, times) of POINTS raises on its next `times` calls (-1:
    every call)."""
    with contextlib.ExitStack() as stack:
        for point, times in points:
            target, name = POINTS[point]
            stack.enter_context(fault(target, name, times, point))
        yield


def parse(raw: str) -> tuple[str, int]:
    """`point=times` (`point` alone: once)."""
    point, _, times = raw.partition("=")
    if point not in POINTS:
        raise SystemExit(f"unknown fault point {point!r} ({', '.join(POINTS)})")
    return point, int(times or 1)


def program(*points: str) -> tuple[str, ...]:
    """The program that runs an `arm-core` command with `points` (`point=times`) armed."""
    return (sys.executable, "-P", str(Path(__file__).resolve()), *points)


def main(argv: list[str]) -> int:
    """`point=times …` then the arm-core command line."""
    from arm_core.cli import main as arm_core

    points = [parse(a) for a in argv if "=" in a]
    with armed(*points):
        return arm_core([a for a in argv if "=" not in a])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
