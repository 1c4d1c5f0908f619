"""The one place where the sweeps go beyond Optuna's stable `Study`/`Trial` API, and why.

1. A trial trains in another process than its worker, and Optuna has no public way to reach a running
   trial: `RunningTrial` does what `Trial.report` and `should_prune` do through public storage methods.
2. Heartbeats, the retry callback and the gRPC proxy are experimental: their `ExperimentalWarning` is
   silenced around those calls only, so any other warning (a removal announced) fails the tests.
3. Only `RDBStorage` implements the heartbeat: `SystemAttrHeartbeat` implements the private
   `BaseHeartbeat` for the journal and the proxy (docs/scale-out.md, "Heartbeats on every storage").
4. Optuna hands out queued trials in the order queued (`Study._pop_waiting_trial_id`, private), so a
   retry copy would wait behind the whole queue: `RetriesFirstStudy` overrides it, claiming as Optuna.
5. A table prunes each row's candidates among themselves: `CohortStudy` filters the study a cohort's
   trial is judged in (as Optuna's Hyperband does per bracket); `replay` shows it a finished curve.

`tests/test_optuna_api.py` exercises every call here with Optuna's warnings as errors."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Self

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, GrpcStorageProxy, RDBStorage, run_grpc_proxy_server
from optuna.storages._heartbeat import BaseHeartbeat  # private module: reason 3 above
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
from optuna.trial import FrozenTrial, TrialState

TESTED_VERSIONS = ((4, 9), (5, 1))  # [lowest, highest) major.minor, as pinned in pyproject.toml


@contextmanager
def experimental() -> Iterator[None]:
    """Optuna's experimental API (heartbeats, the gRPC proxy) without its ExperimentalWarning."""
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


HEARTBEAT_ATTR = "heartbeat"  # the trial system attribute SystemAttrHeartbeat beats in


class SystemAttrHeartbeat(BaseHeartbeat):
    """Optuna's heartbeat on the trial system attribute `heartbeat` (docs/scale-out.md): a RUNNING trial
    is stale when neither its beat nor its start (a retry copy inherits its beat) is recent."""

    heartbeat_s: int = 60

    def beating_every(self, heartbeat_s: int) -> Self:
        self.heartbeat_s = heartbeat_s
        return self

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())  # type: ignore[attr-defined]
        except UpdateFinishedTrialError:  # finished in the meantime: nothing to keep alive
            pass

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        storage: Any = self
        deadline = time.time() - 2 * self.heartbeat_s
        stale = []
        for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(HEARTBEAT_ATTR)
            started = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
            if beat is not None and max(float(beat), started) < deadline:
                stale.append(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_s

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        with experimental():
            return optuna.storages.RetryHeartbeatStaleTrialCallback()


class _BeatingJournalStorage(SystemAttrHeartbeat, JournalStorage):
    pass


class _BeatingGrpcStorageProxy(SystemAttrHeartbeat, GrpcStorageProxy):
    pass


def journal_storage(path: str, heartbeat_s: int | None) -> JournalStorage:
    """A journal storage with `JournalFileOpenLock` (O_CREAT|O_EXCL: atomic on NFSv3, no symlinks)."""
    backend = JournalFileBackend(path, lock_obj=JournalFileOpenLock(path))
    return _BeatingJournalStorage(backend).beating_every(heartbeat_s) if heartbeat_s else JournalStorage(backend)


def grpc_storage(host: str, port: int, heartbeat_s: int | None, timeout_s: float) -> GrpcStorageProxy:
    """A client of `run_grpc_proxy_server` at host:port once it answers (else ConnectionError)."""
    with experimental():
        storage = _BeatingGrpcStorageProxy(host=host, port=port).beating_every(heartbeat_s) if heartbeat_s \
            else GrpcStorageProxy(host=host, port=port)
    storage.wait_server_ready(timeout=timeout_s)
    return storage


def serve_grpc_proxy(storage: BaseStorage, host: str, port: int) -> None:
    """Optuna's gRPC storage proxy in front of `storage`, until the process is stopped."""
    with experimental():
        run_grpc_proxy_server(storage, host=host, port=port)


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


class RetriesFirstStudy(optuna.Study):
    """A study whose queue hands out retry copies first (reason 4), skipping what `claimable` refuses."""

    def __init__(self, study_name: str, storage: BaseStorage, sampler: optuna.samplers.BaseSampler | None = None,
                 pruner: optuna.pruners.BasePruner | None = None,
                 claimable: Callable[[FrozenTrial], bool] | None = None) -> None:
        super().__init__(study_name=study_name, storage=storage, sampler=sampler, pruner=pruner)
        self.queue = storage  # Optuna may wrap an RDB storage in a cache; claims go to the storage itself
        self.claimable = claimable

    def _pop_waiting_trial_id(self) -> int | None:
        waiting = self.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        for trial in sorted(waiting, key=lambda t: (retried_trial_number(t) is None, t.number)):
            if self.claimable is not None and not self.claimable(trial):
                continue
            tid = trial_id(self.queue, self.study_name, trial.number)
            try:
                if self.queue.set_trial_state_values(tid, state=TrialState.RUNNING):
                    return tid
            except UpdateFinishedTrialError:  # another worker ran it to the end meanwhile
                continue
        return None


class CohortStudy(optuna.Study):
    """The study as its pruner sees it for a trial of one cohort: the trials `member` accepts (reason 5)."""

    def __init__(self, study_name: str, storage: BaseStorage, member: Callable[[FrozenTrial], bool]) -> None:
        super().__init__(study_name=study_name, storage=storage)
        self.member = member

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return [t for t in super().get_trials(deepcopy=deepcopy, states=states) if self.member(t)]


class RunningTrial:
    """A RUNNING trial from another process: `report` and `should_prune` as `Trial`'s (`among`: a cohort)."""

    def __init__(self, study: optuna.Study, storage: BaseStorage, number: int,
                 pruner: optuna.pruners.BasePruner, among: Callable[[FrozenTrial], bool] | None = None) -> None:
        self.study, self.storage, self.number, self.pruner = study, storage, number, pruner
        self._id = trial_id(storage, study.study_name, number)
        self.seen = study if among is None else CohortStudy(study.study_name, storage, among)

    def report(self, value: float, step: int) -> None:
        """Record the intermediate value of `step` (a step reported before is left as it was)."""
        if step in self.storage.get_trial(self._id).intermediate_values:
            return
        self.storage.set_trial_intermediate_value(self._id, int(step), float(value))

    def should_prune(self) -> bool:
        """The study's pruner's decision on the values reported so far."""
        return self.pruner.prune(self.seen, self.storage.get_trial(self._id))


def replay(storage: BaseStorage, study_name: str, finished: FrozenTrial, curve: dict[int, float],
           pruner: optuna.pruners.BasePruner, member: Callable[[FrozenTrial], bool], user_attrs: dict[str, Any]) -> int:
    """A completed trial (a `member`) that replayed `finished`'s `curve` ({step: value}) to `pruner`; its number."""
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
                           datetime_complete=None, params={}, distributions={}, user_attrs=user_attrs,
                           system_attrs={}, intermediate_values={}, trial_id=-1)
    new = storage.create_new_trial(storage.get_study_id_from_name(study_name), template_trial=template)
    seen = CohortStudy(study_name, storage, member)
    for step, value in sorted(curve.items()):
        storage.set_trial_intermediate_value(new, step, value)
        pruner.prune(seen, storage.get_trial(new))
    storage.set_trial_state_values(new, TrialState.COMPLETE, finished.values)
    return storage.get_trial(new).number


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Without Optuna's INFO lines: a command says what it opened itself, so an error is its one line."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)
