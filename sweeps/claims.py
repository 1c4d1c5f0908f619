"""Which worker holds which trial (`worker` = host:pid:trial-number), and taking back dead workers'
trials (docs/reliability.md, "Workers never fail each other's trials")."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeps.optuna_api import fail_running_trial, frozen_trial, queue_retry


def worker_record(number: int) -> str:
    """The `worker` attribute this process records on trial `number`."""
    return f"{socket.gethostname()}:{os.getpid()}:{number}"


def worker_of(value: str) -> tuple[str, int | None, int | None]:
    """(host, pid, trial number) of a `worker` attribute 'host:pid:number'."""
    parts = value.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return "", None, None
    return parts[0], int(parts[1]), int(parts[2])


def recorded(trial: FrozenTrial) -> bool:
    """Whether the trial's worker has recorded itself on it (not just inherited a record)."""
    return worker_of(str(trial.user_attrs.get("worker", "")))[2] == trial.number


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def take_back(study: optuna.Study, storage: optuna.storages.BaseStorage, number: int) -> bool:
    """Fail RUNNING trial `number` and queue its retry copy; False if it had finished already."""
    if not fail_running_trial(storage, study.study_name, number):  # another process was quicker
        return False
    queue_retry(study, frozen_trial(storage, study.study_name, number))
    return True


def reclaim_dead_local_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """Fail and re-queue at once the RUNNING trials whose worker on this host is gone; their numbers."""
    host, reclaimed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not recorded(trial):  # not yet recorded: UnrecordedClaims watches it
            continue
        name, pid, _ = worker_of(str(trial.user_attrs["worker"]))
        if name == host and pid is not None and not pid_alive(pid) and take_back(study, storage, trial.number):
            reclaimed.append(trial.number)
    return reclaimed


class UnrecordedClaims:
    """RUNNING trials no worker has recorded itself on, and since when this process has seen them."""

    def __init__(self, grace_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s, self.clock = grace_s, clock
        self.first_seen: dict[int, float] = {}

    def reclaim(self, study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
        """Fail and re-queue the claims unrecorded for `grace_s`; returns their numbers."""
        now = self.clock()
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        unrecorded = {t.number for t in running if not recorded(t)}
        self.first_seen = {n: self.first_seen.get(n, now) for n in unrecorded}
        if self.grace_s is None:
            return []
        stale = [n for n, seen in self.first_seen.items() if now - seen >= self.grace_s]
        reclaimed = [n for n in stale if take_back(study, storage, n)]
        for n in stale:
            del self.first_seen[n]
        return reclaimed

    @property
    def pending(self) -> bool:
        """Whether some claim may still turn out to be a dead worker's (then it is queued again)."""
        return self.grace_s is not None and bool(self.first_seen)
