"""`arm-core healthcheck`: the container's HEALTHCHECK, with nothing but Python
(docs/containers.md). It asks the running `serve` (HTTP_PORT) or `bridge`
(BRIDGE_HEALTH_PORT), named as the argument or read from PID 1, for its own GET /livez
(or /readyz), reading the same environment."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from arm_core.config import Settings
from arm_core.tls import own_certificate_context

CHECKED = ("serve", "bridge")
UNCHECKED = ("migrate", "reference", "dev")
TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True)
class Probe:
    healthy: bool
    detail: str


def running_command(cmdline: Path = Path("/proc/1/cmdline")) -> str | None:
    """The word after an `arm-core` argument of PID 1's argv, whatever runs it (an init
    such as `podman run --init`)."""
    try:
        argv = cmdline.read_bytes().split(b"\0")
    except OSError:
        return None
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
    for i, word in enumerate(words[:-1]):
        if word == "arm-core":
            return words[i + 1]
    return None


def health_url(settings: Settings, command: str, path: str = "/livez") -> str:
    host = settings.http_host
    if host in ("", "0.0.0.0", "::"):  # every interface: loopback is one of them
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    port = settings.http_port if command == "serve" else settings.bridge_health_port
    scheme = "https" if settings.http_tls_cert_file else "http"
    return f"{scheme}://{host}:{port}{path}"


def probe(settings: Settings, command: str, ready: bool = False) -> Probe:
    """GET /livez (/readyz when `ready`) of the running command: healthy on a 200."""
    url = health_url(settings, command, "/readyz" if ready else "/livez")
    https = url.startswith("https:")
    try:
        # Over HTTPS it trusts exactly the process's own certificate (HTTP_TLS_CERT_FILE).
        context = own_certificate_context(settings.http_tls_cert_file) if https else None
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS, context=context) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:  # 503: not alive (not ready)
        return Probe(False, f"{url}: {exc.code} {exc.read().decode(errors='replace')}")
    except (OSError, ValueError) as exc:
        return Probe(False, f"{url}: no answer ({type(exc).__name__}: {exc})")
    return Probe(True, f"{url}: {body.decode(errors='replace')}")
