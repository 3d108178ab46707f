"""A steady flow of uploads on a thread of its own, and the count of results each bridge
applied (from its DEBUG log): what a restart or a stop of a bridge under load is judged
by — every job done, each result applied once."""

from __future__ import annotations

import threading
from collections import Counter

from arm_core.devtools.testbed.processes import log_lines
from arm_core.devtools.testbed.sql import dict_conn, upload_many

DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


class Flow:
    """Uploads `per_step` jobs at a time on a connection of its own until stopped."""

    def __init__(self, db_url: str, per_step: int = 10, pause: float = 0.05) -> None:
        self.db_url, self.per_step, self.pause = db_url, per_step, pause
        self.uploaded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with dict_conn(self.db_url) as conn:
            while not self._stop.is_set():
                upload_many(conn, self.per_step)
                self.uploaded += self.per_step
                self._stop.wait(self.pause)

    def __enter__(self) -> Flow:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        return self.uploaded


def applied_results(logs: list[str]) -> Counter[str]:
    """Per job id, how many `result applied` lines the bridges logged."""
    applied: Counter[str] = Counter()
    for text in logs:
        for line in log_lines(text, action="result"):
            if "result applied" in line:
                applied[line.split(" job_id=")[1].split()[0]] += 1
    return applied
