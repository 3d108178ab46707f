"""The one shape of the bridge's services (the publisher, the inbox, the listener, the
schedule runner, the results stream's consumer and its replay), after River's, and the
supervisor that watches them, after Procrastinate's side-task monitor.

A service's loops (one, `run`, unless it has several) run under the process's
:class:`Supervisor` until their `stopping` event is set. The supervisor is why no loop
dies in silence: an exception a loop does not handle is logged at once with its
traceback, counted and the loop restarted after a backoff; past SERVICE_RESTART_LIMIT
the process stops and exits 1. A loop that gave no heartbeat (:meth:`Service.beat`) for
LIVENESS_STALL_SECONDS is stalled, and `GET /livez` fails (docs/runbooks.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from arm_core.bridge.config import BridgeConfig
from arm_core.instruments import Metrics

log = logging.getLogger(__name__)

Loop = Callable[[asyncio.Event], Awaitable[None]]


async def cancel_all(tasks: Iterable[asyncio.Task[None]], within: float = 5.0) -> int:
    """Cancels `tasks` and waits until each has ended, cancelling again every 0.1 s:
    one cancellation can be lost. On Python 3.11
    asyncio.wait_for drops a cancellation that arrives as the awaited call completes —
    nats-py's connect timeout is such a wait_for, and a bridge retrying an absent
    server then went on connecting after SIGTERM, never stopping. Returns how many
    were still running after `within` seconds (logged, and left to the event loop)."""
    tasks = list(tasks)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(0.1, left))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the supervisor has logged what it means
    if pending:
        log.warning(
            "still running %.0f s after being cancelled: %s",
            within,
            ", ".join(sorted(task.get_name() for task in pending)),
            extra={"action": "cancel_late"},
        )
    return len(pending)


async def stopped_within(stopping: asyncio.Event, seconds: float) -> bool:
    """Waits up to `seconds` for `stopping`; whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
    return stopping.is_set()


class LoopState(StrEnum):
    """A supervised loop, as GET /livez reports it."""

    RUNNING = "running"
    RESTARTING = "restarting"  # crashed; starts again after its backoff
    STALLED = "stalled"  # running, but no heartbeat for stall_seconds
    FAILED = "failed"  # crashed past the limit: the process stops
    STOPPED = "stopped"  # asked to stop, and did


@dataclass(frozen=True, slots=True)
class Fatal:
    """Why the process cannot go on, and its exit code: 2 for a configuration the
    servers cannot work with, 1 for a loop that kept crashing."""

    reason: str
    exit_code: int = 1


@dataclass(eq=False)
class _Watched:
    name: str
    state: LoopState = LoopState.RUNNING
    beat_at: float = 0.0
    crashes: deque[float] = field(default_factory=deque)
    last_error: str = ""
    once: bool = False


class Supervisor:
    """Runs the process's loops, restarts the ones that crash, and tells `on_fatal`
    once when the process cannot go on."""

    def __init__(
        self,
        config: BridgeConfig,
        on_fatal: Callable[[Fatal], None] = lambda fatal: None,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()  # the process's: arm_service_restarts_total
        self.on_fatal = on_fatal
        self.fatal: Fatal | None = None
        self._clock = clock
        self._loops: dict[str, _Watched] = {}

    def supervise(
        self, name: str, loop: Loop, stopping: asyncio.Event, once: bool = False
    ) -> asyncio.Task[None]:
        """Runs `loop(stopping)` as a task named `name`, started again when it crashes.
        `once`: a task that is done when it returns (connecting, say), not a loop that
        returns only once `stopping` is set."""
        watched = _Watched(name, beat_at=self._clock(), once=once)
        self._loops[name] = watched
        self.metrics.service_restarts.labels(service=name)  # the series exists from the start
        return asyncio.create_task(self._run(watched, loop, stopping), name=name)

    def beat(self, name: str) -> None:
        watched = self._loops.get(name)
        if watched is not None:
            watched.beat_at = self._clock()

    def running(self, name: str) -> bool:
        """Whether the loop `name` is running or about to run again (not failed, not
        stopped, not a loop this supervisor never started)."""
        watched = self._loops.get(name)
        return watched is not None and watched.state in (LoopState.RUNNING, LoopState.RESTARTING)

    def states(self) -> dict[str, LoopState]:
        """Every loop's state now (a running loop silent for stall_seconds is STALLED)."""
        now, stall = self._clock(), self.config.settings.liveness_stall_seconds
        return {
            name: LoopState.STALLED
            if w.state is LoopState.RUNNING and not w.once and now - w.beat_at > stall
            else w.state
            for name, w in self._loops.items()
        }

    def live(self) -> tuple[bool, dict[str, str]]:
        """GET /livez: whether every loop runs (restarting counts: it will), and each
        loop's state, with the last error of one that crashed."""
        said: dict[str, str] = {}
        ok = True
        for name, state in self.states().items():
            ok = ok and state not in (LoopState.FAILED, LoopState.STALLED)
            error = self._loops[name].last_error
            said[name] = f"{state}: {error}" if error and state is not LoopState.RUNNING else state
        return ok, said

    async def _run(self, watched: _Watched, loop: Loop, stopping: asyncio.Event) -> None:
        c, s, name = self.config, self.config.settings, watched.name
        window = s.service_restart_window_seconds
        while True:
            try:
                await loop(stopping)
                if stopping.is_set() or watched.once:
                    watched.state = LoopState.STOPPED
                    return
                raise RuntimeError(f"{name} returned without being asked to stop")
            except asyncio.CancelledError:
                watched.state = LoopState.STOPPED
                raise
            except Exception as exc:
                now = self._clock()
                crashes = watched.crashes
                crashes.append(now)
                while crashes and now - crashes[0] > window:
                    crashes.popleft()
                watched.last_error = f"{type(exc).__name__}: {exc}"[:500]
                if len(crashes) > s.service_restart_limit:
                    watched.state = LoopState.FAILED
                    why = f"{name} crashed {len(crashes)} times within {window:g} s"
                    log.error(
                        "%s; stopping the process (SERVICE_RESTART_LIMIT=%d): %s",
                        why,
                        s.service_restart_limit,
                        watched.last_error,
                        exc_info=exc,
                        extra={"action": "service_failed", "service": name, "count": len(crashes)},
                    )
                    self.fail(Fatal(f"{why} (last: {watched.last_error})"))
                    return
                backoff = min(
                    c.restart_backoff_seconds * 2 ** (len(crashes) - 1),
                    c.restart_backoff_max_seconds,
                )
                watched.state = LoopState.RESTARTING
                self.metrics.service_restarts.labels(service=name).inc()
                log.error(
                    "%s crashed; restarting in %.1f s (%d of %d allowed within %g s): %s",
                    name,
                    backoff,
                    len(crashes),
                    s.service_restart_limit,
                    window,
                    watched.last_error,
                    exc_info=exc,
                    extra={"action": "service_crashed", "service": name, "count": len(crashes)},
                )
            if await stopped_within(stopping, backoff):
                watched.state = LoopState.STOPPED
                return
            watched.state, watched.beat_at = LoopState.RUNNING, self._clock()
            log.warning(
                "%s restarted", name, extra={"action": "service_restarted", "service": name}
            )

    def fail(self, fatal: Fatal) -> None:
        """Tells on_fatal, once, why the process cannot go on."""
        if self.fatal is None:
            self.fatal = fatal
            self.on_fatal(fatal)


class Service:
    name = "service"
    # The supervisor of the running loops (none until start(): beat() does nothing), and
    # the loops' tasks.
    supervisor: Supervisor | None = None
    tasks: tuple[asyncio.Task[None], ...] = ()

    async def run(self, stopping: asyncio.Event) -> None:
        raise NotImplementedError

    def loops(self) -> dict[str, Loop]:
        """The service's loops by name; one, `run`, unless a service has several."""
        return {self.name: self.run}

    def start(self, supervisor: Supervisor) -> None:
        """Hands every loop to `supervisor`; returns at once."""
        self.supervisor = supervisor
        self._stop_asked = asyncio.Event()
        self.tasks = tuple(
            self.supervisor.supervise(name, loop, self._stop_asked)
            for name, loop in self.loops().items()
        )

    def beat(self, loop: str | None = None) -> None:
        if self.supervisor is not None:
            self.supervisor.beat(loop or self.name)

    def ended(self) -> bool:
        """Started, and every loop has ended (asked to, or failed past the limit)."""
        return bool(self.tasks) and all(t.done() for t in self.tasks)

    async def stop(self, grace: float) -> None:
        """Asks the loops to finish (what they have in hand first) and waits up to
        `grace` seconds; past it they are cancelled."""
        if not self.tasks:
            return
        self._stop_asked.set()
        await asyncio.wait(self.tasks, timeout=grace)
        await cancel_all(self.tasks)
