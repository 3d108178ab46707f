"""The testbed the tests (tests/) and the benchmarks (benchmarks/) share: real servers
and processes, driven and faulted as a test or a measurement needs. Neither imports the
other; both import this (pyproject.toml [tool.importlinter] checks it).

- polling: the one way to wait for a condition, with a deadline
- sql: uploads and arm.* calls as upstream and a DBA make them, and the logins of the
  roles
- processes: `arm-core` as a real subprocess (ArmProcess), and a Stack of them against one
  PostgreSQL and one nats-server
- services, proxies: the recognition services' side of NATS (envelopes, a collector, an
  instant service); TCP proxies that cut a connection or hold it at a message
- cluster, replication: a NATS cluster's nodes and streams; a PostgreSQL primary and its
  standby
- faults, nemesis: faults (iptables black holes, counts that survive an outage) and the
  seeded fault schedules with their history checker
- pgbouncer, plans, images: a real PgBouncer, statement plans from auto_explain, the
  container images under test

Like the rest of arm_core.devtools, the runtime never imports it."""
