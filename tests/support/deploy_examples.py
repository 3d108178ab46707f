"""deploy/systemd/ and deploy/kubernetes/, read as systemd and Kubernetes read them: a
unit's directives and its EnvironmentFile example, a manifest's documents, the Secret
example's keys and the image's ENV — and from them the environment a command gets
(:func:`unit_environment`, :func:`container_environment`). tests/unit/test_deploy_examples.py
checks the files against arm-core; tests/deploy/test_shipped_examples.py runs them."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
KUBERNETES = ROOT / "deploy" / "kubernetes"

# --- systemd ----------------------------------------------------------------------------

# A directive, or one commented out: `Key=value` or `#Key=value` (not prose in a comment).
DIRECTIVE = re.compile(r"^(?P<commented>#)?(?P<key>[A-Z][A-Za-z]+)=(?P<value>.*)$")
CREDENTIAL = re.compile(r"%d/([^\s/]+)")


@dataclass
class Unit:
    name: str
    # (section, key, value, commented out) in file order.
    directives: list[tuple[str, str, str, bool]]
    # EnvironmentFile= path → its example's text (tests may replace it).
    env_files: dict[str, str] = field(default_factory=dict)

    def values(self, key: str, commented: bool = True) -> list[str]:
        return [v for _, k, v, c in self.directives if k == key and (commented or not c)]

    def value(self, key: str) -> str:
        """The one value of `key` in effect (not commented out)."""
        [found] = self.values(key, commented=False)
        return found


def parse_unit(text: str, name: str) -> Unit:
    section, found = "", []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
            continue
        m = DIRECTIVE.match(stripped)
        if m and section:
            found.append((section, m["key"], m["value"].strip(), bool(m["commented"])))
    return Unit(name, found)


def example_of(env_file: str) -> Path:
    """/etc/arm-core/serve.env (or -/etc/…: optional) → deploy/systemd/serve.env.example."""
    return SYSTEMD / (PurePosixPath(env_file.lstrip("-")).name + ".example")


def load_units() -> list[Unit]:
    units = []
    for path in sorted(SYSTEMD.glob("*.service")):
        unit = parse_unit(path.read_text(encoding="utf-8"), path.name)
        for env_file in unit.values("EnvironmentFile"):
            example = example_of(env_file)
            unit.env_files[env_file] = (
                example.read_text(encoding="utf-8") if example.is_file() else ""
            )
        units.append(unit)
    return units


def env_file_names(text: str) -> list[str]:
    """The variables an EnvironmentFile sets."""
    return list(env_file_values(text))


def env_file_values(text: str) -> dict[str, str]:
    """What an EnvironmentFile sets: NAME=value lines (# starts a comment, no quotes)."""
    found = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return found


def unit_environment(unit: Unit, credentials: Path) -> dict[str, str]:
    """The environment systemd gives the unit's process: its EnvironmentFile examples,
    then its Environment= lines in effect, with %d ($CREDENTIALS_DIRECTORY) as
    `credentials`, where the caller puts the files its LoadCredential= names."""
    env: dict[str, str] = {}
    for text in unit.env_files.values():
        env.update(env_file_values(text))
    for assignments in unit.values("Environment", commented=False):
        for word in shlex.split(assignments):
            name, _, value = word.partition("=")
            env[name] = value.replace("%d", str(credentials))
    return env


# --- Kubernetes -------------------------------------------------------------------------


def load_manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs


def image_env() -> dict[str, str]:
    """The ENV of the Containerfile's runtime stage (its defaults: HTTP_PORT, …)."""
    text = (ROOT / "Containerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                name, _, value = word.partition("=")
                found[name] = value
    return found


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc.get("kind") in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield f"{doc['kind']} {doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def secret_keys(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        d["metadata"]["name"]: {**d.get("stringData", {}), **d.get("data", {})}
        for d in docs
        if d.get("kind") == "Secret"
    }


def mounted_files(
    container: dict[str, Any], pod: dict[str, Any], secrets: dict[str, dict[str, str]]
) -> set[str]:
    """The paths of the files the container's Secret volumes put in it."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = set()
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if not secret:
            continue
        items = secret.get("items") or [
            {"key": k, "path": k} for k in secrets.get(secret["secretName"], {})
        ]
        files |= {f"{mount['mountPath'].rstrip('/')}/{item['path']}" for item in items}
    return files


def container_environment(docs: list[dict[str, Any]], workload: str) -> dict[str, str]:
    """The environment of the one container of `workload` (a Deployment's or Job's name):
    the image's ENV, then the container's `env`, a `secretKeyRef` read from the example
    Secret (still a placeholder there)."""
    secrets = secret_keys(docs)
    [pod] = [spec for where, spec in pod_specs(docs) if where.split(" ", 1)[1] == workload]
    [container] = pod["containers"]
    env = dict(image_env())
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets[ref["name"]][ref["key"]]
    return env
