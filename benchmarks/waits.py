"""Where a database's client backends spend their time while a load runs: a thread samples
pg_stat_activity every few milliseconds and counts each active backend's wait event (none
means it was running: CPU). The shares say what bounds the load — the CPU, the WAL flush
(group commit: one backend writes and fsyncs, the others wait on WALWrite), a lock — and
so which cost a change must cut to go faster."""

from __future__ import annotations

import threading
from collections import Counter
from types import TracebackType

from benchmarks.harness import connect

SAMPLE_SECONDS = 0.005

# pg_stat_activity's wait events, grouped as the reading needs them.
WAL_FLUSH = {"LWLock:WALWrite", "IO:WALSync", "IO:WALWrite", "IO:WALInitSync", "IO:WALInitWrite"}


def group(event: str) -> str:
    if event == "CPU":
        return "CPU"
    if event in WAL_FLUSH:
        return "WAL flush"
    if event.startswith("Client:"):
        return "client"
    if event.startswith("Lock:"):
        return "locks"
    return event


class WaitSampler:
    """`with WaitSampler(admin_url, "dbname") as w: …` then `w.counts`, `w.describe()`.
    Samples accumulate across uses of one sampler (the two runs of one load)."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.admin_url = admin_url
        self.database = database
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WaitSampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        with connect(self.admin_url) as conn:
            while not self._stop.wait(SAMPLE_SECONDS):
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') "
                    "FROM pg_stat_activity WHERE datname = %s AND state = 'active' "
                    "AND backend_type = 'client backend'",
                    (self.database,),
                ).fetchall()
                self.counts.update(group(event) for (event,) in rows)

    def describe(self, top: int = 4) -> str:
        """'WAL flush 64% · CPU 28% · …', the `top` largest groups, the rest as 'other'."""
        total = sum(self.counts.values())
        if not total:
            return "no samples"
        shown = self.counts.most_common(top)
        rest = total - sum(n for _, n in shown)
        parts = [f"{name} {100 * n / total:.0f}%" for name, n in shown]
        if rest:
            parts.append(f"other {100 * rest / total:.0f}%")
        return " · ".join(parts)
