"""End-to-end: `arm-core serve` / `bridge` / `reference` as subprocesses, as users run
them, against a real PostgreSQL and a real nats-server on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arm_core.devtools.embedded import EmbeddedNats
from tests.support.stack import Stack


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    nats_server = EmbeddedNats(log_dir=tmp_path / "nats").start()
    s = Stack(db_url=db_url, nats=nats_server, tmp=tmp_path, results=tmp_path / "results")
    try:
        yield s
    finally:
        for proc in s.procs:
            if proc.proc.poll() is None:
                proc.kill()
        nats_server.stop()
