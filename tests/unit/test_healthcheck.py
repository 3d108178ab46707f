"""`arm-core healthcheck` finds the command to check in PID 1's argv, whether arm-core
is PID 1 itself (the image's ENTRYPOINT) or runs under an init (`podman run --init`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arm_core.config import Settings
from arm_core.healthcheck import health_url, running_command


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["/opt/arm-core/bin/python3", "/opt/arm-core/bin/arm-core", "bridge"], "bridge"),
        (["/run/podman-init", "--", "arm-core", "serve"], "serve"),
        (["/sbin/init"], None),
        (["arm-core"], None),
    ],
)
def test_the_command_is_read_from_pid_1(tmp_path: Path, argv: list[str], command: str) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    assert running_command(cmdline) == command


def test_no_proc_no_command(tmp_path: Path) -> None:
    assert running_command(tmp_path / "absent") is None


def test_every_interface_is_probed_on_loopback() -> None:
    settings = Settings(http_host="0.0.0.0", http_port=8080, bridge_health_port=9000)
    assert health_url(settings, "serve") == "http://127.0.0.1:8080/livez"
    assert health_url(settings, "bridge", "/readyz") == "http://127.0.0.1:9000/readyz"
    assert health_url(Settings(http_host="::1"), "serve") == "http://[::1]:8080/livez"
