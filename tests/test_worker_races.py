"""Claiming and reclaiming trials between workers, on a real SQLite study (issue: a re-run with
many workers failed a retry copy that its new worker had just claimed, and spare workers'
empty claims counted as failures; a row queued twice by two launchers must train once)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps.space import SearchSpace
from sweeps.study import make_storage, open_study
from sweeps.worker import (NothingQueued, Objective, WorkerSettings, owner_of_run_dir,
                           reclaim_dead_local_trials, should_start)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def study(tmp_path: Path) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    storage = make_storage(f"sqlite:///{tmp_path}/s.db", None)
    return open_study("races", storage), storage


def test_a_claimed_retry_copy_is_not_reclaimed_for_its_dead_predecessor(tmp_path: Path):
    s, storage = study(tmp_path)
    host, pid = socket.gethostname(), dead_pid()
    copy = s.ask()  # RUNNING, as a worker's claim leaves it before the worker records itself
    copy.set_user_attr("worker", f"{host}:{pid}:{copy.number + 100}")  # inherited from the dead trial
    assert reclaim_dead_local_trials(s, storage) == []
    assert s.get_trials()[copy.number].state == TrialState.RUNNING

    own = s.ask()
    own.set_user_attr("worker", f"{host}:{pid}:{own.number}")  # its own dead worker
    assert reclaim_dead_local_trials(s, storage) == [own.number]
    states = {t.number: t.state for t in s.get_trials()}
    assert states[own.number] == TrialState.FAIL and states[copy.number] == TrialState.RUNNING
    retry = [t for t in s.get_trials() if t.state == TrialState.WAITING]
    assert len(retry) == 1 and retry[0].user_attrs["worker"] == f"{host}:{pid}:{own.number}"

    alive = s.ask()
    alive.set_user_attr("worker", f"{host}:{subprocess.os.getpid()}:{alive.number}")
    assert reclaim_dead_local_trials(s, storage) == []  # a live worker keeps its trial


def test_empty_claims_of_spare_workers_are_not_failures(tmp_path: Path):
    s, _ = study(tmp_path)
    settings = WorkerSettings(study="races", storage="", space=None, n_trials=4, runs_dir=str(tmp_path))
    for _ in range(6):  # six spare workers found nothing queued
        trial = s.ask()
        trial.set_user_attr("nothing_queued", True)
        s.tell(trial, state=TrialState.FAIL)
    assert should_start(s, settings)
    for _ in range(4):  # four real failures stop the sweep
        s.tell(s.ask(), state=TrialState.FAIL)
    assert not should_start(s, settings)


def test_a_row_queued_twice_trains_once(tmp_path: Path):
    """Two launchers queueing one table at the same moment (a SLURM array starting) can queue a
    (row, seed) twice; the copy with the higher number yields to a live or complete lower one."""
    s, storage = study(tmp_path)
    attrs = {"row": "base", "seed": 1, "run_dir": str(tmp_path / "base-s1")}
    for _ in range(2):
        s.enqueue_trial({}, user_attrs={**attrs, "enqueued_overrides": ["train.seed=1"]})
    first, second = s.ask(), s.ask()  # two workers' claims
    settings = WorkerSettings(study="races", storage="", space=None, n_trials=2, runs_dir=str(tmp_path),
                              queue_only=True)
    objective = Objective(settings, SearchSpace(path="", params=()), storage)
    with pytest.raises(NothingQueued, match=f"trial {first.number} trains in its run directory"):
        objective(second)
    s.tell(second, state=TrialState.FAIL)
    assert s.get_trials()[second.number].user_attrs["duplicate_of"] == first.number
    assert not (tmp_path / "base-s1").exists()  # the copy started nothing
    assert should_start(s, settings)  # a yielded copy is not a failure
    trials = s.get_trials(deepcopy=False)
    assert owner_of_run_dir(trials, first.number, attrs["run_dir"]) is None  # the lower copy trains
    s.tell(first, 1.0)
    assert owner_of_run_dir(s.get_trials(deepcopy=False), 99, attrs["run_dir"]) == first.number


OPEN_AT = """
import sys, time
from sweeps.study import make_storage
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
make_storage(sys.argv[1], None)
"""


def test_processes_opening_a_new_sqlite_database_at_once_all_get_it(tmp_path: Path):
    """Each creates Optuna's tables and version row; Python's sqlite3 commits every CREATE TABLE on
    its own, so all but one failed ("table ... already exists", "UNIQUE constraint failed") until a
    failed open is tried again (a test watching a sweep start hit it, and so do two commands
    started together)."""
    import time

    url = f"sqlite:///{tmp_path}/db/new.db"
    start = time.time() + 3  # after every process has imported Optuna
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, url, str(start)], stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1]) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/db/new.db") == []
