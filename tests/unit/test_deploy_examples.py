"""deploy/systemd/ and deploy/kubernetes/, read as systemd and Kubernetes read them.

Like tests/container/test_compose.py for compose.yaml: every command is one `arm-core`
has, every environment variable one that command reads (tests/support/compose.py
variables_read_by: Settings' fields, and REFERENCE_* for `reference`), and —

- systemd: `ExecStart` runs /opt/arm-core/bin/arm-core; each `EnvironmentFile` has its
  example beside the unit; a `%d/<name>` file is one the unit's `LoadCredential` hands
  over; directives commented out (`#Environment=…`) are checked as well, so uncommenting
  one starts no broken unit; and `systemd-analyze verify` finds nothing to say about the
  units (an unknown key, a bad value, a missing dependency).
- Kubernetes: the image's entrypoint is `arm-core`, so `args[0]` is the command; every
  probe asks a path the command's app serves (arm_core.runtime.create_app for `serve`,
  arm_core.runtime.bridge_app for `bridge`), public under `serve`'s token, on the port
  the command listens on (its variable in the manifest, else the Containerfile's ENV);
  every `secretKeyRef` is a key of the example Secret; every file a variable names
  (`NATS_TLS_*_FILE`, DATABASE_URL's `sslrootcert`) is in a Secret volume the container
  mounts; a Service's selector and target port meet a pod template's.

The tests at the end prove that each check catches the typo it is there for."""

from __future__ import annotations

import copy
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from arm_core.cli import COMMANDS, main
from arm_core.config import Settings
from arm_core.http.auth import PUBLIC_PATHS
from arm_core.runtime import bridge_app, create_app
from tests.support.compose import variables_read_by
from tests.support.deploy_examples import (
    CREDENTIAL,
    ROOT,
    SYSTEMD,
    Unit,
    env_file_names,
    example_of,
    image_env,
    load_manifests,
    load_units,
    mounted_files,
    pod_specs,
    secret_keys,
)

EXECUTABLE = "/opt/arm-core/bin/arm-core"
# The argparse commands of arm_core.cli.main (test_the_known_commands_are_the_clis).
CLI_COMMANDS = frozenset(COMMANDS) | {"healthcheck", "rollback"}
# Which variable names the port each long-running command listens on.
PORT_VARIABLE = {"serve": "HTTP_PORT", "bridge": "BRIDGE_HEALTH_PORT"}

# --- systemd ----------------------------------------------------------------------------


def unit_problems(unit: Unit) -> list[str]:
    found: list[str] = []
    where = unit.name
    [exec_start] = unit.values("ExecStart") or [""]
    words = shlex.split(exec_start)
    if words[:1] != [EXECUTABLE]:
        return [f"{where}: ExecStart {exec_start!r} does not run {EXECUTABLE}"]
    command = words[1] if len(words) > 1 else ""
    if command not in CLI_COMMANDS:
        return [f"{where}: {command!r} is not an arm-core command"]
    known = variables_read_by(command)
    names: list[str] = []
    for assignments in unit.values("Environment"):
        names += [word.split("=", 1)[0] for word in shlex.split(assignments)]
    for env_file, text in unit.env_files.items():
        if not text:
            found.append(f"{where}: no {example_of(env_file).relative_to(ROOT)} for {env_file}")
        names += env_file_names(text)
    for name in dict.fromkeys(names):
        if name not in known:
            found.append(f"{where}: arm-core {command} reads no {name}")
    credentials = {c.split(":", 1)[0] for c in unit.values("LoadCredential")}
    for assignments in unit.values("Environment"):
        for credential in CREDENTIAL.findall(assignments):
            if credential not in credentials:
                found.append(f"{where}: %d/{credential} is no LoadCredential of the unit")
    return found


def test_the_units_run_arm_core_commands_with_variables_they_read() -> None:
    units = load_units()
    assert {u.name for u in units} == {
        "arm-core-migrate.service",
        "arm-core-serve.service",
        "arm-core-bridge.service",
    }
    assert [p for u in units for p in unit_problems(u)] == []
    commands = {u.name: shlex.split(u.values("ExecStart")[0])[1] for u in units}
    assert commands == {
        "arm-core-migrate.service": "migrate",
        "arm-core-serve.service": "serve",
        "arm-core-bridge.service": "bridge",
    }
    # Every example is some unit's.
    used = {example_of(f).name for u in units for f in u.env_files}
    assert used == {p.name for p in SYSTEMD.glob("*.env.example")}


def test_the_units_restart_and_are_hardened() -> None:
    for unit in load_units():
        value = unit.value
        command = shlex.split(value("ExecStart"))[1]
        if command == "migrate":
            assert value("Type") == "oneshot"
        else:
            assert value("Restart") == "on-failure", unit.name
            # Exit 2 is a configuration error (arm_core.cli): a restart cannot fix it.
            assert value("RestartPreventExitStatus") == "2", unit.name
            # More than the bridge's 10 s drain.
            assert int(value("TimeoutStopSec")) >= 20, unit.name
            assert "arm-core-migrate.service" in value("After").split(), unit.name
        for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "DynamicUser"):
            assert value(key) == "yes", (unit.name, key)
        assert value("ProtectSystem") == "strict", unit.name
        assert value("CapabilityBoundingSet") == "", unit.name


def fake_arm_core(directory: Path) -> str:
    """An executable at a path of `directory`, standing in for /opt/arm-core/bin/arm-core
    (systemd-analyze verify checks that ExecStart's program exists)."""
    fake = directory / "bin" / "arm-core"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return str(fake)


def systemd_analyze_verify(directory: Path, units: dict[str, str]) -> str:
    """What `systemd-analyze verify` says about `units` (name → text) written in
    `directory`, with ExecStart's program at a path that exists: nothing when they are
    right."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    fake = fake_arm_core(directory)
    paths = []
    for name, text in units.items():
        path = directory / name
        path.write_text(text.replace(EXECUTABLE, fake), encoding="utf-8")
        paths.append(str(path))
    done = subprocess.run(
        [analyze, "verify", "--man=no", *paths],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    said = (done.stdout + done.stderr).strip()
    return said if said or done.returncode == 0 else f"exit {done.returncode}"


def unit_texts() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(SYSTEMD.glob("*.service"))}


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    assert systemd_analyze_verify(tmp_path, unit_texts()) == ""


def test_systemd_analyze_verify_catches_a_misspelled_key(tmp_path: Path) -> None:
    units = unit_texts()
    units["arm-core-bridge.service"] = units["arm-core-bridge.service"].replace(
        "NoNewPrivileges=yes", "NoNewPrivilege=yes"
    )
    said = systemd_analyze_verify(tmp_path, units)
    assert "Unknown key 'NoNewPrivilege'" in said, said


# --- Kubernetes -------------------------------------------------------------------------


@cache
def served_paths(command: str) -> frozenset[str]:
    """The GET paths `arm-core <command>`'s app serves (none: it has no HTTP server)."""
    settings = Settings.from_env({})
    apps = {"serve": create_app, "bridge": bridge_app}
    if command not in apps:
        return frozenset()
    app = apps[command](settings)
    return frozenset(r.resource.canonical for r in app.router.routes() if r.resource)


def container_problems(
    where: str,
    container: dict[str, Any],
    pod: dict[str, Any],
    secrets: dict[str, dict[str, str]],
) -> list[str]:
    found: list[str] = []
    if container.get("command") not in (None, ["arm-core"]):
        found.append(f"{where}: command {container['command']} is not the image's arm-core")
    args = [str(a) for a in container.get("args", [])]
    command = args[0] if args else ""
    if command not in CLI_COMMANDS:
        return [*found, f"{where}: args {args} name no arm-core command"]
    env: dict[str, str] = {}
    for var in container.get("env", []):
        name = var["name"]
        if name not in variables_read_by(command):
            found.append(f"{where}: arm-core {command} reads no {name}")
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            if ref["key"] not in secrets.get(ref["name"], {}):
                found.append(f"{where}: {name}: Secret {ref['name']} has no key {ref['key']}")
                continue
            env[name] = secrets[ref["name"]][ref["key"]]
        else:
            env[name] = str(var.get("value", ""))
    for source in container.get("envFrom", []):
        for name in secrets.get((source.get("secretRef") or {}).get("name", ""), {}):
            if name not in variables_read_by(command):
                found.append(f"{where}: arm-core {command} reads no {name} (envFrom)")
    # Files the variables name: in a Secret volume the container mounts.
    files = mounted_files(container, pod, secrets)
    named = {n: v for n, v in env.items() if n.endswith("_FILE") and v}
    if "DATABASE_URL" in env:
        query = parse_qs(urlsplit(env["DATABASE_URL"]).query)
        for k in ("sslrootcert", "sslcert", "sslkey"):
            if k in query:
                named[f"DATABASE_URL {k}"] = query[k][0]
    for name, path in named.items():
        if path not in files:
            found.append(f"{where}: {name}={path} is in no mounted Secret")
    # Probes: a path the app serves, on the port it listens on.
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    defaults = image_env()
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = (container.get(kind) or {}).get("httpGet")
        if get is None:
            continue
        path = get.get("path", "/")
        if path not in served_paths(command):
            found.append(f"{where}: {kind} path {path} is not served by arm-core {command}")
            continue
        if command == "serve" and env.get("AUTH_MODE", "none") != "none":
            if path not in PUBLIC_PATHS:
                found.append(f"{where}: {kind} path {path} needs the API's token")
        port = ports.get(get["port"], get["port"])
        variable = PORT_VARIABLE[command]
        listens = int(env.get(variable) or defaults[variable])
        if port != listens:
            found.append(f"{where}: {kind} asks port {port}; {variable} is {listens}")
    return found


def manifest_problems(docs: list[dict[str, Any]]) -> list[str]:
    secrets = secret_keys(docs)
    found: list[str] = []
    templates: list[dict[str, Any]] = []
    for where, pod in pod_specs(docs):
        templates.append(pod)
        for container in pod["containers"]:
            found += container_problems(f"{where}/{container['name']}", container, pod, secrets)
    pod_labels = [
        (d["spec"]["template"]["metadata"].get("labels", {}), d["spec"]["template"]["spec"])
        for d in docs
        if d.get("kind") in ("Deployment", "Job")
    ]
    for service in (d for d in docs if d.get("kind") == "Service"):
        selector = service["spec"]["selector"]
        chosen = [pod for labels, pod in pod_labels if selector.items() <= labels.items()]
        if not chosen:
            found.append(f"Service {service['metadata']['name']}: selects no pod")
        names = {p.get("name") for pod in chosen for c in pod["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            if isinstance(port["targetPort"], str) and port["targetPort"] not in names:
                found.append(
                    f"Service {service['metadata']['name']}: no container port {port['targetPort']}"
                )
    return found


def test_the_manifests_run_arm_core_commands_with_variables_they_read() -> None:
    docs = load_manifests()
    assert manifest_problems(docs) == []
    commands = {
        where: str(c["args"][0]) for where, pod in pod_specs(docs) for c in pod["containers"]
    }
    assert commands == {
        "Job arm-core-migrate-1-1-0": "migrate",
        "Deployment arm-core-serve": "serve",
        "Deployment arm-core-bridge": "bridge",
    }


def test_the_deployments_probe_livez_and_readyz_and_ask_for_resources() -> None:
    for where, pod in pod_specs(load_manifests()):
        for c in pod["containers"]:
            assert c["resources"]["requests"]["memory"], where
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
            if where.startswith("Deployment"):
                assert c["livenessProbe"]["httpGet"]["path"] == "/livez", where
                assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", where
                # More than the bridge's 10 s drain.
                assert pod["terminationGracePeriodSeconds"] >= 20, where
        assert pod["securityContext"]["runAsNonRoot"] is True, where


def named_peer(peer: dict[str, Any]) -> bool:
    """An address block, or a selector that names labels (an empty one selects all)."""
    selectors = [v for k, v in peer.items() if k.endswith("Selector")]
    return bool(peer.get("ipBlock")) or any(
        s.get("matchLabels") or s.get("matchExpressions") for s in selectors
    )


def policy_problems(docs: list[dict[str, Any]]) -> list[str]:
    """The bridge's port serves /metrics without a token: a NetworkPolicy must select
    each bridge pod, govern its ingress, and let in only named peers (a selector or an
    address block each; an empty `from` is everyone) on the health port only."""
    found: list[str] = []
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    for where, pod in pod_specs(docs):
        [container] = pod["containers"]
        if container.get("args", [""])[0] != "bridge":
            continue
        [doc] = [d for d in docs if f"{d.get('kind')} {d['metadata']['name']}" == where]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"] for p in container["ports"]} | {
            p["containerPort"] for p in container["ports"]
        }
        covering = [
            p
            for p in policies
            if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
            and "Ingress" in p["spec"].get("policyTypes", [])
        ]
        if not covering:
            found.append(f"{where}: no NetworkPolicy governs its ingress")
        for policy in covering:
            name = f"NetworkPolicy {policy['metadata']['name']}"
            for rule in policy["spec"].get("ingress", []):
                peers = rule.get("from") or []
                if not peers or not all(map(named_peer, peers)):
                    found.append(f"{name}: a rule lets every peer in")
                opened = {port.get("port") for port in rule.get("ports") or [{}]}
                if not opened or not opened <= ports:
                    found.append(f"{name}: opens {sorted(map(str, opened))}, not the health port")
    return found


def test_a_network_policy_opens_the_bridges_port_to_named_peers_only() -> None:
    assert policy_problems(load_manifests()) == []


def test_a_missing_or_open_network_policy_is_caught() -> None:
    docs = copy.deepcopy(load_manifests())
    [policy] = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    policy["spec"]["ingress"][0]["from"] = []
    policy["spec"]["ingress"].append({"from": [{"podSelector": {}}], "ports": [{"port": 5432}]})
    assert policy_problems(docs) == [
        "NetworkPolicy arm-core-bridge: a rule lets every peer in",
        "NetworkPolicy arm-core-bridge: a rule lets every peer in",
        "NetworkPolicy arm-core-bridge: opens ['5432'], not the health port",
    ]
    docs.remove(policy)
    assert policy_problems(docs) == [
        "Deployment arm-core-bridge: no NetworkPolicy governs its ingress"
    ]


def test_the_example_secret_holds_placeholders_only() -> None:
    for name, keys in secret_keys(load_manifests()).items():
        for key, value in keys.items():
            assert "<" in value and ">" in value, f"Secret {name} {key}: not a placeholder"


# --- the checks catch what they are there for -------------------------------------------


def test_the_known_commands_are_the_clis() -> None:
    for command in CLI_COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0, command
    with pytest.raises(SystemExit) as exited:
        main(["serv"])
    assert exited.value.code == 2


def test_a_misspelled_variable_command_or_credential_in_a_unit_is_caught() -> None:
    units = {u.name: u for u in load_units()}
    bridge = copy.deepcopy(units["arm-core-bridge.service"])
    [env_file] = bridge.env_files
    bridge.env_files[env_file] += "OUTBOX_POLL_SECOND=1\n"
    bridge.directives.append(("Service", "Environment", "NATS_TLS_CA_FILE=%d/nats.crt", False))
    serve = copy.deepcopy(units["arm-core-serve.service"])
    serve.directives = [
        (s, k, v.replace(" serve", " serv") if k == "ExecStart" else v, c)
        for s, k, v, c in serve.directives
    ]
    migrate = copy.deepcopy(units["arm-core-migrate.service"])
    # REFERENCE_* are the reference services' alone; commented out counts too.
    migrate.directives.append(("Service", "Environment", "REFERENCE_MODE=fail", True))
    assert [p for u in (bridge, serve, migrate) for p in unit_problems(u)] == [
        "arm-core-bridge.service: arm-core bridge reads no OUTBOX_POLL_SECOND",
        "arm-core-bridge.service: %d/nats.crt is no LoadCredential of the unit",
        "arm-core-serve.service: 'serv' is not an arm-core command",
        "arm-core-migrate.service: arm-core migrate reads no REFERENCE_MODE",
    ]


def test_a_misspelled_variable_command_probe_or_secret_in_a_manifest_is_caught() -> None:
    docs = copy.deepcopy(load_manifests())
    pods = dict(pod_specs(docs))
    bridge = pods["Deployment arm-core-bridge"]["containers"][0]
    bridge["env"].append({"name": "DATABSE_URL", "value": "postgresql://x@y/z"})
    bridge["livenessProbe"]["httpGet"]["path"] = "/healthz"
    bridge["readinessProbe"]["httpGet"]["port"] = 8080
    serve = pods["Deployment arm-core-serve"]["containers"][0]
    serve["readinessProbe"]["httpGet"]["path"] = "/api/v1/status"
    serve["env"][0]["valueFrom"]["secretKeyRef"]["key"] = "serve-url"
    migrate = pods["Job arm-core-migrate-1-1-0"]["containers"][0]
    migrate["args"] = ["migrat"]
    pods["Deployment arm-core-bridge"]["volumes"][0]["secret"]["items"] = [
        {"key": "pg-ca.crt", "path": "pg-ca.crt"}
    ]
    assert manifest_problems(docs) == [
        "Deployment arm-core-bridge/bridge: arm-core bridge reads no DATABSE_URL",
        "Deployment arm-core-bridge/bridge: NATS_TLS_CA_FILE=/etc/arm-core/tls/nats-ca.crt "
        "is in no mounted Secret",
        "Deployment arm-core-bridge/bridge: NATS_TLS_CERT_FILE=/etc/arm-core/tls/nats-client.crt "
        "is in no mounted Secret",
        "Deployment arm-core-bridge/bridge: NATS_TLS_KEY_FILE=/etc/arm-core/tls/nats-client.key "
        "is in no mounted Secret",
        "Deployment arm-core-bridge/bridge: livenessProbe path /healthz is not served by "
        "arm-core bridge",
        "Deployment arm-core-bridge/bridge: readinessProbe asks port 8080; "
        "BRIDGE_HEALTH_PORT is 8081",
        "Job arm-core-migrate-1-1-0/migrate: args ['migrat'] name no arm-core command",
        "Deployment arm-core-serve/serve: DATABASE_URL: Secret arm-core has no key serve-url",
        "Deployment arm-core-serve/serve: readinessProbe path /api/v1/status needs the API's token",
    ]
