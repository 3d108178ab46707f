"""The supervisor of the bridge's loops (bridge/service.py): a loop that raises is logged
at once with its traceback, counted and started again after a backoff; past the limit
the process is told it cannot go on; a loop silent for too long is stalled."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from arm_core.bridge.config import BridgeConfig
from arm_core.bridge.service import Fatal, LoopState, Service, Supervisor
from arm_core.config import Settings
from arm_core.config_error import ConfigError
from arm_core.devtools.testbed.polling import wait_for
from tests.support.bridge import logged
from tests.support.fault_points import POINTS, InjectedFault, armed, fault

FAST = BridgeConfig(
    Settings(service_restart_limit=2, service_restart_window_seconds=60),
    restart_backoff_seconds=0.01,
    restart_backoff_max_seconds=0.02,
)


def restarts(supervisor: Supervisor, name: str) -> float:
    found = supervisor.metrics.registry.get_sample_value(
        "arm_service_restarts_total", {"service": name}
    )
    return found or 0.0


class Crashy(Service):
    """A loop whose step raises on each turn the test armed (tests/support/fault_points),
    and runs on otherwise."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.turns = 0

    def step(self) -> None:
        self.turns += 1

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self.beat()
            self.step()
            await asyncio.sleep(0.005)


async def test_a_crash_is_logged_at_once_counted_and_the_loop_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    name = f"crashy-{uuid.uuid4().hex[:6]}"
    told: list[Fatal] = []
    supervisor = Supervisor(FAST, told.append)
    service = Crashy(name)
    with fault(service, "step", 1):
        service.start(supervisor)
        try:
            await wait_for(lambda: service.turns > 3, 5, "turns after the restart")
            [crash] = logged(caplog.records, action="service_crashed", service=name)
            assert crash.levelno == logging.ERROR and crash.exc_info is not None
            assert isinstance(crash.exc_info[1], InjectedFault)
            assert f"{name} crashed; restarting" in crash.getMessage()
            assert logged(caplog.records, action="service_restarted", service=name)
            assert restarts(supervisor, name) == 1
            assert supervisor.live() == (True, {name: "running"})
            assert not told
        finally:
            await service.stop(1)
    assert service.ended() and supervisor.states() == {name: LoopState.STOPPED}


async def test_past_the_limit_the_process_is_told_once_and_is_not_live(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"doomed-{uuid.uuid4().hex[:6]}"
    told: list[Fatal] = []
    supervisor = Supervisor(FAST, told.append)
    service = Crashy(name)
    with fault(service, "step", -1):
        service.start(supervisor)
        await wait_for(lambda: bool(told), 5, "fatal")
        await wait_for(service.ended, 5, "the loop ended")
    [fatal] = told
    assert fatal.exit_code == 1 and fatal.reason.startswith(f"{name} crashed 3 times within 60 s")
    assert supervisor.fatal is fatal
    live, loops = supervisor.live()
    assert not live and loops[name].startswith("failed: InjectedFault")
    assert not supervisor.running(name)
    assert restarts(supervisor, name) == 2  # the third crash is not followed by a restart
    assert len(logged(caplog.records, action="service_failed", service=name)) == 1
    await service.stop(1)


async def test_each_restart_waits_its_backoff_doubling_up_to_the_longest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A loop that crashes on every turn is not restarted in a hot loop: the first restart
    comes restart_backoff_seconds after the crash, each next one after twice the last, at
    most restart_backoff_max_seconds."""
    caplog.set_level(logging.INFO)
    name = f"backoff-{uuid.uuid4().hex[:6]}"
    policy = BridgeConfig(
        Settings(service_restart_limit=10, service_restart_window_seconds=60),
        restart_backoff_seconds=0.1,
        restart_backoff_max_seconds=0.25,
    )
    supervisor = Supervisor(policy, lambda fatal: None)
    service = Crashy(name)
    with fault(service, "step", 3):
        service.start(supervisor)
        try:
            await wait_for(lambda: service.turns > 0, 5, "running after three crashes")
            crashed = logged(caplog.records, action="service_crashed", service=name)
            started = logged(caplog.records, action="service_restarted", service=name)
            waits = [r.created - c.created for c, r in zip(crashed, started, strict=True)]
            assert len(waits) == 3
            for waited, backoff in zip(waits, (0.1, 0.2, 0.25), strict=True):
                assert backoff <= waited < backoff + 1.0, waits
        finally:
            await service.stop(1)


async def test_a_loop_that_returns_without_being_asked_counts_as_a_crash() -> None:
    class Quitter(Service):
        name = f"quitter-{uuid.uuid4().hex[:6]}"
        runs = 0

        async def run(self, stopping: asyncio.Event) -> None:
            self.runs += 1

    service = Quitter()
    service.start(Supervisor(FAST))
    await wait_for(service.ended, 5, "given up")
    assert service.runs == 3
    await service.stop(1)


async def test_a_one_shot_task_is_done_when_it_returns_and_retried_when_it_raises() -> None:
    calls: list[int] = []

    async def connect(stopping: asyncio.Event) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("refused")

    supervisor = Supervisor(FAST)
    task = supervisor.supervise("once", connect, asyncio.Event(), once=True)
    await asyncio.wait_for(task, 5)
    assert len(calls) == 2 and supervisor.states() == {"once": LoopState.STOPPED}
    assert supervisor.live()[0]


async def test_a_loop_silent_for_stall_seconds_is_stalled_and_not_live() -> None:
    now = [1000.0]
    policy = BridgeConfig(Settings(liveness_stall_seconds=30))
    supervisor = Supervisor(policy, clock=lambda: now[0])
    stuck = asyncio.Event()

    async def hangs(stopping: asyncio.Event) -> None:
        await stuck.wait()

    stopping = asyncio.Event()
    task = supervisor.supervise("hangs", hangs, stopping)
    now[0] += 29
    assert supervisor.live() == (True, {"hangs": "running"})
    now[0] += 2
    assert supervisor.live() == (False, {"hangs": "stalled"})
    supervisor.beat("hangs")
    assert supervisor.live()[0]
    stopping.set()
    stuck.set()
    await asyncio.wait_for(task, 5)


def test_fault_points_raise_as_often_as_armed_and_are_gone_after() -> None:
    """A test's fault point raises on as many calls as armed (-1: every one), calls the
    step otherwise, and leaves nothing behind; production code has no hook at all."""
    service = Crashy("armed")
    with fault(service, "step", 2):
        for _ in range(2):
            with pytest.raises(InjectedFault, match="fault injected at step"):
                service.step()
        service.step()  # spent: the step itself runs
        assert service.turns == 1
    with fault(Crashy, "step", -1):
        for _ in range(5):
            with pytest.raises(InjectedFault):
                service.step()
    service.step()
    assert service.turns == 2 and "step" not in vars(service)
    # Each point names a step the bridge has (a renamed one fails here, not silently).
    steps = {point: getattr(target, name) for point, (target, name) in POINTS.items()}
    assert all(callable(step) for step in steps.values())
    with armed(("inbox", 1), ("connect", -1)):
        now = {point: getattr(target, name) for point, (target, name) in POINTS.items()}
        assert {p for p in POINTS if now[p] is not steps[p]} == {"inbox", "connect"}
    assert {point: getattr(target, name) for point, (target, name) in POINTS.items()} == steps


def test_the_restart_settings_are_read_and_checked() -> None:
    for env, variable in (
        ({"SERVICE_RESTART_LIMIT": "-1"}, "SERVICE_RESTART_LIMIT"),
        ({"SERVICE_RESTART_WINDOW_SECONDS": "0"}, "SERVICE_RESTART_WINDOW_SECONDS"),
        ({"LIVENESS_STALL_SECONDS": "0"}, "LIVENESS_STALL_SECONDS"),
        ({"LIVENESS_STALL_SECONDS": "10"}, "LIVENESS_STALL_SECONDS"),  # 2 × the pool's 5 s
    ):
        with pytest.raises(ConfigError, match=f"^{variable}: "):
            Settings.from_env(env)
