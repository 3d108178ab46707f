"""free_port (arm_core.devtools.embedded): the ports the suite's servers are started on
come from a range below the kernel's ephemeral ports, one of each pytest-xdist worker's
own (ARM_CORE_PORTS, set by tests/conftest.py), are free when handed out, and are not
handed out again before the range has gone round."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from arm_core.devtools import embedded
from arm_core.devtools.embedded import free_port


@pytest.fixture
def ports(monkeypatch: pytest.MonkeyPatch) -> Iterator[range]:
    """A small range of this test's own (the cached range is read again after): above
    the default range and every worker's slice, below the ephemeral ports. The module's
    tests run one after another (its xdist group), as they bind these ports."""
    low = 32100
    monkeypatch.setenv("ARM_CORE_PORTS", f"{low}-{low + 9}")
    embedded._port_range.cache_clear()
    try:
        yield range(low, low + 10)
    finally:
        monkeypatch.undo()
        embedded._port_range.cache_clear()


def test_ports_come_from_the_range_and_not_twice_before_it_went_round(ports: range) -> None:
    handed = [free_port() for _ in range(len(ports))]
    assert set(handed) <= set(ports)
    assert len(set(handed)) == len(handed)  # ten in a row, ten different


def test_a_port_in_use_is_passed_over(ports: range) -> None:
    taken = []
    try:
        for port in ports[:9]:
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            taken.append(sock)
        assert {free_port() for _ in range(5)} == {ports[9]}
    finally:
        for sock in taken:
            sock.close()


def test_a_full_range_says_so(ports: range) -> None:
    taken = []
    try:
        for port in ports:
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            taken.append(sock)
        with pytest.raises(RuntimeError, match=f"no free TCP port on 127.0.0.1 in {ports[0]}-"):
            free_port()
    finally:
        for sock in taken:
            sock.close()


def test_the_default_range_is_below_the_kernels_ephemeral_ports() -> None:
    first, last = embedded._DEFAULT_PORTS
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        ephemeral_low = int(fh.read().split()[0])
    assert 1024 < first < last < ephemeral_low
