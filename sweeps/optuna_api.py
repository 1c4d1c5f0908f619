"""The one place where the sweeps go beyond Optuna's stable `Study`/`Trial` API, and why.

1. A trial trains in another process than the worker that started it (a fresh process per trial
   keeps memory from growing; Lightning DDP re-runs that process once per rank). Optuna has no
   public way to get a `Trial` object for a trial that is already running; `optuna.trial.Trial(
   study, trial_id)` is an internal constructor, and `trial._trial_id` and `study._storage` are
   private. `RunningTrial` does what `Trial.report` and `Trial.should_prune` do through the
   storage's public `BaseStorage` methods (the documented interface of custom storages): trial ids
   from the study name and the trial number, intermediate values, the pruner's public `prune`.
2. Heartbeats (a dead worker's trial becomes FAIL) and `RetryHeartbeatStaleTrialCallback` (its
   retry copy, same user attributes, so the same run directory) are experimental in Optuna; their
   `ExperimentalWarning` is silenced here, around those calls only, never globally, so that any
   other warning Optuna gives (a `FutureWarning` announcing a removal) reaches the user and fails
   the tests (`pyproject.toml` turns it into an error for `sweeps`).

pyproject.toml bounds Optuna to the versions this was tested with (`optuna>=4,<5.1`);
`tests/test_optuna_api.py` exercises every call below, with Optuna's warnings as errors, so an
upgrade that breaks or deprecates one fails loudly there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial

TESTED_VERSIONS = ((4, 0), (5, 1))  # [lowest, highest) major.minor, as pinned in pyproject.toml


@contextmanager
def experimental() -> Iterator[None]:
    """Use Optuna's experimental heartbeat API without its ExperimentalWarning (here only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield


def heartbeat_storage(url: str, heartbeat_s: int | None, **kwargs: Any) -> RDBStorage:
    """An RDB storage; with a heartbeat, stale trials become FAIL and are re-queued as copies."""
    with experimental():
        if not heartbeat_s:
            return RDBStorage(url, **kwargs)
        return RDBStorage(url, heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s,
                          heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(),
                          **kwargs)


def fail_stale_trials(study: optuna.Study) -> None:
    """Mark the trials whose heartbeat stopped as FAIL (and queue their retry copies)."""
    with experimental():
        optuna.storages.fail_stale_trials(study)


def queue_retry(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue a copy of a FAILed trial (same user attributes: the same configuration and run dir)."""
    with experimental():
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, trial)


def retried_trial_number(trial: FrozenTrial) -> int | None:
    """The number of the trial this one retries, or None."""
    with experimental():
        return optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """The numbers of the trials that have a retry copy (an interrupted run, not a failed one)."""
    with experimental():
        return {n for t in trials for n in optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(t)}


def trial_id(storage: BaseStorage, study_name: str, number: int) -> int:
    """The storage's id of the study's trial `number`."""
    study_id = storage.get_study_id_from_name(study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def frozen_trial(storage: BaseStorage, study_name: str, number: int) -> FrozenTrial:
    """The study's trial `number` as it is in the storage now."""
    return storage.get_trial(trial_id(storage, study_name, number))


def fail_running_trial(storage: BaseStorage, study_name: str, number: int) -> bool:
    """Set a RUNNING trial to FAIL; False if it had finished already (another process was quicker)."""
    try:
        return storage.set_trial_state_values(trial_id(storage, study_name, number),
                                              state=optuna.trial.TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


class RunningTrial:
    """A RUNNING trial, reached from another process: `report` and `should_prune` as on `Trial`."""

    def __init__(self, study: optuna.Study, storage: BaseStorage, number: int,
                 pruner: optuna.pruners.BasePruner) -> None:
        self.study, self.storage, self.number, self.pruner = study, storage, number, pruner
        self._id = trial_id(storage, study.study_name, number)

    def report(self, value: float, step: int) -> None:
        """Record the intermediate value of `step` (a step reported before is left as it was)."""
        if step in self.storage.get_trial(self._id).intermediate_values:
            return
        self.storage.set_trial_intermediate_value(self._id, int(step), float(value))

    def should_prune(self) -> bool:
        """The study's pruner's decision on the values reported so far."""
        return self.pruner.prune(self.study, self.storage.get_trial(self._id))
