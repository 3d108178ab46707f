"""What only the tests use, beside the testbed they share with the benchmarks
(arm_core.devtools.testbed: real servers and processes, SQL as upstream and a DBA write
it, faults, the nemesis):

- bridge: a bridge in the test's own event loop, with short periods
- api: the aiohttp app on real sockets
- steps, stream, flow: the bridge's loops driven step by step, the results stream, a
  steady flow with its outcome
- natsauth, tls, shipped_nats: operator-mode credentials, certificates, the shipped NATS
  examples run for real
- compose, deploy_examples: compose.yaml and the deploy examples as their tools read them
- databases, previous_release: cloned databases, the previous release's wheel
- ci_skips: under CI=true a skipped test fails the run (a pytest plugin)

Fixtures stay in the conftest.py files; these are plain modules. Nothing outside tests/
imports them (pyproject.toml [tool.importlinter])."""
