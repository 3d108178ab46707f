"""A cluster of real nats-servers, :class:`EmbeddedNatsCluster`: ``size`` nodes
(:class:`~arm_core.devtools.embedded_nats_server.EmbeddedNats`) on free loopback ports,
routed to each other, optionally with JetStream, and watched through their monitoring
endpoints (``/routez``, ``/jsz``, ``/healthz``, ``/connz``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from arm_core.devtools.embedded import Server, free_port, log_tail
from arm_core.devtools.embedded_nats_server import EmbeddedNats, nats_binary

__all__ = ["EmbeddedNatsCluster"]


def _monitor_json(port: int, path: str) -> dict[str, object] | None:
    """GET http://127.0.0.1:<port><path> of a nats-server's monitoring listener, or None
    when it does not answer (yet) or answers something else than a JSON object."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            loaded = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


class ClusterNotFormed(RuntimeError):
    """The cluster's nodes run but have not all joined it within the timeout."""


@dataclass
class EmbeddedNatsCluster(Server):
    """``size`` nats-server nodes (``n1``, ``n2``, …) clustered over loopback routes, on
    free ports: client, route and monitoring (``-m``) port per node. :meth:`start`
    returns when every running node has a route to every other one (``/routez``) and,
    with ``jetstream``, when every node knows the meta leader and says it is healthy
    (``/jsz``, ``/healthz``). A client lists :meth:`urls` (``url()`` is the NATS_URL
    form, comma-separated); :meth:`node_of` finds the node a client is connected to by
    its name (``/connz``); :meth:`kill` is ``kill -9`` of one node, :meth:`lame_duck`
    its planned shutdown, and :meth:`start_node` brings it back on the same ports.

    ``lame_duck_grace`` (seconds) is each node's ``lame_duck_grace_period``: how long a
    node in lame-duck mode waits before it starts closing its clients (nats-server's
    default: 10 s). The duration stays nats-server's minimum, 30 s, spread over the
    clients at most 1 s apart: a node with few clients is gone within seconds."""

    size: int = 3
    base_dir: Path | None = None
    jetstream: bool = False
    cluster_name: str = "arm"
    binary: str | None = None
    extra_args: list[str] = field(default_factory=list)
    lame_duck_grace: float = 1.0
    # JetStream's sync_interval: `always` writes each message to disk (fsync) before the
    # stream acknowledges it, as deploy/nats/nats-server.conf does; nats-server's own
    # default (None here) syncs every 2 minutes: a power loss loses what it stored since.
    sync_interval: str | None = "always"
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

    def _node(self, index: int, client: int, route: int, monitor: int, seed: str) -> EmbeddedNats:
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
        args += ["-routes", seed]
        if self.jetstream:
            args += ["-js", "-sd", str(log_dir / "jetstream")]
        # Lame-duck timings and JetStream's sync_interval exist only as configuration-file
        # options; the flags above and the node's own (port, log) take precedence over
        # anything in it.
        log_dir.mkdir(parents=True, exist_ok=True)
        config = log_dir / "node.conf"
        config.write_text(
            f'lame_duck_duration: "30s"\nlame_duck_grace_period: "{self.lame_duck_grace}s"\n'
            + (
                f"jetstream {{ sync_interval: {self.sync_interval} }}\n"
                if self.jetstream and self.sync_interval is not None
                else ""
            )
        )
        args = ["-c", str(config), *args]
        return EmbeddedNats(
            binary=self.binary,
            port=client,
            log_dir=log_dir,
            extra_args=[*args, *self.extra_args],
        )

    def start(self, timeout: float = 30.0) -> EmbeddedNatsCluster:
        """Start every node and wait until the cluster has formed. A port taken between
        choosing it and binding it, or a cluster that did not form, is retried with
        fresh ports (three times in all)."""
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
            # A seed shape: every node's one route is n1 (n1 sees its own and drops it; a
            # JetStream cluster wants a route configured on every node); n1 tells each
            # node that joins about the others, and they dial it, one side per pair.
            # When every node dials every other, two nodes dialling each other at once
            # may both close the route as a duplicate, and neither dials again.
            seed = f"nats://127.0.0.1:{self.cluster_ports[0]}"
            self.nodes = [
                self._node(i, clients[i], self.cluster_ports[i], self.monitor_ports[i], seed)
                for i in range(self.size)
            ]
            try:
                for node in self.nodes:
                    node.start(timeout)
                self.wait_formed(timeout)
                return self
            except ClusterNotFormed as exc:
                # Not seen since the seed shape; should it happen, the timeout's message
                # names what each node lacks, and a fresh start with emptied stores follows.
                self.stop()
                for node in self.nodes:
                    if node.log_dir is not None:
                        shutil.rmtree(node.log_dir / "jetstream", ignore_errors=True)
                last = exc
            except RuntimeError as exc:
                self.stop()
                if "address already in use" not in str(exc):
                    raise
                last = exc
        raise RuntimeError(f"could not start a {self.size}-node NATS cluster: {last}")

    def _unformed(self, index: int) -> str | None:
        """Why node ``index`` has not joined the cluster yet (None: it has)."""
        port = self.monitor_ports[index]
        routez = _monitor_json(port, "/routez")
        routes = routez.get("routes") if routez is not None else None
        if not isinstance(routes, list):
            return "no /routez answer"
        remote = {route.get("remote_name") for route in routes if isinstance(route, dict)}
        others = {self.name(j) for j in range(self.size) if j != index and self.running(j)}
        if not others <= remote:
            return f"no route to {', '.join(sorted(others - remote))}"
        if not self.jetstream:
            return None
        jsz = _monitor_json(port, "/jsz")
        meta = jsz.get("meta_cluster") if jsz is not None else None
        if not isinstance(meta, dict) or not meta.get("leader"):
            return "no JetStream meta leader"
        healthz = _monitor_json(port, "/healthz")
        status = healthz.get("status") if healthz is not None else None
        return None if status == "ok" else f"/healthz says {status or 'nothing'}"

    def wait_formed(self, timeout: float = 30.0) -> None:
        """Wait until every running node routes to every other running node (and, with
        JetStream, knows the meta leader and is healthy); ClusterNotFormed past
        `timeout`, naming what each node still lacks."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = {
                self.name(i): why
                for i in range(self.size)
                if self.running(i) and (why := self._unformed(i)) is not None
            }
            if not waiting:
                return
            if time.monotonic() >= deadline:
                logs = "\n".join(
                    f"--- {self.nodes[i].log_path} ---\n{log_tail(self.nodes[i].log_path, 15)}"
                    for i in range(self.size)
                )
                lacks = "; ".join(f"{name}: {why}" for name, why in waiting.items())
                raise ClusterNotFormed(
                    f"NATS cluster not formed after {timeout:.0f} s ({lacks})\n{logs}"
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

    def lame_duck(self, index: int, within: float = 60.0) -> float:
        """The planned shutdown of node ``index``: ``nats-server --signal ldm=<pid>``,
        as an operator types it. The node stops accepting clients, hands the leadership
        of its JetStream assets to other nodes, closes its clients one by one and exits;
        returns once it has, with the seconds it took."""
        node = self.nodes[index]
        proc = node._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"node {self.name(index)} is not running")
        started = time.monotonic()
        binary = self.binary or nats_binary()
        subprocess.run(
            [binary, "--signal", f"ldm={proc.pid}"], check=True, capture_output=True, timeout=10
        )
        try:
            proc.wait(timeout=within)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(
                f"node {self.name(index)} still running {within:.0f} s after lame-duck mode"
            ) from exc
        node._proc = None
        return time.monotonic() - started

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

    def release(self) -> None:
        if self._own_base_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
            self._own_base_dir = False
