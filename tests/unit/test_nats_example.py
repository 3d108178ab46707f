"""deploy/nats/nats-server.conf, the NATS cluster example: nats-server accepts it as it
stands (with the permissions file beside it, as the example says), and it names what
docs/high-availability.md relies on: JetStream, three routes, a lame-duck grace."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from arm_core.devtools.embedded_nats import nats_binary
from tests.support.natsauth import nkey_users

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "nats" / "nats-server.conf"
PERMISSIONS = ROOT / "docs" / "nats-permissions.conf"


def check(directory: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`nats-server -c nats-server.conf -t` in `directory`, as node `name`."""
    env = {**os.environ, "NATS_SERVER_NAME": name}
    return subprocess.run(
        [nats_binary(), "-c", str(directory / "nats-server.conf"), "-t"],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_nats_server_accepts_the_example_with_the_permissions_beside_it(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "nats-server.conf")
    users = nkey_users(PERMISSIONS.read_text(encoding="utf-8"))
    (tmp_path / "nats-permissions.conf").write_text(users.server_config, encoding="utf-8")
    done = check(tmp_path, "nats-1")
    assert done.returncode == 0 and "is valid" in done.stderr, done


def test_a_broken_example_is_refused(tmp_path: Path) -> None:
    """The check above can fail: a misspelt block is an error to nats-server -t."""
    text = EXAMPLE.read_text(encoding="utf-8").replace("jetstream {", "jetstreem {", 1)
    (tmp_path / "nats-server.conf").write_text(text, encoding="utf-8")
    users = nkey_users(PERMISSIONS.read_text(encoding="utf-8"))
    (tmp_path / "nats-permissions.conf").write_text(users.server_config, encoding="utf-8")
    assert check(tmp_path, "nats-1").returncode != 0


def test_the_example_is_a_three_node_jetstream_cluster_with_a_lame_duck_grace() -> None:
    text = "\n".join(
        line for line in EXAMPLE.read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("#")
    )  # fmt: skip
    assert re.search(r"^jetstream \{", text, re.M)
    assert len(re.findall(r'"nats-route://nats-[123]:6222"', text)) == 3
    assert re.search(r'^lame_duck_grace_period: "\d+s"', text, re.M)
    assert re.search(r"^server_name: \$NATS_SERVER_NAME$", text, re.M)
