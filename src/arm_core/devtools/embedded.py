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

import functools
import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["Server", "free_port", "log_tail"]


# Where free_port() picks from when ARM_CORE_PORTS names no range: a range below the
# kernel's ephemeral ports (Linux: 32768-60999), so no connection's local port and no
# other program's bind(0) can be handed the same port between its pick and its bind.
_DEFAULT_PORTS = (20000, 32000)


@functools.cache
def _port_range() -> range:
    """The ports free_port() may hand out: ``ARM_CORE_PORTS`` (``first-last``), which the
    test suite sets to a range of each worker's own, so that parallel workers never pick
    the same port; otherwise :data:`_DEFAULT_PORTS`."""
    first, last = _DEFAULT_PORTS
    if spec := os.environ.get("ARM_CORE_PORTS", "").strip():
        low, _, high = spec.partition("-")
        first, last = int(low), int(high)
    return range(first, last + 1)


@functools.cache
def _cursor() -> Iterator[int]:
    """This process's one cursor over the range, from a random place: a port handed out
    is not handed out again until the whole range has gone round, even if the server it
    was meant for has not bound it yet."""
    return itertools.count(random.randrange(1 << 16))


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now, from :func:`_port_range`.

    The OS's own pick (bind to port 0) comes from the ephemeral range, where the same
    port may be given to another picker or to a connection's local end before the server
    it was meant for binds it; a port from a range of this process's own, checked by
    binding it, and not handed out twice in a row, cannot be."""
    ports = _port_range()
    for _ in range(len(ports)):
        port = ports[next(_cursor()) % len(ports)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {ports.start}-{ports.stop - 1}")


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
