"""`arm-core healthcheck` finds the command to check in PID 1's argv, whether arm-core
is PID 1 itself (the image's ENTRYPOINT) or runs under an init (`podman run --init`)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from arm_core.config import Settings
from arm_core.healthcheck import health_url, probe, running_command


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


def test_ready_probes_readyz_and_live_probes_livez() -> None:
    """`arm-core healthcheck --ready` asks /readyz; without it, /livez (a real HTTP server
    that is alive and not ready, as a process whose database is away)."""

    class Alive(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/livez" else 503
            self.send_response(code)
            self.end_headers()
            self.wfile.write(self.path.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Alive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings = Settings(http_host="127.0.0.1", http_port=server.server_address[1])
        live, ready = probe(settings, "serve"), probe(settings, "serve", ready=True)
    finally:
        server.shutdown()
        server.server_close()
    assert live.healthy and live.detail.endswith("/livez: /livez"), live
    assert not ready.healthy and "/readyz: 503" in ready.detail, ready
