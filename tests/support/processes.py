"""Running `arm-core` as users run it: a real subprocess with its own environment, its
log in a file, health polled over HTTP.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from tests.support.polling import NotWithin, wait_for_sync
from tests.support.sql import API_LOGIN, BRIDGE_LOGIN, SERVE_LOGIN, as_login, ensure_logins

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
