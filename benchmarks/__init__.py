"""`make bench`: throughput and latency figures of arm-core, each printed next to a
reference measured in the same run on the same PostgreSQL cluster.

The machine a benchmark runs on varies two-fold from run to run, so only ratios hold:
every section starts from fresh databases on one embedded PostgreSQL and one embedded
nats-server (free loopback ports, temporary folders, removed at the end), runs
`arm-core bridge` / `arm-core serve` as real subprocesses, and prints one table (also
written to docs/benchmarks.md). There are no timed asserts: it prints what it measured.

`python -m benchmarks --help` lists the sections (`--only` takes their names).
"""
