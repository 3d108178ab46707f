"""A real PostgreSQL cluster on a free loopback port: :class:`EmbeddedPostgres`, and
:func:`find_pg_bindir`, which finds the server binaries it runs (it lives, with what
else the cluster needs from the machine, in :mod:`arm_core.devtools.embedded_postgres_host`).

Used by the test suite (session fixtures), the benchmarks and ``arm-core dev``. Nothing
here relies on a server already running on the machine, and no fixed port is ever used.

Running as root
---------------
``initdb`` and ``pg_ctl`` refuse to run as root, so when ``os.geteuid() == 0`` they are run
through ``runuser -u postgres --`` and the cluster folder is owned by the ``postgres`` user.
That user must be able to traverse every directory above the cluster folder. Directories this
module creates are given ``o+x``; pre-existing directories are never loosened (``/root`` and
pytest's ``/tmp/pytest-of-root`` are mode 0700). If an ancestor is not traversable by
``postgres``, the cluster is created instead under ``tempfile.mkdtemp(prefix="arm-core-pg-")``
in ``/tmp`` (world-traversable), and its location is recorded in ``<base_dir>/arm-core-pg.location``
so that a later run with the same ``base_dir`` reuses it. :meth:`EmbeddedPostgres.destroy`
removes the cluster (and the record) when it is no longer wanted.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import errors, sql

from arm_core.devtools.embedded import Server, free_port, log_tail
from arm_core.devtools.embedded_postgres_host import (
    PG_OS_USER,
    children,
    find_pg_bindir,
    live_postmaster,
    make_dirs,
    postgres_ids,
    traversable_by,
    wait_pid_gone,
)

__all__ = ["EmbeddedPostgres", "find_pg_bindir"]

_CLUSTER_FOLDER = "arm-core-pg"
_LOCATION_FILE = "arm-core-pg.location"
# A Unix socket path must fit in sockaddr_un.sun_path (108 bytes including the NUL).
_MAX_SOCKET_DIR_LEN = 90


@dataclass
class EmbeddedPostgres(Server):
    """A throw-away (or reusable) PostgreSQL cluster listening on 127.0.0.1."""

    base_dir: Path
    port: int | None = None
    user: str = "postgres"
    # Extra server settings, passed as ``-c name=value`` at every start after the defaults
    # (so they win), e.g. ``{"shared_preload_libraries": "pg_cron"}``.
    settings: dict[str, str] = field(default_factory=dict)
    # False (tests, ``arm-core dev``): fsync, synchronous_commit and full_page_writes off,
    # fast and unsafe on a crash of the machine. True: initdb's defaults (all three on), as
    # in production; what ``make bench`` measures by default.
    durable: bool = False
    # A streaming standby of this (running) cluster: the first start() makes the data
    # directory with ``pg_basebackup -R`` from it instead of initdb; ``promote()`` makes
    # it a primary. It connects to the primary as ``application_name`` (the name
    # synchronous_standby_names and pg_stat_replication know it by).
    standby_of: EmbeddedPostgres | None = None
    application_name: str = "arm-core-standby"
    _cluster_dir: Path = field(init=False, repr=False)
    _bindir: Path = field(init=False, repr=False)
    _as_root: bool = field(init=False, repr=False)
    _socket_dir: Path | None = field(default=None, init=False, repr=False)
    _last_pid: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).absolute()
        self._bindir = find_pg_bindir()
        self._as_root = os.geteuid() == 0
        self._cluster_dir = self._prepare_cluster_dir()

    # -- layout ---------------------------------------------------------------------------

    @property
    def cluster_dir(self) -> Path:
        return self._cluster_dir

    @property
    def data_dir(self) -> Path:
        return self._cluster_dir / "data"

    @property
    def log_path(self) -> Path:
        return self._cluster_dir / "postgres.log"

    def _prepare_cluster_dir(self) -> Path:
        created = make_dirs(self.base_dir)
        if not self._as_root:
            cluster = self.base_dir / _CLUSTER_FOLDER
            cluster.mkdir(exist_ok=True)
            return cluster
        uid, gid, groups = postgres_ids()
        for directory in created:  # only loosen what we created ourselves
            directory.chmod(directory.stat().st_mode | stat.S_IXOTH)
        record = self.base_dir / _LOCATION_FILE
        if record.is_file():
            recorded = Path(record.read_text().strip())
            if recorded.is_dir():
                return recorded
        ancestors = [self.base_dir, *self.base_dir.parents]
        if all(traversable_by(p, uid, groups) for p in ancestors):
            cluster = self.base_dir / _CLUSTER_FOLDER
            cluster.mkdir(exist_ok=True)
        else:
            cluster = Path(tempfile.mkdtemp(prefix="arm-core-pg-", dir="/tmp"))
            record.write_text(f"{cluster}\n")
        os.chown(cluster, uid, gid)
        cluster.chmod(0o700)
        return cluster

    # -- running the binaries -------------------------------------------------------------

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self._bindir / tool), *args]
        if self._as_root:
            cmd = ["runuser", "-u", PG_OS_USER, "--", *cmd]
        # cwd: the postgres user may not be able to enter the caller's working directory.
        result = subprocess.run(
            cmd, cwd=self._cluster_dir, capture_output=True, text=True, check=False, timeout=120
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed (exit {result.returncode}): {' '.join(cmd)}\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def _initdb(self) -> None:
        errors_seen: list[str] = []
        for locale in ("C.UTF-8", "C"):
            if self.data_dir.exists():
                shutil.rmtree(self.data_dir)
            result = self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                "--auth=trust",
                "-E",
                "UTF8",
                f"--locale={locale}",
                check=False,
            )
            if result.returncode == 0:
                return
            errors_seen.append(f"--locale={locale}: {result.stdout}{result.stderr}")
        raise RuntimeError("initdb failed:\n" + "\n".join(errors_seen))

    def restore_base_backup_of(self, primary: EmbeddedPostgres) -> EmbeddedPostgres:
        """Makes this cluster's data directory a base backup of the running `primary`,
        taken now (pg_basebackup with its WAL, no standby settings), and returns self,
        not started: start() is then a restore — the primary as it was when the backup
        ended, taking writes."""
        self._basebackup(primary, standby=False)
        return self

    def _basebackup(self, primary: EmbeddedPostgres, standby: bool = True) -> None:
        """The data directory as a streaming standby of `primary` (pg_basebackup -R
        writes primary_conninfo and standby.signal), or with `standby` False a plain
        base backup; initdb's pg_hba.conf lets replication connections in from 127.0.0.1
        (--auth=trust)."""
        if primary.port is None:
            raise RuntimeError("the primary must be running before its standby starts")
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            primary.user,
            "-D",
            str(self.data_dir),
            *(["-R"] if standby else []),
            "-X",
            "stream",
            "--checkpoint=fast",
            "-d",
            f"application_name={self.application_name}",
        )

    def promote(self) -> None:
        """``pg_ctl promote -w``: the standby leaves recovery and takes writes (what
        Patroni or an operator does after the primary is lost)."""
        self._run("pg_ctl", "promote", "-w", "-t", "60", "-D", str(self.data_dir))

    def kill(self) -> None:
        """kill -9 of the postmaster and every process of the cluster, as when its
        machine dies: no shutdown checkpoint, clients' connections reset."""
        pid = live_postmaster(self.data_dir)
        if pid is None:
            return
        victims = [pid, *children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, 9)
        for victim in victims:
            wait_pid_gone(victim, timeout=10)
        self._last_pid = pid

    def _socket_directory(self) -> Path:
        if len(str(self._cluster_dir)) <= _MAX_SOCKET_DIR_LEN:
            return self._cluster_dir
        if self._socket_dir is None or not self._socket_dir.is_dir():
            self._socket_dir = Path(tempfile.mkdtemp(prefix="arm-core-pgsock-", dir="/tmp"))
            if self._as_root:
                uid, gid, _ = postgres_ids()
                os.chown(self._socket_dir, uid, gid)
        return self._socket_dir

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> EmbeddedPostgres:
        """Start the server (initdb first if needed); reuses an existing data directory."""
        if not (self.data_dir / "PG_VERSION").is_file():
            if self.standby_of is None:
                self._initdb()
            else:
                self._basebackup(self.standby_of)
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            live = live_postmaster(self.data_dir)
            if live is not None:
                raise RuntimeError(
                    f"a PostgreSQL server (pid {live}) is already running from {self.data_dir}; "
                    "stop it first (pg_ctl stop -D ...)"
                )
            pid_file.unlink()  # stale: left by a server that died without cleaning up
        auto_port = self.port is None
        for _attempt in range(3):
            if self.port is None:
                self.port = free_port()
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            result = self._pg_ctl_start(self.port)
            if result.returncode == 0:
                break
            log = log_tail(self.log_path, offset=offset)
            if auto_port and "already in use" in log:
                self.port = None  # lost the race for the port: pick another one
                continue
            raise RuntimeError(
                f"pg_ctl start failed (exit {result.returncode}) for {self.data_dir}:\n"
                f"{result.stdout}{result.stderr}\n--- {self.log_path} ---\n{log}"
            )
        else:
            raise RuntimeError(f"could not find a free port for PostgreSQL; see {self.log_path}")
        self._wait_ready()
        return self

    def _pg_ctl_start(self, port: int) -> subprocess.CompletedProcess[str]:
        options = " ".join(
            [
                f"-p {port}",
                f"-k {shlex.quote(str(self._socket_directory()))}",
                "-c listen_addresses=127.0.0.1",
                *(
                    ()
                    if self.durable
                    else ("-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")
                ),
                "-c max_connections=300",
                "-c shared_buffers=128MB",
                *(f"-c {shlex.quote(f'{k}={v}')}" for k, v in self.settings.items()),
            ]
        )
        return self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "30",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-o",
            options,
            check=False,
        )

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    conn.execute("select 1")
                return
            except psycopg.OperationalError as exc:
                last_error = exc
            time.sleep(0.1)
        raise RuntimeError(
            f"PostgreSQL on port {self.port} not accepting connections after {timeout:.0f} s "
            f"({last_error})\n--- {self.log_path} ---\n{log_tail(self.log_path)}"
        )

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m <mode>`` (smart, fast or immediate: immediate is a crash as
        far as the clients and WAL recovery are concerned); a no-op when not running."""
        self._stop(mode)

    def restart(self, mode: str = "fast") -> None:
        """Stop with ``mode``, then start again on the same port and data directory."""
        self._stop(mode)
        self.start()

    def _stop(self, mode: str = "fast") -> int | None:
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"pg_ctl stop mode must be smart, fast or immediate, not {mode!r}")
        pid = live_postmaster(self.data_dir)
        if not (self.data_dir / "postmaster.pid").exists():
            return None
        result = self._run(
            "pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w", check=False
        )
        if result.returncode != 0 and live_postmaster(self.data_dir) is not None:
            raise RuntimeError(
                f"pg_ctl stop failed (exit {result.returncode}) for {self.data_dir}:\n"
                f"{result.stdout}{result.stderr}"
            )
        if pid is not None:
            # postmaster.pid goes away just before the postmaster exits.
            wait_pid_gone(pid, timeout=10)
            self._last_pid = pid
        return pid

    def destroy(self) -> None:
        """Stop the server and delete the cluster folder (and the fallback location record)."""
        pid = self._stop() or self._last_pid
        if pid is not None:
            # The daemonized postmaster is reaped by init, which in some containers is lazy;
            # wait so that no "[postgres] <defunct>" entry outlives a test session.
            wait_pid_gone(pid, timeout=5, reaped=True)
        shutil.rmtree(self._cluster_dir, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.base_dir / _LOCATION_FILE).unlink()

    # -- clients --------------------------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        if self.port is None:
            raise RuntimeError("EmbeddedPostgres has no port yet: call start() first")
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE; no error if it already exists."""
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        with psycopg.connect(self.url(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is not None:
                return
            with contextlib.suppress(errors.DuplicateDatabase):
                conn.execute(query)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS ... WITH (FORCE) (terminates its connections)."""
        query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(query)
