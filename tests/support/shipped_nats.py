"""deploy/nats/ as shipped, run for real: :class:`ShippedNatsCluster` is three nodes of
nats-server.conf with the permissions file beside it, as docs/high-availability.md says
to run them. Each node gets a copy of the shipped file in which :func:`node_config`
changes only what one machine running three nodes must: the ports, the store directory,
the routes' addresses and the TLS files' paths — each a whole line, matched exactly once,
so a changed shipped line fails the rewrite instead of slipping past it. The permissions
file is copied unchanged; the users' public nkeys and the server's name are in the
node's environment, as the shipped file allows."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from arm_core.devtools.embedded_nats import EmbeddedNats, EmbeddedNatsCluster
from tests.support.natsauth import user_nkey
from tests.support.tls import Pair

ROOT = Path(__file__).resolve().parents[2]
NATS_DIR = ROOT / "deploy" / "nats"
SERVER_CONF = NATS_DIR / "nats-server.conf"
# The results stream's permissions, which nats-server.conf includes, and core NATS's.
STREAM_PERMISSIONS = NATS_DIR / "nats-permissions.conf"
CORE_PERMISSIONS = NATS_DIR / "nats-permissions-core.conf"
USERS = ("ARM_CORE_NKEY", "TABULAR_PARSER_NKEY", "SCAN_GATEWAY_NKEY")


def node_config(
    shipped: str,
    *,
    client: int,
    monitor: int,
    route: int,
    routes: list[int],
    store_dir: Path,
    server: Pair | None,
    ca: Path,
) -> str:
    """The shipped nats-server.conf with these lines, and only these, replaced (their
    indentation kept): every other line, the `include` of the permissions among them, is
    the shipped one."""
    hosts = [f'"nats-route://nats-{i}:6222"' for i in (1, 2, 3)]
    replace = {
        "port: 4222": f"port: {client}",
        "http_port: 8222": f"http_port: {monitor}",
        'store_dir: "/var/lib/nats/jetstream"': f'store_dir: "{store_dir}"',
        "port: 6222": f"port: {route}",
        **{
            host: f'"nats-route://127.0.0.1:{port}"'
            for host, port in zip(hosts, routes, strict=True)
        },
        'cert_file: "/etc/nats/tls/server.crt"': f'cert_file: "{server and server.cert}"',
        'key_file:  "/etc/nats/tls/server.key"': f'key_file:  "{server and server.key}"',
        'ca_file:   "/etc/nats/tls/ca.crt"': f'ca_file:   "{ca}"',
    }
    used: dict[str, int] = dict.fromkeys(replace, 0)
    out = []
    for line in shipped.splitlines(keepends=True):
        stripped = line.strip()
        if stripped in replace:
            used[stripped] += 1
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}{replace[stripped]}\n"
        out.append(line)
    wrong = {old: n for old, n in used.items() if n != 1}
    if wrong:
        raise AssertionError(f"deploy/nats/nats-server.conf changed: not once each: {wrong}")
    return "".join(out)


@dataclass
class ShippedNatsCluster(EmbeddedNatsCluster):
    """Three nodes named as the shipped file's routes name them (nats-1, nats-2, nats-3),
    each running :func:`node_config` of the shipped file with `permissions` copied beside
    it as nats-permissions.conf. The clients connect with TLS (`server`, signed by `ca`)
    as :attr:`public_keys`' users, whose seeds are :attr:`seeds`."""

    server: Pair | None = None
    ca: Path | None = None
    permissions: Path = STREAM_PERMISSIONS
    seeds: dict[str, str] = field(default_factory=dict, init=False)
    public_keys: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.jetstream = True  # the shipped file's; _unformed then waits for the meta leader
        for name in USERS:
            self.seeds[name], self.public_keys[name] = user_nkey()

    def name(self, index: int) -> str:
        return f"nats-{index + 1}"

    def tls_urls(self) -> list[str]:
        return [f"tls://127.0.0.1:{node.port}" for node in self.nodes]

    def _node(self, index: int, client: int, route: int, monitor: int, seed: str) -> EmbeddedNats:
        assert self.server is not None and self.ca is not None
        directory = self._base() / self.name(index)
        directory.mkdir(parents=True, exist_ok=True)
        config = node_config(
            SERVER_CONF.read_text(encoding="utf-8"),
            client=client,
            monitor=monitor,
            route=route,
            routes=self.cluster_ports,
            store_dir=directory / "jetstream",
            server=self.server,
            ca=self.ca,
        )
        (directory / "nats-server.conf").write_text(config, encoding="utf-8")
        shutil.copyfile(self.permissions, directory / "nats-permissions.conf")
        return EmbeddedNats(
            binary=self.binary,
            port=client,
            log_dir=directory,
            extra_args=["-c", str(directory / "nats-server.conf")],
            env={"NATS_SERVER_NAME": self.name(index), **self.public_keys},
        )
