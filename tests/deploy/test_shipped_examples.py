"""The deploy examples as shipped, run together: three nats-servers on
deploy/nats/nats-server.conf with the permissions file it includes (tests/support/
shipped_nats.py: only ports, the store, the routes' addresses and the TLS files'
paths replaced), and `arm-core migrate`, `bridge` and `serve` with the environment
deploy/systemd/*.env.example and the units give them — or the Kubernetes manifests'
`env`, the example Secret's keys and the image's ENV. Of those values only addresses,
ports, paths of mounted files and secrets (the placeholders) are replaced
(:func:`substituted`); every other value — RESULTS_STREAM with three replicas, AUTH_MODE,
NATS_ENABLED, LOG_FORMAT, the TLS scheme — is the example's. The recognition side is
`arm-core reference`, each service as its own NATS user of the permissions file.

A tabular and an image job end `done` through the stream, and the API answers for them
with the example's operator token. With the core-only permissions in place of the
stream's, the same bridge waits for JetStream and applies nothing: what the examples did
before they were made to fit, and what this test would catch."""

from __future__ import annotations

import functools
import json
import re
import secrets
import signal
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from arm_core.config import Settings
from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, json_log_records, log_lines
from arm_core.devtools.testbed.sql import dict_conn, job, upload
from tests.support.compose import variables_read_by
from tests.support.deploy_examples import (
    container_environment,
    load_manifests,
    load_units,
    unit_environment,
)
from tests.support.shipped_nats import CORE_PERMISSIONS, STREAM_PERMISSIONS, ShippedNatsCluster
from tests.support.tls import Pki

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# Where the Kubernetes manifests mount the Secret arm-core-tls.
K8S_TLS_MOUNT = "/etc/arm-core/tls/"
# An API_TOKENS entry of the examples: <actor>:level=<token> (or a named actor).
TOKEN_ENTRY = re.compile(r"(?P<actor><[^>]+>|[\w.-]+):(?P<level>[a-z]+)=<[^>]+>")


@dataclass
class Deployment:
    """What the test gives the examples in place of the real thing's."""

    tmp: Path
    db_url: str
    cluster: ShippedNatsCluster
    # The files the bridge's TLS variables name: the CA, and a client pair where the
    # example presents one (mutual TLS).
    tls_files: dict[str, Path]
    tokens: dict[str, str] = field(default_factory=dict)  # level → a token of that level
    procs: list[ArmProcess] = field(default_factory=list)

    def start(self, command: str, env: dict[str, str], name: str) -> ArmProcess:
        proc = ArmProcess(command, env, self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc


def substituted(example: dict[str, str], d: Deployment, command: str) -> dict[str, str]:
    """`example` with what only the deployment can know put in: the database, the NATS
    nodes' addresses (scheme kept), the mounted files' paths, the NATS seed, the API
    tokens (each entry's level kept), loopback for 0.0.0.0 and free ports. Fails on a
    variable arm-core does not read, on a placeholder left elsewhere, and on a value
    the configuration parser refuses."""
    unknown = sorted(set(example) - variables_read_by(command) - {"PATH", "HOME"})
    unknown = [n for n in unknown if not n.startswith("PYTHON")]  # the image's own
    assert unknown == [], f"arm-core {command} reads no {unknown}"
    env = {k: v for k, v in example.items() if k in variables_read_by(command)}
    nodes = iter(d.cluster.tls_urls())
    for name, value in env.items():
        if name == "DATABASE_URL":
            env[name] = d.db_url
        elif name == "NATS_URL":
            urls = value.split(",")
            assert len(urls) == 3, f"{name} lists {len(urls)} nodes"
            env[name] = ",".join(
                f"{url.split('://')[0]}://{next(nodes).split('://')[1]}" for url in urls
            )
        elif name.startswith("NATS_TLS_") and value.startswith(K8S_TLS_MOUNT):
            env[name] = str(d.tls_files[value.removeprefix(K8S_TLS_MOUNT)])
        elif name == "OPENBAO__NATS__NATS_SEED":
            env[name] = d.cluster.seeds["ARM_CORE_NKEY"]
        elif name == "API_TOKENS":
            assert TOKEN_ENTRY.sub("", value).strip(",") == "", f"{name}: {value!r}"
            entries = []
            for i, m in enumerate(TOKEN_ENTRY.finditer(value)):
                actor = f"actor{i}" if m["actor"].startswith("<") else m["actor"]
                token = secrets.token_urlsafe(18)
                d.tokens.setdefault(m["level"], token)
                entries.append(f"{actor}:{m['level']}={token}")
            env[name] = ",".join(entries)
        elif name == "HTTP_HOST" and value == "0.0.0.0":
            env[name] = "127.0.0.1"
        elif name in ("HTTP_PORT", "BRIDGE_HEALTH_PORT"):
            env[name] = str(free_port())
    left = {k: v for k, v in env.items() if "<" in v}
    assert left == {}, f"placeholders the test does not fill: {sorted(left)}"
    Settings.from_env(env)  # a ConfigError names the variable
    return env


def systemd_env(unit: str, credentials: Path) -> dict[str, str]:
    [found] = [u for u in load_units() if u.name == unit]
    return unit_environment(found, credentials)


def examples(flavour: str, d: Deployment) -> dict[str, dict[str, str]]:
    """command → its environment in the `flavour` examples, substituted."""
    if flavour == "systemd":
        # LoadCredential= hands the CA to the unit as %d/nats-ca.crt.
        credentials = d.tmp / "credentials"
        credentials.mkdir()
        (credentials / "nats-ca.crt").write_bytes(d.tls_files["nats-ca.crt"].read_bytes())
        raw = {
            command: systemd_env(f"arm-core-{command}.service", credentials)
            for command in ("migrate", "bridge", "serve")
        }
    else:
        docs = load_manifests()
        raw = {
            command: container_environment(docs, name)
            for command, name in (
                ("migrate", "arm-core-migrate-" + migrate_suffix(docs)),
                ("bridge", "arm-core-bridge"),
                ("serve", "arm-core-serve"),
            )
        }
    return {command: substituted(env, d, command) for command, env in raw.items()}


def migrate_suffix(docs: list[dict[str, Any]]) -> str:
    """The migrate Job is named per release (arm-core-migrate-1-0-0)."""
    [name] = [
        d["metadata"]["name"]
        for d in docs
        if d.get("kind") == "Job" and d["metadata"]["name"].startswith("arm-core-migrate-")
    ]
    return str(name).removeprefix("arm-core-migrate-")


@pytest.fixture
def deployment(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    pki = Pki(tmp_path / "pki")
    server = pki.issue("nats-server", "127.0.0.1")
    client = pki.issue("nats-client", "arm-core-bridge")
    permissions = getattr(request, "param", STREAM_PERMISSIONS)
    cluster = ShippedNatsCluster(
        base_dir=tmp_path / "nats", server=server, ca=pki.ca_file, permissions=permissions
    )
    d = Deployment(
        tmp=tmp_path,
        db_url=db_url,
        cluster=cluster,
        tls_files={
            "nats-ca.crt": pki.ca_file,
            "nats-client.crt": client.cert,
            "nats-client.key": client.key,
        },
    )
    try:
        cluster.start(timeout=60)
        yield d
    finally:
        for proc in d.procs:
            if proc.proc.poll() is None:
                proc.kill()
        cluster.stop()


def reference(d: Deployment, service: str, user: str) -> ArmProcess:
    """`arm-core reference` as one service, connected as that service's NATS user."""
    env = {
        "NATS_URL": ",".join(d.cluster.tls_urls()),
        "NATS_TLS_CA_FILE": str(d.tls_files["nats-ca.crt"]),
        "OPENBAO__NATS__NATS_SEED": d.cluster.seeds[user],
        "REFERENCE_SERVICES": service,
        "REFERENCE_DELAY_SECONDS": "0",
        "REFERENCE_RESULTS_DIR": str(d.tmp / "results"),
    }
    return d.start("reference", env, f"reference-{service}")


def on_the_stream(service: ArmProcess) -> bool:
    """A reference service listens and answers through JetStream publish."""
    return bool(log_lines(service.log(), action="ref_start", stream="ARM_RESULTS"))


def varz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as resp:
        loaded: dict[str, Any] = json.loads(resp.read())
    return loaded


def api_get(base: str, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(base + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def stream_replicas(d: Deployment) -> int:
    """The results stream's replicas, asked as arm-core's own NATS user (which may)."""
    nc = Client()
    ctx = ssl.create_default_context(cafile=str(d.tls_files["nats-ca.crt"]))
    await nc.connect(d.cluster.tls_urls(), tls=ctx, nkeys_seed_str=d.cluster.seeds["ARM_CORE_NKEY"])
    try:
        info = await nc.jetstream().stream_info("ARM_RESULTS")
        replicas = info.config.num_replicas
        assert replicas is not None
        return replicas
    finally:
        await nc.close()


@pytest.mark.parametrize("flavour", ["systemd", "kubernetes"])
async def test_the_examples_carry_jobs_to_done_through_the_stream_on_three_replicas(
    deployment: Deployment, flavour: str
) -> None:
    d = deployment
    # Each node writes every message to disk before the stream acknowledges it.
    for port in d.cluster.monitor_ports:
        assert varz(port)["jetstream"]["config"]["sync_always"] is True
    envs = examples(flavour, d)
    assert envs["bridge"]["RESULTS_STREAM"] == "ARM_RESULTS"
    assert envs["bridge"]["RESULTS_STREAM_REPLICAS"] == "3"
    assert envs["bridge"]["NATS_URL"].startswith("tls://")
    migrate = d.start("migrate", envs["migrate"], "migrate")
    assert migrate.proc.wait(120) == 0, migrate.log()
    bridge = d.start("bridge", envs["bridge"], "bridge")
    bridge.wait_healthy(int(envs["bridge"]["BRIDGE_HEALTH_PORT"]), 60)
    serve = d.start("serve", envs["serve"], "serve")
    serve.wait_healthy(int(envs["serve"]["HTTP_PORT"]), 60)
    # The services find the stream the bridge made and answer through it.
    services = [
        reference(d, "tabular-parser", "TABULAR_PARSER_NKEY"),
        reference(d, "scan-gateway", "SCAN_GATEWAY_NKEY"),
    ]
    for service in services:
        on_stream = functools.partial(on_the_stream, service)
        service.wait_until(on_stream, 60, "listening, answering through the stream ARM_RESULTS")
    with dict_conn(d.db_url) as conn:
        uploads = [upload(conn, "XLSX"), upload(conn, "PDF")]

        def statuses() -> list[str]:
            return [job(conn, up.job_id)["status"] for up in uploads]

        await wait_for(lambda: statuses() == ["done", "done"], 60, lambda: str(statuses()))
    assert await stream_replicas(d) == 3
    base = f"http://127.0.0.1:{envs['serve']['HTTP_PORT']}"
    for up in uploads:
        status, body = api_get(base, f"/api/v1/files/{up.file_id}", d.tokens["operator"])
        assert status == 200, body
        assert body["current_job"]["status"] == "done", body
        assert api_get(base, f"/api/v1/files/{up.file_id}", None)[0] == 401
    # Nobody was refused anything, and the bridge never waited for JetStream.
    for node in d.cluster.nodes:
        assert "Violation" not in node.log_path.read_text()
    assert json_log_records(bridge.log(), action="stream_waiting") == []
    assert json_log_records(bridge.log(), action="stream_created") != []
    for proc in (bridge, serve, *services):
        assert proc.stop(signal.SIGTERM, within=30) == 0, proc.log()[-2000:]


@pytest.mark.parametrize("deployment", [CORE_PERMISSIONS], indirect=True)
async def test_the_stream_examples_with_the_core_permissions_wait_for_jetstream(
    deployment: Deployment,
) -> None:
    """The core-only file gives arm-core no $JS.API: its bridge says it waits for
    JetStream, and the servers log the refusals."""
    d = deployment
    envs = examples("systemd", d)
    bridge = d.start("bridge", envs["bridge"], "bridge")
    bridge.wait_until(
        lambda: bool(json_log_records(bridge.log(), action="stream_waiting")), 60, "stream_waiting"
    )
    said = 'Publish Violation - Subject "$JS.API.STREAM.INFO.ARM_RESULTS"'
    refused = [n for n in d.cluster.nodes if said in n.log_path.read_text()]
    assert refused, "no node logged the refused JetStream API calls"
