"""Test support shared by every test package and by the benchmark (benchmarks/):

- sql: plain-SQL uploads and arm.* calls, as upstream and a DBA would make them
- processes: `arm-core` as a real subprocess, its log in a file, health polled
- natsauth: operator-mode (JWT) credentials for a real nats-server
- bridge: condition waits, a NATS collector, a TCP proxy, envelope builders
- api: the aiohttp app on real sockets
- stack: `arm-core` processes against one PostgreSQL and one nats-server (e2e)

Fixtures stay in the conftest.py files; these are plain modules.
"""
