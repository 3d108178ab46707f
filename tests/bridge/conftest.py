"""Fixtures with a real nats-server started by the suite on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from arm_core.embedded import EmbeddedNats
from tests.bridge.support import nats_client


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(log_dir=tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def client(nats_server: EmbeddedNats) -> AsyncIterator[Client]:
    """The test's own NATS connection: plays the recognition services."""
    nc = await nats_client(nats_server.url())
    try:
        yield nc
    finally:
        await nc.close()
