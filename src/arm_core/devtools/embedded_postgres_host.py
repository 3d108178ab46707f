"""What an embedded PostgreSQL cluster (:mod:`arm_core.devtools.embedded_postgres`) needs
from the machine it runs on: the server binaries (:func:`find_pg_bindir`), the
``postgres`` OS user initdb and pg_ctl run as when this process is root
(:func:`postgres_ids`, :func:`traversable_by`), and the cluster's processes, read from
``/proc`` (:func:`live_postmaster`, :func:`children`, :func:`pid_alive`,
:func:`wait_pid_gone`).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

__all__ = [
    "PG_OS_USER",
    "children",
    "find_pg_bindir",
    "live_postmaster",
    "make_dirs",
    "pid_alive",
    "postgres_ids",
    "traversable_by",
    "wait_pid_gone",
]

PG_OS_USER = "postgres"


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


def pid_alive(pid: int) -> bool:
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


def wait_pid_gone(pid: int, timeout: float, reaped: bool = False) -> None:
    """Wait until ``pid`` has exited (or, with ``reaped``, left the process table)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (Path(f"/proc/{pid}").exists() if reaped else pid_alive(pid)):
            return
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a postmaster's backends and workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(entry.name))
    return found


def live_postmaster(data_dir: Path) -> int | None:
    """PID of a running postmaster serving ``data_dir``, or None (no or stale postmaster.pid)."""
    try:
        first = (data_dir / "postmaster.pid").read_text().splitlines()[0]
        pid = int(first.strip())
    except (OSError, IndexError, ValueError):
        return None
    if pid <= 0 or not pid_alive(pid):
        return None
    # The PID may have been recycled by an unrelated process: a postmaster chdirs to its
    # data directory, so compare its working directory.
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return pid  # cannot tell (no /proc, or another user's process): assume it is live
    return pid if cwd.resolve() == data_dir.resolve() else None


def postgres_ids() -> tuple[int, int, set[int]]:
    try:
        entry = pwd.getpwnam(PG_OS_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but there is no {PG_OS_USER!r} OS user to run initdb/pg_ctl as"
        ) from None
    groups = set(os.getgrouplist(PG_OS_USER, entry.pw_gid))
    return entry.pw_uid, entry.pw_gid, groups


def traversable_by(path: Path, uid: int, groups: set[int]) -> bool:
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def make_dirs(path: Path) -> list[Path]:
    """``mkdir -p`` that returns the directories it created, outermost first."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    path.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))
