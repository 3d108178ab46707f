"""compose.yaml, read as docker compose and podman-compose read it, and run with
podman-compose on images made here: no registry is reachable, so the official
`postgres` and `nats` images it names are stood in for by local ones selected through
POSTGRES_IMAGE and NATS_IMAGE (arm_core.devtools.testbed.images makes them).
podman-compose runs plain `podman`: the flags this machine needs (the same module) are
given to it as a containers.conf (CONTAINERS_CONF)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from arm_core.cli import COMMANDS
from arm_core.config import EnvSettings, Settings
from arm_core.devtools import reference
from arm_core.devtools.testbed.images import REPO, podman

COMPOSE_FILE = REPO / "compose.yaml"

# --- the file as compose reads it -------------------------------------------------------

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, $NAME, $$.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|(?P<named>[_a-zA-Z][_a-zA-Z0-9]*)|"
    r"\{(?P<braced>[_a-zA-Z][_a-zA-Z0-9]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})"
)


def load(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The file as YAML (anchors and `<<` merges resolved), not yet interpolated. Each
    service its own copy: a YAML alias (`bridge-2: *bridge`) is one object otherwise."""
    loaded: dict[str, Any] = json.loads(json.dumps(yaml.safe_load(path.read_text("utf-8"))))
    return loaded


def variables(node: Any) -> dict[str, set[str | None]]:
    """Every ${NAME…} the file interpolates and the defaults it is given where it is
    used (None: one without a default)."""
    found: dict[str, set[str | None]] = {}
    for value in _strings(node):
        for m in _VARIABLE.finditer(value):
            name = m.group("named") or m.group("braced")
            if name:
                has_default = (m.group("op") or "").endswith("-")
                found.setdefault(name, set()).add(m.group("arg") if has_default else None)
    return found


def header(path: Path = COMPOSE_FILE) -> str:
    """The comment the file starts with."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines[: next(
        (i for i, line in enumerate(lines) if not line.startswith("#")), len(lines)
    )])  # fmt: skip


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """`node` with ${NAME:-default} and friends replaced as compose does, from `env`."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if not isinstance(node, str):
        return node

    def value(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("named") or m.group("braced")
        op, arg, given = m.group("op") or "", m.group("arg") or "", env.get(name)
        unset = given is None or (op.startswith(":") and given == "")
        if op.endswith("?") and unset:
            raise ValueError(f"${{{name}}}: {arg or 'required'}")
        if op.endswith("-") and unset:
            return arg
        return given or ""

    return _VARIABLE.sub(value, node)


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in (key, *_strings(value))]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return [node] if isinstance(node, str) else []


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment`, in either of compose's forms (a mapping or a list of
    NAME=value), as a mapping."""
    given = service.get("environment") or {}
    if isinstance(given, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in given)
    return {str(key): "" if value is None else str(value) for key, value in given.items()}


def is_arm_core(service: dict[str, Any]) -> bool:
    """A service of the arm-core image (the one compose.yaml builds)."""
    return "ARM_CORE_IMAGE" in str(service.get("image", "")) or "build" in service


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    if isinstance(command, str):
        return command.split()
    return [str(word) for word in command or []]


# --- what arm-core reads ----------------------------------------------------------------

ARM_CORE_COMMANDS = frozenset(COMMANDS) | {"healthcheck"}


def env_names(cls: type[EnvSettings]) -> frozenset[str]:
    """The variables a settings model reads: its fields' aliases."""
    return frozenset(f.alias for f in cls.model_fields.values() if f.alias)


def _read_directly(module_file: str) -> frozenset[str]:
    """Variables a module reads by name beside its settings: `env.get("NAME"` (as
    reference.configs_from_env reads REFERENCE_SERVICES)."""
    source = Path(module_file).read_text(encoding="utf-8")
    return frozenset(re.findall(r"""\benv(?:iron)?\.get\(\s*["']([A-Z][A-Z0-9_]*)["']""", source))


def variables_read_by(command: str) -> frozenset[str]:
    """Every environment variable `arm-core <command>` reads: Settings' for every
    command, and the reference services' REFERENCE_* for `reference`."""
    names = env_names(Settings)
    if command == "reference":
        assert reference.__file__ is not None
        names |= env_names(reference.ReferenceConfig) | _read_directly(reference.__file__)
    return names


def problems(compose: dict[str, Any]) -> list[str]:
    """What is wrong with the arm-core services of a loaded (not interpolated) compose
    file: a command arm-core does not have, a variable it does not read. Empty when
    nothing is."""
    found: list[str] = []
    for name, service in (compose.get("services") or {}).items():
        if not is_arm_core(service):
            continue
        command = command_of(service)
        if not command or command[0] not in ARM_CORE_COMMANDS:
            found.append(f"{name}: command {command} is not an arm-core command")
            continue
        check = (service.get("healthcheck") or {}).get("test") or []
        if check[1:2] == ["arm-core"] and check[2:3] != ["healthcheck"]:
            found.append(f"{name}: healthcheck {check} is not `arm-core healthcheck`")
        unknown = sorted(set(environment(service)) - variables_read_by(command[0]))
        if unknown:
            found.append(f"{name}: arm-core {command[0]} reads no {', '.join(unknown)}")
    return found


# --- running it -------------------------------------------------------------------------

# podman-compose calls plain `podman`: the runtime, cgroup manager and ulimits of
# arm_core.devtools.testbed.images come from this file instead (CONTAINERS_CONF).
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


# Debian packages the compose test needs beyond the images' (testbed.images): the tool,
# and a network backend whose networks resolve service names (netavark with aardvark-dns;
# iptables publishes the ports). apt installs the last three as podman's recommends.
COMPOSE_PACKAGES = "podman-compose netavark aardvark-dns iptables"


def compose_missing() -> str | None:
    """Why compose.yaml cannot be run here, or None."""
    if shutil.which("podman-compose") is None:
        return f"podman-compose not found — apt-get install {COMPOSE_PACKAGES}"
    backend = podman("info", "--format", "{{.Host.NetworkBackend}}", check=False).stdout.strip()
    if backend != "netavark" or not Path("/usr/lib/podman/aardvark-dns").exists():
        return (
            f"podman's network backend is {backend or 'unknown'}"
            f"{'' if backend != 'netavark' else ' without aardvark-dns'}: containers "
            f"would not find each other by service name — apt-get install {COMPOSE_PACKAGES}"
        )
    return None


@dataclass
class ComposeProject:
    """compose.yaml under podman-compose as one project (its own containers, network
    and volumes, named after it), with `env` for its ${…} variables."""

    env: dict[str, str]
    workdir: Path
    name: str = field(default_factory=lambda: f"armcompose{uuid.uuid4().hex[:10]}")
    started_at: float = 0.0

    def __post_init__(self) -> None:
        conf = self.workdir / "containers.conf"
        conf.write_text(CONTAINERS_CONF, encoding="utf-8")
        self.env = {**self.env, "CONTAINERS_CONF": str(conf)}

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["podman-compose", "--file", str(COMPOSE_FILE), "--project-name", self.name, *args],
            env={**os.environ, **self.env}, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        return done

    def up(self) -> None:
        """`podman-compose up -d` (the images exist: no build)."""
        self.started_at = time.monotonic()
        done = self.compose("up", "-d", "--no-build")
        if done.returncode != 0:
            raise AssertionError(f"podman-compose up exited {done.returncode}:\n"
                                 f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")  # fmt: skip

    def down(self) -> subprocess.CompletedProcess[str]:
        """`podman-compose down -v`, then the network it leaves behind."""
        done = self.compose("down", "-v")
        podman("network", "rm", "--force", f"{self.name}_default", check=False)
        return done

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def containers(self) -> list[dict[str, Any]]:
        listed = podman(
            "ps", "--all", "--format", "json",
            "--filter", f"label=io.podman.compose.project={self.name}",
        )  # fmt: skip
        found: list[dict[str, Any]] = json.loads(listed.stdout or "[]")
        return found

    def volumes(self) -> list[str]:
        listed = podman(
            "volume", "ls", "--format", "{{.Name}}",
            "--filter", f"label=io.podman.compose.project={self.name}",
        )  # fmt: skip
        return listed.stdout.split()

    def state(self, service: str) -> dict[str, Any]:
        loaded: list[dict[str, Any]] = json.loads(podman("inspect", self.container(service)).stdout)
        state: dict[str, Any] = loaded[0]["State"]
        return state

    def exited_ok(self, service: str) -> bool:
        """A one-shot service ran to the end and exited 0 (it may have been restarted
        on failure before: `restarts`)."""
        state = self.state(service)
        return state["Status"] == "exited" and state["ExitCode"] == 0

    def restarts(self, service: str) -> int:
        loaded = json.loads(podman("inspect", self.container(service)).stdout)
        return int(loaded[0].get("RestartCount", 0))

    def healthy(self, service: str) -> bool:
        """The service's healthcheck, run as podman's systemd timer would run it."""
        return podman("healthcheck", "run", self.container(service), check=False).returncode == 0

    def logs(self, service: str, tail: int = 40) -> str:
        done = podman("logs", "--tail", str(tail), self.container(service), check=False)
        return done.stdout + done.stderr

    def all_logs(self, tail: int = 40) -> str:
        """The last lines of every container of the project, for a failure's message."""
        shown = []
        for ctr in self.containers():
            done = podman("logs", "--tail", str(tail), ctr["Names"][0], check=False)
            state = f"{ctr['State']}, exit {ctr.get('ExitCode')}"
            shown.append(f"--- {ctr['Names'][0]} ({state}):\n{done.stdout}{done.stderr}")
        return "\n".join(shown)
