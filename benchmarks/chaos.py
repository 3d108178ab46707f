"""`python -m benchmarks.chaos [--quick]` (what `make chaos` runs): faults against real
processes, and what each cost. A row whose configuration the docs call lossless (the
results stream with services publishing through JetStream, a synchronous standby, no
fault) that loses, applies twice or leaves stuck anything makes the run exit 1: a
broken promise; the other rows measure a documented limit and only report.

`--nemesis --seeds N` runs the nemesis instead (src/arm_core/devtools/testbed/nemesis.py): N seeded
schedules of random faults over a steady flow, each checked against the whole history;
exit 1 when any seed breaks a promise (its seed is printed, to be given back with
`--first-seed S --seeds 1`).

Every fault runs on a fresh, migrated database of one embedded PostgreSQL (with
`synchronous_commit=on` for the database, as in production: the embedded server's `off`
lets a crash lose commits already reported) and one nats-server (JetStream enabled, used
only where RESULTS_STREAM is set). `arm-core bridge` processes and the real reference
service (`arm-core reference`, 50 ms per file, both services) run as subprocesses, as
users run them. The uploads are queued at once (plain SQL, one transaction); the fault
lands once a fifth of the answers are applied, i.e. mid-burst.

The failover faults run on a primary and a streaming standby of their own
(arm_core.devtools.testbed.replication: `pg_basebackup -R`; synchronous: the primary names the
standby in `synchronous_standby_names`), every process with one multi-host
DATABASE_URL (`target_session_attrs=read-write`). The fault: kill -9 of every process of
the primary (its machine dies), 3 s without a writable host (what a failover tool takes
to decide), then `pg_ctl promote` of the standby. With asynchronous replication an
answer the primary applied in its last moments may never reach the standby: its job is
back to `processing` there, the service has acked the message, and the job waits for
its reply deadline — counted lost.

The NATS cluster faults run on three nats-server nodes of their own (JetStream, routes
over loopback, `lame_duck_grace_period` 1 s), every process with NATS_URL listing all
three, RESULTS_STREAM with 3 replicas. The reference service answers through JetStream
publish (each answer waits for the stream's PubAck and is sent again until it gets one)
or, with `REFERENCE_PUBLISH=core`, with core NATS, as a service that has not adopted it;
the bridges keep what core NATS brings them for 15 s and apply it again when the stream
elects a leader (bridge/replay.py), except in the row that turns it off.
The faults: kill -9 of the node that leads the stream (the fault lasts until the two
others have elected a new leader; the node stays down), and a lame-duck rolling restart
(`nats-server --signal ldm=<pid>` of each node in turn, started again once it has
exited, the next once the stream is current on it again). Their uploads come as a
steady flow (5 every 50 ms) rather than at once: answers are on their way when the fault
lands.

Per fault:

- **fault**: seconds from injecting the fault until it ends: the process or server back,
  the promotion done, the stream's new leader elected (a kill that nothing follows: 0);
- **lost**: jobs that did not end `done` (an answer that never reached the database
  leaves its job `processing` until the reply deadline, 120 s here, then `timeout`; a lost request
  is republished after ACK_TIMEOUT_SECONDS, 30 s, before that);
- **applied twice**: result objects beyond one per job in the database, or a job the
  bridges' logs (DEBUG, a line per envelope applied) name as applied more than once;
- **sent twice**: requests seen twice with one `Nats-Msg-Id` by an observer subscribed
  to the request subjects (a republish after ACK_TIMEOUT_SECONDS counts too);
- **stuck**: jobs still `queued`, `published` or `processing` when the run gives up
  (reply deadline + 90 s after the fault);
- **recover**: seconds from the end of the fault (the process or server back; the kill
  itself where nothing is restarted) until the next job reaches a final status (an
  answer applied, or a job whose answer was lost swept to `timeout`);
- **drain**: seconds from the fault until no job is live."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import psycopg
from nats.aio.msg import Msg

from arm_core.devtools.embedded_nats import EmbeddedNats, EmbeddedNatsCluster
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed import nemesis
from arm_core.devtools.testbed.cluster import stream_leader, stream_whole
from arm_core.devtools.testbed.faults import by_status, iptables_missing
from arm_core.devtools.testbed.polling import NotWithin, wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack, listening, log_lines
from arm_core.devtools.testbed.replication import Replicated, start_pair
from arm_core.devtools.testbed.sql import ensure_logins, steady_uploads, upload_many
from arm_core.migrate import migrate
from benchmarks.harness import progress
from benchmarks.report import machine

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
REPLY_TIMEOUT = 120.0
GIVE_UP_AFTER = REPLY_TIMEOUT + 90.0
LIVE = "status IN ('queued', 'published', 'processing')"
REQUEST_SUBJECTS = ("files.tabular_uploaded", "files.img_uploaded")
STREAM = "ARM_CHAOS_RESULTS"
CLUSTER = "cluster"
# The NATS cluster faults' uploads: a steady flow (100 a second, 30 s for 3,000), so
# that answers are on their way when the fault lands, as in production — a burst is
# answered within seconds and then only waits to be applied.
FLOW_CHUNK = 5
FLOW_PAUSE = 0.05


@dataclass
class Outcome:
    fault: str
    jobs: int
    # The docs call this configuration lossless (RESULTS_STREAM with JetStream-publishing
    # services, a synchronous standby, no fault at all): a loss, a double or a stuck job
    # is a broken promise, and `make chaos` fails. Otherwise the row measures a limit.
    promise: bool = False
    faults: int = 0
    fault_seconds: float | None = None
    lost: int = 0
    applied_twice: int = 0
    sent_twice: int = 0
    stuck: int = 0
    recover: float | None = None
    drain: float | None = None
    error: str | None = None


# The environment of chaos's processes over the Stack's own (testbed/processes.py).
ENV: dict[str, Any] = {
    "SCHEDULE_TICK_SECONDS": "0.5",
    # The default ACK_TIMEOUT_SECONDS (30 s) and a reply deadline of 2 minutes
    # (production: 10 or 30): a burst of 5,000 on a shared 2-core machine takes
    # tens of seconds, and shorter deadlines measure overload, not the fault.
    "ACK_TIMEOUT_SECONDS": None,
    "TABULAR_REPLY_TIMEOUT_SECONDS": str(REPLY_TIMEOUT),
    "IMAGE_REPLY_TIMEOUT_SECONDS": str(REPLY_TIMEOUT),
    "REFERENCE_DELAY_SECONDS": "0.05",
    "DEBUG": "true",  # a log line per envelope applied: the second count of doubles
}


@dataclass(kw_only=True)
class World(Stack):
    """The Stack of the run (its processes: those of the current fault) on the run's
    servers, and what only chaos has: the failover faults' primary and standby (Stack's
    `cluster`: the NATS cluster faults' three nodes), a fresh database per fault."""

    pg: EmbeddedPostgres
    pair: Replicated | None = None

    @classmethod
    def of(cls, pg: EmbeddedPostgres, nats_server: EmbeddedNats, workdir: Path) -> World:
        return cls(
            db_url="",
            nats=nats_server,
            tmp=workdir,
            results=workdir / "results",
            defaults=ENV,
            healthy_within=60,
            pg=pg,
        )

    def fresh_database(self, name: str) -> None:
        pg = self.pair.primary if self.pair else self.pg
        pg.drop_database(name)
        pg.create_database(name)
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
        self.db_url = self.pair.url(name) if self.pair else pg.url(name)
        migrate(self.db_url)
        ensure_logins(self.db_url)


def done(url: str) -> int:
    return (
        nemesis.scalar(url, "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'") or 0
    )


def final(url: str) -> int:
    return nemesis.scalar(url, f"SELECT count(*) FROM arm.recognition_job WHERE NOT ({LIVE})") or 0


class Observer:
    """Counts each request's Nats-Msg-Id on the request subjects."""

    def __init__(self) -> None:
        self.ids: Counter[str] = Counter()

    async def on_msg(self, msg: Msg) -> None:
        self.ids[(msg.headers or {}).get("Nats-Msg-Id", "")] += 1

    def twice(self) -> int:
        return sum(n - 1 for n in self.ids.values() if n > 1)


Fault = Callable[[World], Awaitable[float]]  # injects, returns when the fault ended


async def run_fault(
    world: World,
    name: str,
    jobs: int,
    bridges: int,
    fault: Fault | None,
    steady: bool = False,
    promise: bool = False,
    **env: Any,
) -> Outcome:
    """Fresh database, reference service, `bridges` bridges, `jobs` uploads (at once, or
    with `steady` as a flow); the fault once a fifth are done; then wait until nothing
    is live, and count."""
    out = Outcome(name, jobs, promise=promise)
    world.fresh_database(f"chaos_{len(name)}_{abs(hash(name)) % 10**8}")
    observer = Observer()
    nc = await nats.connect(world.nats_urls(), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        for subject in REQUEST_SUBJECTS:
            await nc.subscribe(subject, cb=observer.on_msg, pending_msgs_limit=-1)
        await nc.flush()
        # The bridges first: they make RESULTS_STREAM, which the reference service looks
        # for at its start (answers through JetStream publish where a stream captures
        # them, unless REFERENCE_PUBLISH=core).
        for _ in range(bridges):
            world.bridge(**env)
        await listening(world.reference(**env))
        if steady:
            flow: asyncio.Task[None] | None = asyncio.create_task(
                steady_uploads(world.db_url, jobs, FLOW_CHUNK, FLOW_PAUSE, mixed=True)
            )
        else:
            flow = None
            with psycopg.connect(world.db_url, autocommit=True) as conn:
                upload_many(conn, jobs, mixed=True)
        started = time.monotonic()
        if fault is not None:
            await wait_for(
                lambda: done(world.db_url) >= jobs // 5, 120, "a fifth of the answers", every=0.1
            )
            injected = time.monotonic()
            ended = await fault(world)
            out.faults = 1
            out.fault_seconds = ended - injected
            before = final(world.db_url)
            with contextlib.suppress(NotWithin):  # never recovered: out.recover stays None
                await wait_for(
                    lambda: final(world.db_url) > before or before == jobs,
                    GIVE_UP_AFTER,
                    "a job final after the fault",
                    every=0.1,
                )
                out.recover = time.monotonic() - ended
            started = injected
        if flow is not None:
            await flow
        live = f"SELECT count(*) FROM arm.recognition_job WHERE {LIVE}"
        with contextlib.suppress(NotWithin):
            await wait_for(
                lambda: nemesis.scalar(world.db_url, live) == 0,
                GIVE_UP_AFTER,
                "nothing live",
                every=0.1,
            )
            out.drain = time.monotonic() - started
        counts = by_status(world.db_url)
        out.stuck = sum(counts.get(s, 0) for s in ("queued", "published", "processing"))
        out.lost = jobs - counts.get("done", 0) - out.stuck
        extra = nemesis.scalar(
            world.db_url,
            "SELECT (SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results') "
            "- (SELECT count(*) FROM arm.recognition_job WHERE result_s3_object_id IS NOT NULL)",
        )
        applied: Counter[str] = Counter()
        for proc in world.procs:
            if proc.command == "bridge":
                for line in log_lines(proc.log(), action="result"):
                    if "result applied" in line:
                        applied[line.split(" job_id=")[1].split()[0]] += 1
        doubles = sum(1 for n in applied.values() if n > 1)
        out.applied_twice = max(extra or 0, doubles)
        await nc.flush()
        out.sent_twice = observer.twice()
    finally:
        world.stop_all()
        if "RESULTS_STREAM" in env and world.cluster is None:
            # The next fault on this server starts from no stream (and no consumer
            # holding this fault's messages).
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream(STREAM)
        await nc.close()
    return out


def bridges_of(world: World) -> list[ArmProcess]:
    return [p for p in world.procs if p.command == "bridge" and p.proc.poll() is None]


async def kill_only_bridge(world: World, **env: Any) -> float:
    victim = bridges_of(world)[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    await asyncio.sleep(3)  # the fault: no bridge for 3 s
    world.bridge(**env)
    return time.monotonic()


async def kill_one_of_two(world: World) -> float:
    victim = bridges_of(world)[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    return time.monotonic()


async def nats_stopped(world: World) -> float:
    world.nats.stop()
    await asyncio.sleep(3)
    world.nats.start()
    return time.monotonic()


async def pg_restart_fast(world: World) -> float:
    await asyncio.to_thread(world.pg.restart, "fast")
    return time.monotonic()


async def pg_stop_immediate(world: World) -> float:
    await asyncio.to_thread(world.pg.stop, "immediate")
    await asyncio.sleep(6)
    await asyncio.to_thread(world.pg.start)
    return time.monotonic()


async def primary_lost(world: World) -> float:
    pair = world.pair
    assert pair is not None
    await asyncio.to_thread(pair.primary.kill)
    await asyncio.sleep(3)  # no writable host while the failover tool decides
    await asyncio.to_thread(pair.standby.promote)
    return time.monotonic()


async def on_a_pair(
    world: World, synchronous: bool, run: Callable[[], Awaitable[Outcome]]
) -> Outcome:
    """`run` with a primary and a standby of its own as the world's database."""
    base = world.tmp / f"pair-{time.monotonic_ns()}"
    world.pair = await asyncio.to_thread(start_pair, base, synchronous)
    try:
        return await run()
    finally:
        pair, world.pair = world.pair, None
        await asyncio.to_thread(pair.destroy)


async def on_a_cluster(world: World, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """`run` with a three-node JetStream cluster of its own as the world's NATS."""
    base = world.tmp / f"cluster-{time.monotonic_ns()}"
    cluster = EmbeddedNatsCluster(size=3, base_dir=base, jetstream=True, lame_duck_grace=1)
    world.cluster = await asyncio.to_thread(cluster.start)
    try:
        return await run()
    finally:
        world.cluster = None
        await asyncio.to_thread(cluster.stop)


def leader_index(cluster: EmbeddedNatsCluster) -> int:
    leader = stream_leader(cluster, STREAM)
    return next(i for i in range(cluster.size) if cluster.name(i) == leader)


async def leader_node_killed(world: World) -> float:
    """kill -9 of the node that leads the results stream; returns once the two others
    have elected a new leader (the node stays down)."""
    cluster = world.cluster
    assert cluster is not None
    killed = leader_index(cluster)
    cluster.kill(killed)
    await wait_for(
        lambda: stream_leader(cluster, STREAM) not in (None, cluster.name(killed)),
        60,
        "a new leader",
        every=0.1,
    )
    return time.monotonic()


async def lame_duck_rolling_restart(world: World) -> float:
    """Each node in turn: lame-duck mode (nats-server --signal ldm=<pid>) until it
    exits, started again, the stream current on it again before the next."""
    cluster = world.cluster
    assert cluster is not None
    for index in range(cluster.size):
        await asyncio.to_thread(cluster.lame_duck, index)
        await asyncio.to_thread(cluster.start_node, index)
        await stream_whole(cluster, STREAM, within=120)
    return time.monotonic()


PROMISE, LIMIT = True, False


def broken(outcome: Outcome) -> bool:
    """A lossless configuration that lost, applied twice or left stuck anything, or
    could not run."""
    if outcome.error:
        return True
    return outcome.promise and bool(outcome.lost or outcome.applied_twice or outcome.stuck)


async def run_all(world: World, quick: bool, only: list[str]) -> list[Outcome]:
    scale = 5 if quick else 1

    def n(jobs: int) -> int:
        return jobs // scale

    stream = {"RESULTS_STREAM": STREAM}
    replicated = {**stream, "RESULTS_STREAM_REPLICAS": 3}
    core = {**replicated, "REFERENCE_PUBLISH": "core"}
    unreplayed = {**core, "RESULTS_STREAM_REPLAY_SECONDS": 0}
    # (fault, jobs, bridges, the fault, env, where: None (one PostgreSQL, one nats-server),
    # True/False (a replicated pair: synchronous?) or CLUSTER (three NATS nodes), and
    # whether the docs call it lossless: PROMISE fails the run on a loss, LIMIT reports)
    plan: list[tuple[str, int, int, Fault | None, dict[str, Any], bool | str | None, bool]] = [
        ("kill -9 of the only bridge mid-burst, restarted after 3 s", n(2000), 1,
         kill_only_bridge, {}, None, LIMIT),
        ("kill -9 of one of two bridges", n(2000), 2, kill_one_of_two, {}, None, LIMIT),
        ("nats-server stopped 3 s mid-burst", n(3000), 1, nats_stopped, {}, None, LIMIT),
        ("PostgreSQL restart -m fast", n(3000), 1, pg_restart_fast, {}, None, LIMIT),
        ("PostgreSQL stop -m immediate, 6 s down, start", n(3000), 1, pg_stop_immediate, {},
         None, LIMIT),
        ("two bridges, no fault", n(5000), 2, None, {}, None, PROMISE),
        ("PostgreSQL primary killed, synchronous standby promoted after 3 s", n(3000), 2,
         primary_lost, {}, True, PROMISE),
        ("PostgreSQL primary killed, asynchronous standby promoted after 3 s", n(3000), 2,
         primary_lost, {}, False, LIMIT),
        ("kill -9 of one of two bridges, RESULTS_STREAM set", n(2000), 2, kill_one_of_two,
         stream, None, PROMISE),
        ("kill -9 of the NATS node leading RESULTS_STREAM, services publish via JetStream",
         n(3000), 2, leader_node_killed, replicated, CLUSTER, PROMISE),
        ("kill -9 of the NATS node leading RESULTS_STREAM, services publish via core NATS",
         n(3000), 2, leader_node_killed, core, CLUSTER, LIMIT),
        ("kill -9 of the NATS node leading RESULTS_STREAM, services publish via core NATS, "
         "bridges replay nothing (RESULTS_STREAM_REPLAY_SECONDS=0)",
         n(3000), 2, leader_node_killed, unreplayed, CLUSTER, LIMIT),
        ("lame-duck rolling restart of 3 NATS nodes, services publish via JetStream",
         n(3000), 2, lame_duck_rolling_restart, replicated, CLUSTER, PROMISE),
        ("lame-duck rolling restart of 3 NATS nodes, services publish via core NATS",
         n(3000), 2, lame_duck_rolling_restart, core, CLUSTER, LIMIT),
        ("kill -9 of the only bridge, RESULTS_STREAM set", n(2000), 1,
         lambda w: kill_only_bridge(w, **stream), stream, None, PROMISE),
    ]  # fmt: skip
    outcomes = []
    for name, jobs, bridges, fault, env, where, promise in plan:
        if only and not any(word in name.lower() for word in only):
            continue
        progress(f"{name}: {jobs:,} jobs, {bridges} bridge(s)")

        def run(
            name: str = name,
            jobs: int = jobs,
            bridges: int = bridges,
            fault: Fault | None = fault,
            env: dict[str, Any] = env,
            steady: bool = where == CLUSTER,
            promise: bool = promise,
        ) -> Awaitable[Outcome]:
            return run_fault(world, name, jobs, bridges, fault, steady, promise, **env)

        try:
            if where is None:
                outcome = await run()
            elif where == CLUSTER:
                outcome = await on_a_cluster(world, run)
            else:
                outcome = await on_a_pair(world, bool(where), run)
        except Exception as exc:
            traceback.print_exc()
            world.stop_all()
            outcome = Outcome(name, jobs, promise, error=f"{type(exc).__name__}: {exc}")
        progress(f"   {outcome}")
        outcomes.append(outcome)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    def sec(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f} s"

    lines = [
        "| fault | lossless? | jobs | faults injected | fault | lost | applied twice "
        "| sent twice | stuck | recover | drain |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for o in outcomes:
        kind = ("promised; **broken**" if broken(o) else "promised") if o.promise else "a limit"
        if o.error:
            lines.append(f"| {o.fault} | {kind} | {o.jobs:,} | failed to run: {o.error} |||||||| ")
            continue
        lines.append(
            f"| {o.fault} | {kind} | {o.jobs:,} | {o.faults} | {sec(o.fault_seconds)} | {o.lost:,} "
            f"| {o.applied_twice:,} | {o.sent_twice:,} | {o.stuck:,} | {sec(o.recover)} "
            f"| {sec(o.drain)} |"
        )
    return "\n".join(lines)


def _paragraph(text: str) -> str:
    """A docstring paragraph as markdown: list items one a line, the rest joined."""
    items = text.strip().replace("\n  ", " ").split("\n- ")
    return "\n- ".join(" ".join(item.split()) for item in items)


def markdown(outcomes: list[Outcome], command: str, wall: float) -> str:
    doc = __doc__ or ""
    return "\n".join(
        [
            "# Reliability: fault figures",
            "",
            "Written by `make chaos` (`python -m benchmarks.chaos`) at the end of a full run "
            "(overwritten; `--quick` runs do not write it). Real processes, a real reference "
            "service, real servers killed and restarted.",
            "",
            f"Command: `{command}`; the whole run took {wall:.0f} s. The machine is shared "
            "with other engineers running tests at the same time: read the times as an "
            "order of magnitude, the counts as exact.",
            "",
            "## Machine",
            "",
            *[f"- {line}" for line in machine()],
            "- every fault's database: `synchronous_commit=on` (ALTER DATABASE)",
            "",
            "## Results",
            "",
            table(outcomes),
            "",
            "## How it measures",
            "",
            *[_paragraph(p) + "\n" for p in doc.split("\n\n")[1:]],
        ]
    )


async def run_nemesis(first: int, seeds: int, faults: int) -> int:
    """Seeds first … first+seeds-1 of the nemesis, one after another; a line each."""
    broken_seeds = []
    kinds: Counter[str] = Counter()
    files = clicks = 0
    for seed in range(first, first + seeds):
        with tempfile.TemporaryDirectory(prefix=f"arm-nemesis-{seed}-") as tmp:
            try:
                result = await nemesis.run(Path(tmp), seed, faults)
            except Exception as exc:
                traceback.print_exc()
                print(f"seed {seed}: failed to run: {type(exc).__name__}: {exc}")
                broken_seeds.append(seed)
                continue
        print(result.summary(), flush=True)
        for problem in result.problems[:20]:
            print(f"   {problem}")
        kinds.update(f.kind for f in result.faults)
        files, clicks = files + result.files, clicks + result.clicks
        if result.problems:
            broken_seeds.append(seed)
    met = ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items()))
    print(f"{seeds} seeds: {sum(kinds.values())} faults met the flow ({met}); {files} files, "
          f"{clicks} double-clicked retries; broken: {broken_seeds or 'none'}")  # fmt: skip
    return 1 if broken_seeds else 0


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a fifth of the jobs; no doc")
    parser.add_argument("--nemesis", action="store_true", help="run the nemesis's seeds")
    parser.add_argument("--seeds", type=int, default=20, help="with --nemesis: how many")
    parser.add_argument("--first-seed", type=int, default=1, help="with --nemesis: from")
    parser.add_argument("--faults", type=int, default=6, help="with --nemesis: per seed")
    parser.add_argument(
        "--only",
        default="",
        help="the faults whose name contains one of these comma-separated words; no doc",
    )
    args = parser.parse_args(argv)
    if args.nemesis:
        if missing := iptables_missing():  # a fault drops packets: say so before seed 1
            print(f"python -m benchmarks.chaos --nemesis: {missing}", file=sys.stderr)
            return 2
        return await run_nemesis(args.first_seed, args.seeds, args.faults)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="arm-chaos-") as tmp:
        workdir = Path(tmp)
        pg = EmbeddedPostgres(base_dir=workdir / "pg").start()
        nats_server = EmbeddedNats(
            log_dir=workdir / "nats", extra_args=["-js", "-sd", str(workdir / "js")]
        ).start()
        try:
            only = [w.strip().lower() for w in args.only.split(",") if w.strip()]
            outcomes = await run_all(World.of(pg, nats_server, workdir), args.quick, only)
        finally:
            nats_server.stop()
            pg.destroy()
    print(table(outcomes))
    if not args.quick and not args.only:
        command = shlex.join(["python", "-m", "benchmarks.chaos", *argv])
        DOC.write_text(markdown(outcomes, command, time.monotonic() - began))
        print(f"written to {DOC}")
    failed = [o for o in outcomes if broken(o)]
    for o in failed:
        print(f"BROKEN PROMISE: {o.fault}: {o.error or o}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
