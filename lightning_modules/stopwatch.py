"""A stopwatch over stretches of a run: its training time, with validation inside fit left out."""

from __future__ import annotations

import time


class Stopwatch:
    """Seconds accumulated over the stretches between `start()` and `stop()` (host clock)."""

    def __init__(self) -> None:
        self.seconds = 0.0  # the stretches ended so far
        self._since: float | None = None

    def start(self) -> None:
        self._since = time.perf_counter()

    def stop(self) -> None:
        if self._since is not None:
            self.seconds += time.perf_counter() - self._since
            self._since = None

    @property
    def total(self) -> float:
        """The seconds so far, the running stretch included."""
        return self.seconds + (time.perf_counter() - self._since if self._since is not None else 0.0)
