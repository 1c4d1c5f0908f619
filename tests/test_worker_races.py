"""Claiming and reclaiming trials between workers, on a real SQLite study (issue: a re-run with
many workers failed a retry copy that its new worker had just claimed, and spare workers'
empty claims counted as failures; a row queued twice by two launchers must train once; issue 12:
killed trials counted as failures, a claim whose worker died before recording itself stayed
RUNNING, empty claims printed tracebacks)."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from lightning_modules.callbacks import PromptInterruptWhileCompiling
from foundation.stop import INTERRUPTS, REQUEUE_SIGNAL, StopRequest
from sweeps.claims import UnrecordedClaims, pid_alive, reclaim_dead_local_trials, worker_record
from sweeps.optuna_api import frozen_trial, queue_retry
from sweeps.processes import spawn
from sweeps.space import SearchSpace
from sweeps.storage import make_storage
from sweeps.study import open_study
from sweeps.worker import (NothingQueued, Objective, Stopped, TrialFailed, WorkerSettings, _NoTrialTracebacks, load_policy,
                           _stop_child, counted_failures, owner_of_run_dir, should_start)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def study(tmp_path: Path) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    storage = make_storage(f"sqlite:///{tmp_path}/s.db", None)
    return open_study("races", storage), storage


def queue_only_objective(tmp_path: Path, storage: optuna.storages.BaseStorage, n_trials: int,
                         stop: StopRequest | None = None) -> tuple[WorkerSettings, Objective]:
    """A Table 3 worker's settings and objective (queued trials only) on the races study."""
    from tables.policy import NAME

    settings = WorkerSettings(study="races", storage="", space=None, n_trials=n_trials,
                              runs_dir=str(tmp_path), policy=NAME, policy_args={"runs_dir": str(tmp_path)})
    return settings, Objective(settings, SearchSpace(path="", params=()), storage, stop or StopRequest(),
                               load_policy(settings))


@contextlib.contextmanager
def optuna_log() -> Iterator[io.StringIO]:
    """What Optuna logs meanwhile, through the worker's traceback filter."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(_NoTrialTracebacks())
    logger = optuna.logging.get_logger("optuna")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


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
    settings, objective = queue_only_objective(tmp_path, storage, n_trials=2)
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
import sys
from sweeps.storage import make_storage
print("ready", flush=True)
sys.stdin.readline()  # the go, sent to every process at once
make_storage(sys.argv[1], None)
"""


def test_processes_opening_a_new_sqlite_database_at_once_all_get_it(tmp_path: Path):
    """Each creates Optuna's tables and version row; Python's sqlite3 commits every CREATE TABLE on
    its own, so all but one failed ("table ... already exists", "UNIQUE constraint failed") until a
    failed open is tried again (a test watching a sweep start hit it, and so do two commands
    started together). The processes open it together once every one has imported Optuna and
    said so, however long that took on a loaded machine."""
    url = f"sqlite:///{tmp_path}/db/new.db"
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
             for _ in range(4)]
    ready = [p.stdout.readline().strip() for p in procs]  # "" from one that failed to start
    for p in procs:  # the go, to each in turn with nothing between
        with contextlib.suppress(BrokenPipeError):  # one that failed: its error is shown below
            p.stdin.write("go\n")
            p.stdin.flush()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert ready == ["ready"] * 4, errors
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/db/new.db") == []


def test_killed_and_interrupted_trials_are_not_failed_runs(tmp_path: Path):
    """A trial with a retry copy was interrupted, not failed: a sweep whose workers were killed
    more often than --n-trials goes on (it stopped with "too many failed trials")."""
    s, storage = study(tmp_path)
    settings = WorkerSettings(study="races", storage="", space=None, n_trials=3, runs_dir=str(tmp_path))
    for _ in range(4):  # four kills, each trial retried
        killed = s.ask()
        s.tell(killed, state=TrialState.FAIL)
        queue_retry(s, frozen_trial(storage, "races", killed.number))
    assert counted_failures(s.get_trials()) == [] and should_start(s, settings)
    failed = s.ask()  # a run that failed (NaN loss, crash): no retry copy
    s.tell(failed, state=TrialState.FAIL)
    assert [t.number for t in counted_failures(s.get_trials())] == [failed.number]


def test_a_claim_whose_worker_died_before_recording_itself_is_queued_again(tmp_path: Path):
    """SIGKILL between Optuna's claim (RUNNING) and the worker's record: nothing says whose the
    trial is and Optuna's heartbeat never sees it; after the grace period it is queued again."""
    s, storage = study(tmp_path)
    now = [0.0]
    watch = UnrecordedClaims(grace_s=10, clock=lambda: now[0])
    orphan = s.ask()  # claimed, never recorded
    orphan.set_user_attr("run_dir", "/runs/x")
    copy = s.ask()  # a retry copy, its inherited record names another trial
    copy.set_user_attr("worker", f"{socket.gethostname()}:{dead_pid()}:{copy.number + 100}")
    live = s.ask()
    assert watch.reclaim(s, storage) == [] and watch.pending
    now[0] = 5.0
    live.set_user_attr("worker", worker_record(live.number))  # its worker recorded itself in time
    assert watch.reclaim(s, storage) == []
    now[0] = 10.0
    assert sorted(watch.reclaim(s, storage)) == [orphan.number, copy.number] and not watch.pending
    trials = s.get_trials()
    assert trials[live.number].state == TrialState.RUNNING
    retries = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted(t.system_attrs["failed_trial"] for t in retries) == [orphan.number, copy.number]
    assert {t.user_attrs.get("run_dir") for t in retries} == {"/runs/x", None}
    assert UnrecordedClaims(grace_s=None).reclaim(s, storage) == []  # no heartbeat: never


def test_a_stop_signal_is_only_recorded_with_which_signal_and_when(tmp_path: Path):
    """A stop signal raises nowhere (not between a claim and its record, not inside Optuna's
    record of a trial's end): it is noted, and the worker's loop acts on it at its safe points."""
    stop = StopRequest()
    previous = signal.getsignal(signal.SIGTERM)
    with stop.recording(*INTERRUPTS):
        os.kill(os.getpid(), signal.SIGTERM)  # between the claim and the record: nothing happens
        time.sleep(0.1)
        assert stop.requested and stop.interrupted and not stop.preempted and stop.signals == {signal.SIGTERM}
        first = stop.at
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGHUP)  # a closed terminal: a stop like the others
        time.sleep(0.1)
        assert stop.signals == set(INTERRUPTS) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
        assert stop.at == first  # when the first came
        assert stop.wait(30)  # a waiting loop returns at once once asked
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler it had is back


def test_a_claimed_trial_with_a_stop_asked_for_is_not_started_and_is_queued_again(tmp_path: Path):
    s, storage = study(tmp_path)
    s.enqueue_trial({}, user_attrs={"row": "base", "enqueued_overrides": ["train.seed=1"],
                                    "run_dir": str(tmp_path / "base-s1")})
    stop = StopRequest()
    _, objective = queue_only_objective(tmp_path, storage, 1, stop)
    trial = s.ask()
    stop.record(signal.SIGTERM)  # during the claim
    with pytest.raises(Stopped):
        objective(trial)
    assert trial.user_attrs["worker"] == worker_record(trial.number)  # recorded first
    assert objective.current == trial.number  # the worker queues its retry copy
    assert not (tmp_path / "base-s1" / "trial.log").exists()  # no trial process was started


def test_an_empty_claim_is_not_the_trial_an_interrupt_queues_again(tmp_path: Path):
    s, storage = study(tmp_path)
    stop = StopRequest()
    _, objective = queue_only_objective(tmp_path, storage, 4, stop)
    trial = s.ask()
    stop.record(signal.SIGTERM)  # SIGTERM during the claim
    with pytest.raises(NothingQueued):
        objective(trial)
    assert objective.current is None and objective.last == trial.number
    assert stop.requested  # the worker stops once Optuna has recorded the trial's end


def test_a_killed_but_unreaped_worker_is_dead():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        child.kill()
        time.sleep(0.5)  # a zombie until waited for
        assert not pid_alive(child.pid)
    finally:
        child.wait()


def test_empty_claims_and_interrupts_print_no_traceback_and_failed_runs_one_line(tmp_path: Path):
    s, _ = study(tmp_path)

    def objective(trial: optuna.Trial) -> float:
        if trial.number == 0:
            raise NothingQueued(trial.number)
        raise TrialFailed(f"trial {trial.number} failed: loss is nan")

    with optuna_log() as out:
        s.optimize(objective, n_trials=2, catch=(NothingQueued, TrialFailed))
    lines = out.getvalue().splitlines()
    assert "Traceback" not in out.getvalue() and not any(line.startswith("Trial 0 ") for line in lines)
    assert any("trial 1 failed: loss is nan" in line for line in lines), lines


def test_a_duplicate_copy_records_its_worker_and_ends_as_an_empty_claim(tmp_path: Path):
    """The copy that yields records its worker first (no claim stays without its worker), a stop
    only recorded meanwhile; an interrupt then does not queue it again; it is no failure and prints no
    traceback."""
    s, storage = study(tmp_path)
    attrs = {"row": "base", "seed": 1, "run_dir": str(tmp_path / "base-s1")}
    for _ in range(3):
        s.enqueue_trial({}, user_attrs={**attrs, "enqueued_overrides": ["train.seed=1"]})
    first = s.ask()  # another worker's claim: it trains
    stop = StopRequest()
    _, objective = queue_only_objective(tmp_path, storage, 2, stop)
    with optuna_log() as out:
        stop.record(signal.SIGTERM)  # SIGTERM during the claim
        s.optimize(objective, n_trials=2, catch=(NothingQueued, TrialFailed))  # the two other copies
    copies = s.get_trials()[first.number + 1:]
    assert [t.state for t in copies] == [TrialState.FAIL] * 2
    for copy in copies:
        assert copy.user_attrs["worker"] == worker_record(copy.number)
        assert copy.user_attrs["nothing_queued"] and copy.user_attrs["duplicate_of"] == first.number
    assert objective.current is None  # an interrupt does not queue an empty claim again
    assert stop.requested  # acted on by the worker's loop, after the claims
    assert counted_failures(s.get_trials()) == [] and not (tmp_path / "base-s1").exists()
    lines = out.getvalue().splitlines()
    assert "Traceback" not in out.getvalue(), lines
    assert not any(line.startswith(tuple(f"Trial {t.number} " for t in copies)) for line in lines), lines


CHILD = """
import sys
from foundation.stop import INTERRUPTS, REQUEUE_SIGNAL, STOP
STOP.install(*INTERRUPTS, REQUEUE_SIGNAL)
STOP.wait(60)
print(sorted(STOP.signals), flush=True)
sys.exit(130 if STOP.requested else 0)
"""


def test_a_preemption_wins_over_an_interrupt_and_is_passed_on_once(tmp_path: Path):
    """Under SLURM, SIGUSR1 (the pre-emption notice) is recorded like SIGTERM; it wins over a
    SIGTERM recorded with it (the trial must still requeue the job); a second notice (SLURM and
    the launcher both send one) changes nothing; the worker passes it on to its trial as it is."""
    stop = StopRequest()
    with stop.recording(signal.SIGTERM, REQUEUE_SIGNAL):
        os.kill(os.getpid(), REQUEUE_SIGNAL)
        os.kill(os.getpid(), signal.SIGTERM)  # the requeue's SIGTERM after the notice
        time.sleep(0.1)
        assert stop.preempted and stop.interrupted
        first = (set(stop.signals), stop.at)
        os.kill(os.getpid(), REQUEUE_SIGNAL)  # the launcher's copy
        time.sleep(0.1)
        assert (stop.signals, stop.at) == first
    root = str(Path(__file__).resolve().parents[1])
    for preempted, sent in ((True, REQUEUE_SIGNAL), (False, signal.SIGINT)):
        log = tmp_path / f"child-{int(preempted)}.log"
        child = spawn([sys.executable, "-c", CHILD], env={**os.environ, "PYTHONPATH": root}, log=log)
        time.sleep(0.3)  # held back until the child records it, if it has not yet
        assert _stop_child(child, preempted) == 130
        assert log.read_text().strip() == str([int(sent)])


def test_an_interrupt_while_a_child_starts_waits_until_it_can_be_handled(tmp_path: Path):
    """A worker or trial process signalled while Python starts (or while it exits) printed a
    KeyboardInterrupt traceback; a spawned child holds interrupts until it accepts them."""
    code = ("import sys, time\ntime.sleep(1)\nfrom foundation.stop import INTERRUPTS, STOP\n"
            "STOP.install(*INTERRUPTS)\nsys.exit(130 if STOP.wait(30) else 0)\n")
    root = str(Path(__file__).resolve().parents[1])
    child = spawn([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": root}, log=tmp_path / "log")
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)  # before the child handles interrupts: held, then delivered
    assert child.wait(timeout=30) == 130
    assert "Traceback" not in (tmp_path / "log").read_text()


def test_a_stop_dropped_inside_a_garbage_callback_is_still_recorded(monkeypatch: pytest.MonkeyPatch):
    """The one raising stop handler of a training process (`PromptInterruptWhileCompiling`)
    records the request before it raises: where CPython drops the exception (a weakref callback,
    `__del__`), the stop is not lost, and the step's end acts on it (`StopAtStepEnd`). Every other
    stop handler only records, so nothing can be dropped. (In this process, with a stop request of
    its own: what is tested is the handler and CPython's garbage collector, not a process's exit;
    the handlers it had are back after.)"""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    dropped: list[tuple[type | None, object]] = []  # what CPython dropped, and where (its unraisable hook)
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: dropped.append((raised.exc_type, raised.object)))
    stop = StopRequest()
    previous = {signum: signal.getsignal(signum) for signum in INTERRUPTS}
    with stop.recording(*INTERRUPTS):
        compiling = PromptInterruptWhileCompiling(stop)
        compiling.on_train_batch_start(None, None, None, 0)  # a batch starts: a stop raises at once
        assert compiling._previous, "the raising handlers were not installed (not the main thread?)"

        class Garbage:
            pass

        def collected(_ref: weakref.ref) -> None:  # the garbage collector's callback: where CPython drops an exception
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs here, between two of these bytecodes
                pass

        item = Garbage()
        ref = weakref.ref(item, collected)  # noqa: F841 (kept alive, so that its callback runs)
        del item
        gc.collect()
        # on from here: Python dropped the SIGTERMException (it raised nowhere in this test)
        compiling.on_before_optimizer_step(None, None, None)
        assert stop.interrupted and stop.signals == {signal.SIGINT}
    assert (SIGTERMException, collected) in dropped, dropped  # CPython did drop the raise, in the callback
    assert {signum: signal.getsignal(signum) for signum in INTERRUPTS} == previous
