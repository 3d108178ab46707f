"""A real PgBouncer (the system's `pgbouncer` binary, Debian's package) in front of the
suite's PostgreSQL, on a free loopback port, run with docs/pgbouncer.ini — the file
docs/dbas.md quotes — with only the lines that name this machine replaced (MACHINE_KEYS
and [databases]), so what is tested is what the page says.

PgBouncer refuses to run as root: as root it runs as the `postgres` OS user (as the
embedded PostgreSQL does), its files in a folder of that user's under /tmp.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import quote

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_postgres_host import PG_OS_USER, postgres_ids
from arm_core.devtools.generated import CHECKOUT
from arm_core.devtools.testbed.polling import wait_for_sync

DOCUMENTED_INI = CHECKOUT / "docs" / "pgbouncer.ini"

# The [pgbouncer] keys of docs/pgbouncer.ini that say where this one PgBouncer listens
# and keeps its files: replaced here; every other key is run as written.
MACHINE_KEYS = ("listen_addr", "listen_port", "unix_socket_dir", "auth_file", "logfile", "pidfile")


PGBOUNCER_MISSING = "needs PgBouncer: apt-get install pgbouncer"


def pgbouncer_binary() -> str | None:
    """The `pgbouncer` binary (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")


def pgbouncer_missing() -> str | None:
    """Why PgBouncer cannot run here, or None: what a test skips with."""
    return PGBOUNCER_MISSING if pgbouncer_binary() is None else None


def documented_settings() -> dict[str, str]:
    """docs/pgbouncer.ini's [pgbouncer] section, every key as written."""
    parser = _parser()
    parser.read_string(DOCUMENTED_INI.read_text(encoding="utf-8"))
    return dict(parser["pgbouncer"])


def _parser() -> configparser.ConfigParser:
    # PgBouncer's own ini syntax: `key = value`, comments after ; or #, keys kept as
    # written (a database's name is case-sensitive).
    parser = configparser.ConfigParser(
        delimiters=("=",), comment_prefixes=(";", "#"), interpolation=None
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    return parser


@dataclass
class PgBouncer:
    """PgBouncer on 127.0.0.1:`port` in front of PostgreSQL on 127.0.0.1:`server_port`
    (every database of it, by the same name), letting in `users` (login → password) by
    the documented auth_type; `overrides` change documented keys (e.g. a smaller
    default_pool_size), and say so in the test that gives them."""

    server_port: int
    users: Mapping[str, str]
    overrides: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    folder: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError(PGBOUNCER_MISSING)
        as_root = os.geteuid() == 0
        self.folder = Path(tempfile.mkdtemp(prefix="arm-core-pgbouncer-", dir="/tmp"))
        self.port = free_port()
        settings = documented_settings()
        unknown = set(self.overrides) - set(settings)
        assert not unknown, f"not in docs/pgbouncer.ini: {sorted(unknown)}"
        settings.update(self.overrides)
        settings.update(
            listen_addr="127.0.0.1",
            listen_port=str(self.port),
            unix_socket_dir="",
            auth_file=str(self.folder / "userlist.txt"),
            logfile=str(self.folder / "pgbouncer.log"),
            pidfile=str(self.folder / "pgbouncer.pid"),
        )
        ini = _parser()
        ini["databases"] = {"*": f"host=127.0.0.1 port={self.server_port}"}
        ini["pgbouncer"] = settings
        with open(self.folder / "pgbouncer.ini", "w", encoding="utf-8") as out:
            ini.write(out)
        (self.folder / "userlist.txt").write_text(
            "".join(f'"{user}" "{password}"\n' for user, password in self.users.items()),
            encoding="utf-8",
        )
        command = [binary, str(self.folder / "pgbouncer.ini")]
        if as_root:
            uid, gid, _ = postgres_ids()
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, uid, gid)
            command = ["runuser", "-u", PG_OS_USER, "--", *command]
        self.proc = subprocess.Popen(
            command,
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_sync(self._listening, 15, lambda: f"pgbouncer listening: {self.log()[-2000:]}")
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited {self.proc.returncode}: {self.log()[-2000:]}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def url(self, dbname: str, user: str) -> str:
        """A client's URL through this PgBouncer, as `user` with its password."""
        password = quote(self.users[user], safe="")
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        if self.folder is None:
            return ""
        with contextlib.suppress(OSError):
            return (self.folder / "pgbouncer.log").read_text(errors="replace")
        return ""

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), then its folder removed."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running_pgbouncer(
    server_port: int, users: Mapping[str, str], **overrides: str
) -> Iterator[PgBouncer]:
    """A started PgBouncer (see :class:`PgBouncer`), stopped at the end."""
    bouncer = PgBouncer(server_port, users, overrides)
    try:
        yield bouncer.start()
    finally:
        bouncer.stop()
