"""The processes of an end-to-end test, a benchmark or the nemesis: `arm-core serve` /
`bridge` / `reference` as subprocesses with one environment, against a real PostgreSQL
and a real nats-server (or a cluster of them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats, EmbeddedNatsCluster
from tests.support.bridge import wait_for
from tests.support.processes import ARM_CORE, ArmProcess, log_lines


@dataclass
class Stack:
    """`defaults` are the caller's own environment over the tests' one below (a value of
    None leaves the variable unset: the program's default); `start`'s keywords go over
    both. With `cluster`, NATS_URL lists its nodes; `nats` stays the one server."""

    db_url: str
    nats: EmbeddedNats
    tmp: Path
    results: Path
    defaults: dict[str, Any] = field(default_factory=dict)
    cluster: EmbeddedNatsCluster | None = None
    healthy_within: float = 20.0  # seconds for serve and bridge to report healthy
    procs: list[ArmProcess] = field(default_factory=list)
    started: int = 0  # processes started so far: their logs' numbers

    def nats_urls(self) -> list[str]:
        return self.cluster.urls() if self.cluster is not None else [self.nats.url()]

    def env(self, **extra: Any) -> dict[str, str]:
        base: dict[str, Any] = {
            "DATABASE_URL": self.db_url,
            "NATS_URL": ",".join(self.nats_urls()),
            "NATS_ENABLED": "true",
            "OUTBOX_POLL_SECONDS": "0.2",
            "SCHEDULE_TICK_SECONDS": "0.2",
            "ACK_TIMEOUT_SECONDS": "1",
            "TIMEOUT_SWEEP_SECONDS": "1",
            "REFERENCE_DELAY_SECONDS": "0.1",
            "REFERENCE_RESULTS_DIR": str(self.results),
            **self.defaults,
            **extra,
        }
        return {k: str(v) for k, v in base.items() if v is not None}

    def start(self, command: str, **env: Any) -> ArmProcess:
        """`arm-core command`, its log `<command>-<n>.log` in `tmp`."""
        return self.start_as((ARM_CORE,), command, **env)

    def start_as(self, program: Sequence[str], command: str, /, **env: Any) -> ArmProcess:
        """`program command`: another release's `arm-core` (its environment in `env`)."""
        name = f"{command}-{self.started}"
        self.started += 1
        proc = ArmProcess(command, self.env(**env), self.tmp / f"{name}.log", program)
        self.procs.append(proc)
        return proc

    def serve(self, **env: Any) -> tuple[ArmProcess, str]:
        return self.serve_as((ARM_CORE,), **env)

    def serve_as(self, program: Sequence[str], /, **env: Any) -> tuple[ArmProcess, str]:
        port = free_port()
        proc = self.start_as(program, "serve", HTTP_PORT=port, **env)
        proc.wait_healthy(port, self.healthy_within)
        return proc, f"http://127.0.0.1:{port}"

    def bridge(self, **env: Any) -> ArmProcess:
        return self.bridge_as((ARM_CORE,), **env)

    def bridge_as(self, program: Sequence[str], /, **env: Any) -> ArmProcess:
        port = free_port()
        proc = self.start_as(program, "bridge", BRIDGE_HEALTH_PORT=port, **env)
        proc.wait_healthy(port, self.healthy_within)
        return proc

    def reference(self, **env: Any) -> ArmProcess:
        """Started, not yet listening: see :func:`listening`."""
        return self.start("reference", **env)

    def stop_all(self, within: float | None = 30) -> None:
        """Every process still running: SIGTERM and `within` seconds to exit, else (or at
        once with `within=None`) kill -9. The stack then forgets them all."""
        for proc in self.procs:
            if proc.proc.poll() is not None:
                continue
            if within is None:
                proc.kill()
                continue
            try:
                proc.stop(within=within)
            except AssertionError:
                proc.kill()
        self.procs = []


def running_stack(db_url: str, tmp: Path, nats_args: list[str] | None = None) -> Iterator[Stack]:
    """A Stack on `db_url` with a nats-server of its own (`nats_args`: e.g. JetStream);
    every process still running at the end is killed, then the server stopped."""
    nats = EmbeddedNats(log_dir=tmp / "nats", extra_args=nats_args or []).start()
    stack = Stack(db_url=db_url, nats=nats, tmp=tmp, results=tmp / "results")
    try:
        yield stack
    finally:
        stack.stop_all(within=None)
        nats.stop()


async def listening(reference: ArmProcess, within: float = 30) -> ArmProcess:
    """Returns once `arm-core reference` listens: each of its two services logs
    ref_start after the server has confirmed its subscription. A request published
    before that finds nobody, and its ack timeout and reply deadline run regardless."""
    await wait_for(
        lambda: len(log_lines(reference.log(), action="ref_start")) >= 2,
        within,
        lambda: f"the reference service listening: {reference.log()[-2000:]}",
    )
    return reference
