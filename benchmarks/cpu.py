"""Where the time goes: CPU seconds of each process of the run over a window, from
/proc (Linux). PostgreSQL counts its postmaster, its live children and the children it
has already reaped (cutime/cstime), so short-lived connections are not lost."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid …": comm may hold spaces; fields after it start at state.
    return text.rsplit(")", 1)[1].split()


def _cpu(fields: list[str], reaped: bool = False) -> float:
    # After "(comm)": state=0 ppid=1 … utime=11 stime=12 cutime=13 cstime=14.
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == parent:
                found.append(int(entry.name))
    return found


def postgres_cpu(postmaster: int) -> float:
    own = _stat(postmaster)
    if own is None:
        return 0.0
    live = (_stat(pid) for pid in children(postmaster))
    return _cpu(own, reaped=True) + sum(_cpu(f) for f in live if f is not None)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    # cpu user nice system idle iowait irq softirq steal …
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def process_cpu(pid: int) -> float:
    fields = _stat(pid)
    return _cpu(fields, reaped=True) if fields is not None else 0.0


@dataclass
class CpuMeter:
    """`start()` … `stop()`: CPU of each named process as a share of one core."""

    pids: dict[str, int]
    postmaster: int | None = None
    _start: dict[str, float] = field(default_factory=dict)
    _wall: float = 0.0
    shares: dict[str, float] = field(default_factory=dict)

    def _sample(self) -> dict[str, float]:
        sample = {name: process_cpu(pid) for name, pid in self.pids.items()}
        if self.postmaster is not None:
            sample["postgres"] = postgres_cpu(self.postmaster)
        sample["bench"] = time.process_time()
        sample["machine"] = machine_busy()
        return sample

    def start(self) -> CpuMeter:
        self._start, self._wall = self._sample(), time.monotonic()
        return self

    def stop(self) -> dict[str, float]:
        end, wall = self._sample(), time.monotonic() - self._wall
        self.shares = {k: (end[k] - self._start[k]) / wall for k in end if wall > 0}
        return self.shares

    def describe(self) -> str:
        """`bridge 97% · postgres 61% · nats-server 9% · bench 30% · others 4%` (% of one
        core; `others` is whatever else kept the machine busy meanwhile)."""
        ours = {k: v for k, v in self.shares.items() if k != "machine"}
        others = max(self.shares.get("machine", 0.0) - sum(ours.values()), 0.0)
        return " · ".join(f"{k} {v * 100:.0f}%" for k, v in {**ours, "others": others}.items())
