"""Running `arm-core` as users run it: a real subprocess with its own environment, its
log in a file, health polled over HTTP (:class:`ArmProcess`); and the processes of an
end-to-end test, a benchmark or the nemesis together (:class:`Stack`): `arm-core serve` /
`bridge` / `reference` with one environment, against a real PostgreSQL and a real
nats-server (or a cluster of them).

`serve` and `bridge` connect as logins of their roles, as a deployment runs them
(docs/dbas.md "Database roles"): a DATABASE_URL of the suite's superuser becomes the login of
arm_bridge (`bridge`), of arm_api (`serve` with NATS_ENABLED=false) or of both (`serve`
with the bridge). `migrate` keeps the URL it is given."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats, EmbeddedNatsCluster
from arm_core.devtools.testbed.polling import NotWithin, wait_for, wait_for_sync
from arm_core.devtools.testbed.sql import (
    API_LOGIN,
    BRIDGE_LOGIN,
    SERVE_LOGIN,
    as_login,
    ensure_logins,
)

ARM_CORE = str(Path(sys.executable).with_name("arm-core"))


def runtime_env(command: str, env: dict[str, str]) -> dict[str, str]:
    """env with DATABASE_URL as the login of the roles `command` needs (unchanged for
    other commands and for a URL that is not the suite's superuser's)."""
    url = env.get("DATABASE_URL")
    if url is None or command not in ("serve", "bridge"):
        return env
    off = ("0", "false", "no", "off")
    with_bridge = env.get("NATS_ENABLED", "true").strip().lower() not in off
    login = BRIDGE_LOGIN if command == "bridge" else SERVE_LOGIN if with_bridge else API_LOGIN
    as_role = as_login(url, login)
    if as_role != url:
        # The suite made them with its template; a benchmark's own cluster may not have.
        # A server that is down is the test's business: the process will say so.
        with contextlib.suppress(psycopg.OperationalError):
            ensure_logins(url)
    return {**env, "DATABASE_URL": as_role}


class ArmProcess:
    """`program command`: this tree's `arm-core` unless `program` says another (the
    previous release's, tests/support/previous_release.py)."""

    def __init__(
        self,
        command: str,
        env: dict[str, str],
        log_path: Path,
        program: Sequence[str] = (ARM_CORE,),
    ) -> None:
        self.command = command
        self.log_path = log_path
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "OUTBOX_"))}
        full_env.update(runtime_env(command, env))
        self._log = open(log_path, "ab")  # closed in stop() or kill()
        self.proc = subprocess.Popen(
            [*program, command],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self, port: int, context: ssl.SSLContext | None = None) -> dict[str, Any] | None:
        """GET /healthcheck on 127.0.0.1:`port` — over HTTPS, trusting `context`, when
        given — or None when nothing answers."""
        scheme = "https" if context is not None else "http"
        url = f"{scheme}://127.0.0.1:{port}/healthcheck"
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                loaded: dict[str, Any] = json.loads(r.read())
                return loaded
        except OSError:
            return None

    def wait_until(self, condition: Callable[[], bool], within: float = 30, what: str = "") -> None:
        """wait_for_sync while the process runs: fails at once, with its log's tail, when
        it exits first, and at the deadline naming `what` and the log's tail."""

        def holds() -> bool:
            if self.proc.poll() is not None:
                raise NotWithin(f"arm-core {self.command} exited: {self.log()[-3000:]}")
            return condition()

        wait_for_sync(
            holds,
            within,
            lambda: f"arm-core {self.command}: {what or condition} — {self.log()[-3000:]}",
            every=0.1,
        )

    def wait_healthy(
        self, port: int, within: float = 20, context: ssl.SSLContext | None = None
    ) -> dict[str, Any]:
        answers: list[dict[str, Any] | None] = []

        def healthy() -> bool:
            answers.append(self.health(port, context))
            return answers[-1] is not None and answers[-1].get("status") == "ok"

        self.wait_until(healthy, within, "healthy")
        body = answers[-1]
        assert body is not None
        return body

    def stop(self, sig: int = signal.SIGTERM, within: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(within)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"arm-core {self.command} ignored signal {sig}") from None
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()


def serve_env(db_url: str, port: int, **env: str) -> dict[str, str]:
    """The environment of `arm-core serve` without a bridge on 127.0.0.1:`port`, plus
    `env`."""
    return {
        "DATABASE_URL": db_url,
        "NATS_ENABLED": "false",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
        **env,
    }


def json_log_records(text: str, **fields: str) -> list[dict[str, Any]]:
    """The records of a LOG_FORMAT=json log (one JSON object a line) that carry all of
    `fields`; a line that is no JSON object (a crash's traceback) fails the caller."""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in records if all(r.get(k) == v for k, v in fields.items())]


def log_lines(text: str, **fields: str) -> list[str]:
    """Lines of a key=value log that carry all of `fields`."""
    return [
        line
        for line in text.splitlines()
        if all(f" {k}={v}" in f" {line}" for k, v in fields.items())
    ]


@dataclass
class Stack:
    """`defaults` are the caller's own environment over the Stack's one below (a value of
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
