"""Stop requests (docs/reliability.md, "Workers never fail each other's trials"): a stop signal's
handler only records the request (`STOP`, one per process), each level acting on it at its own safe
point, because a raising handler could land inside a claim, inside Optuna's record of a trial's end,
or in a garbage-collector callback, where CPython drops the exception and the stop is lost; the two
that still raise say why (`sweeps.proxy`, `callbacks.PromptInterruptWhileCompiling`). No torch here."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

REQUEUE_SIGNAL = signal.SIGUSR1  # SLURM's pre-emption notice (`#SBATCH --signal=USR1@90`); Lightning's default
# SIGHUP (a closed terminal) is a stop too: by default it would kill `ablate train` unsaved.
INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
POLL_S = 0.1  # how often a waiting loop looks at the request
# How a stop is passed down a sweep (a pre-emption notice is passed on as it is):
TO_WORKERS = signal.SIGTERM  # the launcher's to its workers
TO_TRIAL = signal.SIGINT  # a worker's to its trial's process


class StopRequest:
    """Which stop signals this process has received, and when the first came (monotonic clock)."""

    def __init__(self) -> None:
        self.signals: set[int] = set()
        self.at: float | None = None

    def record(self, signum: int, frame: Any = None) -> None:
        """The signal handler: note the request, nothing else."""
        self.signals.add(signum)
        if self.at is None:
            self.at = time.monotonic()

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    @property
    def preempted(self) -> bool:
        """SLURM's notice came: it wins over an interrupt (the job must still be requeued)."""
        return REQUEUE_SIGNAL in self.signals

    @property
    def interrupted(self) -> bool:
        return bool(self.signals & INTERRUPTS)

    def install(self, *signums: int) -> dict[int, Any]:
        """Record `signums` (main thread only), letting through those held since start; the old handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {signum: signal.signal(signum, self.record) for signum in signums}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(signums))
        return previous

    @contextlib.contextmanager
    def recording(self, *signums: int) -> Iterator[StopRequest]:
        """Record `signums` while inside; their handlers are put back after."""
        previous = self.install(*signums)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, less if a stop is asked for meanwhile; whether one was."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_S, left))
        return self.requested


STOP = StopRequest()  # the process's one request


@contextlib.contextmanager
def interrupting(*signums: int) -> Iterator[None]:
    """`signums` raise KeyboardInterrupt inside: only around a blocking call; say why where used."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, signal.default_int_handler) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def hangup_as_sigterm() -> None:
    """`ablate train` by hand: SIGHUP (a closed terminal) becomes SIGTERM, acted on at the step's end."""
    import os

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))


def hold_stop_signals() -> None:
    """In a new child: its stop signals wait, blocked, until recorded (during start-up they would kill
    it); SIGINT gets its default back (`nohup ablate ... &` leaves it ignored across exec)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS | {REQUEUE_SIGNAL})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
