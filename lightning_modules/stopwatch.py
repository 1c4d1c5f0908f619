"""Stopwatches over stretches of a run: its training time (validation and stopped stretches left out),
its data preparation's stages (wall, CPU, peak memory) and its start-up's parts."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


TICK_S = 1.0  # how often the watcher notes the clock
STOPPED_AFTER_S = 10.0  # a gap between its notes this long: no thread of the process ran


class _Stopped:
    """The stretches in which this process was stopped (SIGSTOP), which the host clock runs on through:
    a gap over STOPPED_AFTER_S between a watcher thread's notes (one a process, also when forked)."""

    def __init__(self) -> None:
        self._gaps: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._pid: int | None = None

    def watch(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid, self._gaps = os.getpid(), []
        threading.Thread(target=self._note, name="stopwatch-stopped", daemon=True).start()

    def _note(self) -> None:
        last = time.perf_counter()
        while True:
            time.sleep(TICK_S)
            now = time.perf_counter()
            if now - last > STOPPED_AFTER_S:
                with self._lock:
                    self._gaps.append((last + TICK_S, now))
            last = now

    def within(self, start: float, end: float) -> float:
        """Seconds of [start, end] (host clock) in which the process was stopped."""
        with self._lock:
            return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self._gaps)


STOPPED = _Stopped()


class Stopwatch:
    """Seconds between `start()` and `stop()`, less those in which the process was stopped."""

    def __init__(self) -> None:
        self.seconds = 0.0  # the stretches ended so far
        self._since: float | None = None

    def start(self) -> None:
        STOPPED.watch()
        self._since = time.perf_counter()

    def _running(self) -> float:
        if self._since is None:
            return 0.0
        now = time.perf_counter()
        return now - self._since - STOPPED.within(self._since, now)

    def stop(self) -> None:
        self.seconds += self._running()
        self._since = None

    @property
    def total(self) -> float:
        """The seconds so far, the running stretch included."""
        return self.seconds + self._running()


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), else None."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class StartUp:
    """Where a run's start-up goes: the process's age (/proc, 10 ms ticks) at each named part's end."""

    def __init__(self) -> None:
        self._ends: list[tuple[str, float]] = []

    def mark(self, part: str) -> float | None:
        """End `part` now; the process's age (None without /proc)."""
        age = process_age_s()
        if age is not None:
            self._ends.append((part, age))
        return age

    @property
    def parts(self) -> list[dict[str, Any]]:
        """[{"part": name, "s": seconds}] in order; each part ends where the next begins."""
        starts = [0.0] + [age for _, age in self._ends[:-1]]
        return [{"part": part, "s": round(max(0.0, age - start), 2)}
                for (part, age), start in zip(self._ends, starts)]


def _peak_rss_mb() -> float | None:
    """This process's resident-set high-water mark (VmHWM) in MB; None where /proc has none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak_rss() -> bool:
    """Restart the high-water mark at the current RSS (Linux: "5" to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Stages:
    """Wall and CPU seconds and peak RSS of named stretches; a long one is printed as it ends."""

    note_after_s: float = 30.0
    done: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        own_peak = _reset_peak_rss()
        wall, cpu = time.perf_counter(), _cpu_seconds()
        yield
        rss = _peak_rss_mb()
        entry = {"stage": name, "wall_s": round(time.perf_counter() - wall, 2),
                 "cpu_s": round(_cpu_seconds() - cpu, 2), "peak_rss_mb": None if rss is None else round(rss),
                 "own_peak": own_peak}
        self.done.append(entry)
        if entry["wall_s"] >= self.note_after_s:
            peak = f", peak RSS {entry['peak_rss_mb']:,} MB" if entry["peak_rss_mb"] is not None else ""
            print(f"data: {name} took {entry['wall_s']:.1f} s (CPU {entry['cpu_s']:.1f} s{peak})", flush=True)
