"""Test support for a NATS cluster (arm_core.devtools.embedded_nats.EmbeddedNatsCluster): a
recognition service that records every request it receives by Nats-Msg-Id, and how to
find the node an `arm-core` process is connected to."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNatsCluster
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack, log_lines
from arm_core.devtools.testbed.services import envelope, nats_client

REQUEST_SUBJECTS = ("files.tabular_uploaded", "files.img_uploaded")
SERVICE_QUEUE = "recognition-services"


def core_name(proc: ArmProcess) -> str:
    """The NATS connection name of an `arm-core serve|bridge` process (bridge/runner.py:
    arm-core@<host>:<pid>), as the servers' /connz list it."""
    return f"arm-core@{socket.gethostname()}:{proc.proc.pid}"


async def core_node(cluster: EmbeddedNatsCluster, proc: ArmProcess, within: float = 30) -> int:
    """The index of the node `proc` is connected to, once it is connected to one."""
    name = core_name(proc)
    await wait_for(lambda: cluster.node_of(name) is not None, within, f"{name} on a node")
    node = cluster.node_of(name)
    assert node is not None
    return node


@dataclass
class RecordingService:
    """A recognition service on one node: answers every request `delay` seconds after
    it came (so that a flow always has answers on their way) — the result only, or the
    ack then the result — and counts the requests it received by
    Nats-Msg-Id. It publishes with nats-py's default client buffer (its own node is never
    the one killed). Several share one queue group, as replicas of a service do."""

    client: Client
    ack: bool = False
    delay: float = 0.2
    result_subject: str = "files.tabular_parsed"
    received: Counter[str] = field(default_factory=Counter)
    sent_at: dict[str, float] = field(default_factory=dict)  # job id: first answer's time
    _answering: set[asyncio.Task[None]] = field(default_factory=set)

    async def on_request(self, msg: Msg) -> None:
        self.received[(msg.headers or {}).get("Nats-Msg-Id", "")] += 1
        # Answered `delay` seconds later, in a task of its own: nats-py runs a
        # subscription's callbacks one at a time.
        answer = asyncio.create_task(self._answer(json.loads(msg.data)))
        self._answering.add(answer)
        answer.add_done_callback(self._answering.discard)

    async def _answer(self, request: dict[str, Any]) -> None:
        await asyncio.sleep(self.delay)
        job_id, file_id = uuid.UUID(request["job_id"]), uuid.UUID(request["file_id"])
        attempt = request["attempt"]
        service = "tabular-parser" if request["pipeline"] == "tabular" else "scan-gateway"
        self.sent_at.setdefault(str(job_id), time.monotonic())
        if self.ack:
            await self.client.publish(
                self.result_subject,
                json.dumps(envelope(job_id, file_id, "processing", service)).encode(),
                headers={"Nats-Msg-Id": f"ack:{job_id}:{attempt}"},
            )
        await self.client.publish(
            self.result_subject,
            json.dumps(envelope(job_id, file_id, "done", service)).encode(),
            headers={"Nats-Msg-Id": f"result:{job_id}:{attempt}"},
        )

    async def on_probe(self, msg: Msg) -> None:
        await msg.respond(b"here")


async def recording_service(url: str | list[str], ack: bool = False) -> RecordingService:
    """A RecordingService connected to `url` (or the first of a list of nodes, the others
    its way elsewhere) and subscribed to both request subjects in one queue group (close
    its client when done)."""
    if isinstance(url, list):
        # Told that its node is going away (lame-duck mode), it moves at once: a
        # connection the client closes loses nothing it sent, one the server closes can.
        moving: list[Client] = []

        async def move() -> None:
            await moving[0].force_reconnect()

        client = await nats.connect(
            url,
            dont_randomize=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            lame_duck_mode_cb=move,
        )
        moving.append(client)
    else:
        client = await nats_client(url)
    service = RecordingService(client, ack=ack)
    for subject in REQUEST_SUBJECTS:
        await service.client.subscribe(subject, queue=SERVICE_QUEUE, cb=service.on_request)
    # Last: an answer to the probe from another node proves the SUBs above reached it too
    # (one connection's subscriptions travel a route in order).
    await service.client.subscribe("cluster.probe", queue="probe", cb=service.on_probe)
    await service.client.flush()
    return service


async def wait_interest(url: str, within: float = 15) -> None:
    """Waits until a request on cluster.probe sent to the node at `url` is answered: the
    services' subscriptions have reached that node."""
    client = await nats_client(url)
    try:

        async def answered() -> bool:
            try:
                await client.request("cluster.probe", b"?", timeout=0.5)
            except Exception:  # no responders yet, or timeout: ask again
                return False
            return True

        await wait_for(answered, within, f"services' interest reached {url}")
    finally:
        await client.close()


async def close_all(services: list[RecordingService]) -> None:
    for service in services:
        for task in service._answering:
            task.cancel()
    await asyncio.gather(*(s.client.close() for s in services), return_exceptions=True)


def stream_leader(cluster: EmbeddedNatsCluster, stream: str) -> str | None:
    """The server name of the leader of JetStream stream `stream`, as a running node's
    /jsz sees it (None when no node names one)."""
    for index in range(cluster.size):
        if not cluster.running(index):
            continue
        port = cluster.monitor_ports[index]
        try:
            url = f"http://127.0.0.1:{port}/jsz?accounts=true&streams=true"
            with urllib.request.urlopen(url, timeout=2) as resp:
                jsz = json.loads(resp.read())
        except (OSError, ValueError):
            continue
        for account in jsz.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    leader = (detail.get("cluster") or {}).get("leader")
                    if leader:
                        return str(leader)
    return None


async def move_stream_leader(cluster: EmbeddedNatsCluster, stream: str, to: int) -> None:
    """Makes node `to` the leader of `stream` (a step-down with that node preferred, as
    often as it takes) and waits until every node says so."""
    name = cluster.name(to)
    client = await nats_client(cluster.nodes[to].url())
    try:
        await wait_for(lambda: stream_leader(cluster, stream) is not None, 30, "a leader")

        async def led_by_it() -> bool:
            if stream_leader(cluster, stream) == name:
                return True
            request = json.dumps({"placement": {"preferred": name}}).encode()
            try:
                await client.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request, 2)
            except Exception:  # the election under way: ask again
                return False
            return False

        await wait_for(led_by_it, 60, f"{stream} led by {name}")
    finally:
        await client.close()


def stream_replicas(cluster: EmbeddedNatsCluster, stream: str) -> dict[str, bool]:
    """Per server name of `stream`'s leader and replicas, as the leader's node reports
    them in /jsz: True for the leader and for a replica that is current (has every
    message)."""
    leader = stream_leader(cluster, stream)
    if leader is None:
        return {}
    index = next(i for i in range(cluster.size) if cluster.name(i) == leader)
    url = f"http://127.0.0.1:{cluster.monitor_ports[index]}/jsz?accounts=true&streams=true"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            jsz = json.loads(resp.read())
    except (OSError, ValueError):
        return {}
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                found = (detail.get("cluster") or {}).get("replicas") or []
                return {leader: True} | {r["name"]: bool(r.get("current")) for r in found}
    return {}


async def stream_whole(cluster: EmbeddedNatsCluster, stream: str, within: float = 60) -> None:
    """Waits until every node holds a current copy of `stream` (after a node's restart:
    it has caught up), so that the next planned restart leaves a quorum."""
    every = {cluster.name(i) for i in range(cluster.size)}

    def whole() -> bool:
        replicas = stream_replicas(cluster, stream)
        return set(replicas) == every and all(replicas.values())

    await wait_for(
        whole, within, lambda: f"{stream} current on every node: {stream_replicas(cluster, stream)}"
    )


async def start_bridge(stack: Stack, cluster: EmbeddedNatsCluster, **env: Any) -> ArmProcess:
    """`arm-core bridge` with NATS_URL listing every node, once healthy (waited on
    without blocking the loop the test's services run in)."""
    port = free_port()
    bridge = stack.start("bridge", BRIDGE_HEALTH_PORT=port, NATS_URL=cluster.url(), **env)

    async def healthy() -> bool:
        body = await asyncio.to_thread(bridge.health, port)
        return body is not None and body.get("status") == "ok"

    await wait_for(healthy, 30, lambda: f"bridge healthy: {bridge.log()[-2000:]}")
    return bridge


async def reference_on_stream(
    stack: Stack, cluster: EmbeddedNatsCluster, stream: str, **env: Any
) -> ArmProcess:
    """The real `arm-core reference` on every node (NATS_URL), 50 ms per file unless
    `env` says otherwise, once both its services have found `stream` and answer through
    JetStream publish."""
    reference = stack.reference(
        **{"NATS_URL": cluster.url(), "REFERENCE_DELAY_SECONDS": 0.05, **env}
    )
    await wait_for(
        lambda: len(log_lines(reference.log(), action="ref_stream")) >= 2,
        30,
        lambda: f"the reference publishing through {stream}: {reference.log()[-2000:]}",
    )
    return reference
