"""The processes of an end-to-end test: `arm-core serve` / `bridge` / `reference` as
subprocesses with one environment, against a real PostgreSQL and a real nats-server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from tests.support.bridge import wait_for
from tests.support.processes import ArmProcess, log_lines


@dataclass
class Stack:
    db_url: str
    nats: EmbeddedNats
    tmp: Path
    results: Path
    procs: list[ArmProcess] = field(default_factory=list)

    def env(self, **extra: Any) -> dict[str, str]:
        base = {
            "DATABASE_URL": self.db_url,
            "NATS_URL": self.nats.url(),
            "NATS_ENABLED": "true",
            "OUTBOX_POLL_SECONDS": "0.2",
            "SCHEDULE_TICK_SECONDS": "0.2",
            "ACK_TIMEOUT_SECONDS": "1",
            "TIMEOUT_SWEEP_SECONDS": "1",
            "REFERENCE_DELAY_SECONDS": "0.1",
            "REFERENCE_RESULTS_DIR": str(self.results),
        }
        base.update({k: str(v) for k, v in extra.items()})
        return base

    def start(self, command: str, **env: Any) -> ArmProcess:
        name = f"{command}-{len(self.procs)}"
        proc = ArmProcess(command, self.env(**env), self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    def serve(self, **env: Any) -> tuple[ArmProcess, str]:
        port = free_port()
        proc = self.start("serve", HTTP_PORT=port, **env)
        proc.wait_healthy(port)
        return proc, f"http://127.0.0.1:{port}"

    def bridge(self, **env: Any) -> ArmProcess:
        port = free_port()
        proc = self.start("bridge", BRIDGE_HEALTH_PORT=port, **env)
        proc.wait_healthy(port)
        return proc

    def reference(self, **env: Any) -> ArmProcess:
        return self.start("reference", **env)


def running_stack(db_url: str, tmp: Path, nats_args: list[str] | None = None) -> Iterator[Stack]:
    """A Stack on `db_url` with a nats-server of its own (`nats_args`: e.g. JetStream);
    every process still running at the end is killed, then the server stopped."""
    nats = EmbeddedNats(log_dir=tmp / "nats", extra_args=nats_args or []).start()
    stack = Stack(db_url=db_url, nats=nats, tmp=tmp, results=tmp / "results")
    try:
        yield stack
    finally:
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()
        nats.stop()


async def listening(reference: ArmProcess) -> ArmProcess:
    """Returns once `arm-core reference` listens: each of its two services logs
    ref_start after the server has confirmed its subscription. A request published
    before that finds nobody, and its ack timeout and reply deadline run regardless."""
    await wait_for(
        lambda: len(log_lines(reference.log(), action="ref_start")) >= 2,
        30,
        lambda: f"the reference service listening: {reference.log()[-2000:]}",
    )
    return reference
