"""deploy/nats/nats-server.conf, the NATS cluster example: nats-server accepts it (with
either permissions file beside it, as the example says; its TLS files' paths replaced by
files of the test's, as tests/support/shipped_nats.py does), and it names what
docs/high-availability.md relies on: JetStream writing each message to disk before
acknowledging it, three routes, a lame-duck grace, TLS for the clients, the stream's
permissions. tests/deploy/test_shipped_examples.py runs it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from arm_core.devtools.embedded_nats import nats_binary
from tests.support.natsauth import user_nkey
from tests.support.shipped_nats import (
    CORE_PERMISSIONS,
    SERVER_CONF,
    STREAM_PERMISSIONS,
    USERS,
    node_config,
)
from tests.support.tls import Pki


def write_node(directory: Path, shipped: str, permissions: Path) -> None:
    pki = Pki(directory / "pki")
    config = node_config(
        shipped,
        client=4222,
        monitor=8222,
        route=6222,
        routes=[6222, 6223, 6224],
        store_dir=directory / "jetstream",
        server=pki.issue("nats-server", "127.0.0.1"),
        ca=pki.ca_file,
    )
    (directory / "nats-server.conf").write_text(config, encoding="utf-8")
    (directory / "nats-permissions.conf").write_bytes(permissions.read_bytes())


def check(directory: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`nats-server -c nats-server.conf -t` in `directory`, as node `name`, the users'
    public keys in its environment."""
    keys = {user: user_nkey()[1] for user in USERS}
    env = {**os.environ, "NATS_SERVER_NAME": name, **keys}
    return subprocess.run(
        [nats_binary(), "-c", str(directory / "nats-server.conf"), "-t"],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    "permissions", [STREAM_PERMISSIONS, CORE_PERMISSIONS], ids=lambda p: p.name
)
def test_nats_server_accepts_the_example_with_the_permissions_beside_it(
    tmp_path: Path, permissions: Path
) -> None:
    write_node(tmp_path, SERVER_CONF.read_text(encoding="utf-8"), permissions)
    done = check(tmp_path, "nats-1")
    assert done.returncode == 0 and "is valid" in done.stderr, done


def test_a_broken_example_is_refused(tmp_path: Path) -> None:
    """The check above can fail: a misspelt block is an error to nats-server -t."""
    text = SERVER_CONF.read_text(encoding="utf-8").replace("jetstream {", "jetstreem {", 1)
    write_node(tmp_path, text, STREAM_PERMISSIONS)
    assert check(tmp_path, "nats-1").returncode != 0


def test_the_rewrite_fails_on_a_changed_line_it_would_replace() -> None:
    """A shipped line the test cannot find is a failure, never a line left as shipped
    (a node on port 4222 of the machine) or a line replaced twice."""
    shipped = SERVER_CONF.read_text(encoding="utf-8")
    for changed in (
        shipped.replace("\nport: 4222", "\nport: 4223"),
        shipped.replace('"nats-route://nats-2:6222"', '"nats-route://nats-2:6223"'),
        shipped + "http_port: 8222\n",
    ):
        with pytest.raises(AssertionError, match=r"deploy/nats/nats-server\.conf changed"):
            node_config(
                changed, client=1, monitor=2, route=3, routes=[3, 4, 5],
                store_dir=Path("/x"), server=None, ca=Path("/x"),
            )  # fmt: skip


def test_the_example_is_a_three_node_jetstream_cluster_that_syncs_every_message() -> None:
    text = "\n".join(
        line for line in SERVER_CONF.read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("#")
    )  # fmt: skip
    jetstream = re.search(r"^jetstream \{(?P<body>[^}]*)\}", text, re.M)
    assert jetstream is not None
    assert re.search(r"^\s*sync_interval: always$", jetstream["body"], re.M)
    assert len(re.findall(r'"nats-route://nats-[123]:6222"', text)) == 3
    assert re.search(r'^lame_duck_grace_period: "\d+s"', text, re.M)
    assert re.search(r"^server_name: \$NATS_SERVER_NAME$", text, re.M)
    # The clients' TLS, which the arm-core examples' tls:// URLs need.
    assert re.search(r"^tls \{", text, re.M)
    assert re.search(r'^include "nats-permissions.conf"$', text, re.M)
    assert "authorization" not in text  # only the included file's
