"""What the embedded servers share: :func:`free_port` (a TCP port free on 127.0.0.1
right now) and :func:`log_tail` (the end of a server's log, for an error message).

The servers themselves: :mod:`arm_core.devtools.embedded_postgres` (a PostgreSQL cluster,
:class:`EmbeddedPostgres`, and :func:`find_pg_bindir`) and
:mod:`arm_core.devtools.embedded_nats` (a nats-server, :class:`EmbeddedNats`, and a
cluster of them, :class:`EmbeddedNatsCluster`). They are used by the test suite (session
fixtures), the benchmarks and ``arm-core dev``. Nothing there relies on a server already
running on the machine, and no fixed port is ever used.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["Server", "free_port", "log_tail"]


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 40, offset: int = 0) -> str:
    """The last `lines` lines of the log at `path` from byte `offset` on, for a message."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return f"(no log at {path})"
    text = data.decode("utf-8", "replace").splitlines()[-lines:]
    return "\n".join(text) if text else f"(log {path} is empty)"


class Server:
    """`with server:` starts it and stops it at the end, then lets it remove what it made
    for itself (:meth:`release`)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """After the last stop: remove the folders the server created for itself."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self.release()
