"""A sweep worker (`python -m sweeps.worker`, settings as JSON in $ABLATE_WORKER): loops on
`study.optimize`, one trial at a time.

Each trial trains in a child process (`sweeps.trial_run`) in `<runs_dir>/<study>/trial-<number>`.
The trial's overrides and run directory are stored as user attributes when it starts, so a retry
copy (made by the heartbeat's `RetryHeartbeatStaleTrialCallback`, which copies user attributes)
trains the same configuration in the same directory, resuming from its checkpoint.

The worker stops when the finished (COMPLETE + PRUNED) plus running trials reach `n_trials`
(`MaxTrialsCallback` ends the current `optimize` call; the check before each trial keeps K
workers from overshooting), when a grid is exhausted, or after `n_trials` failures.

On SIGTERM/SIGINT the running trial's child gets SIGINT (Lightning saves an interrupted
checkpoint), Optuna records the trial FAIL, and the worker queues a retry copy through the same
`RetryHeartbeatStaleTrialCallback`: re-running the sweep resumes it. Under SLURM, SIGUSR1 (the
pre-emption notice of `#SBATCH --signal=USR1@90`) does the same, except that the child gets
SIGUSR1: it saves a checkpoint at the end of its step and requeues the job
(`lightning_modules/run/slurm.py`). Once stopping, the worker ignores further SIGTERM/SIGUSR1 (a
requeue sends SIGTERM to the whole job) until its trial is re-queued. A SIGKILLed worker takes
its child with it (parent-death signal) and leaves its trial to the heartbeat.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from lightning_modules.run.results import RunResult, read_results
from lightning_modules.run.slurm import REQUEUE_SIGNAL, on_slurm
from sweeps.optuna_api import (fail_running_trial, fail_stale_trials, frozen_trial, queue_retry,
                                retried_trial_number)
from sweeps.processes import EXIT_PRUNED, JOB_ENV, WORKER_ENV, spawn
from sweeps.space import SearchSpace, load_space
from sweeps.study import FINISHED, make_pruner, make_sampler, make_storage, pack_lines


@dataclass
class WorkerSettings:
    """Everything a worker needs, passed as JSON on its command line."""

    study: str
    storage: str
    space: str | None  # None: no sampled keys (queued trials only)
    n_trials: int
    runs_dir: str
    preset: str = "tiny"
    row: str = "base"
    config: str | None = None
    spec: str | None = None
    overrides: list[str] = field(default_factory=list)  # the command's run options, as key=value
    sampler: str = "tpe"
    objective: str = "ppl"
    pruner: str = "median"
    prune_startup_trials: int = 5
    prune_warmup_steps: int = 0
    heartbeat_s: int = 60
    seed: int | None = None
    queue_only: bool = False  # run queued trials only (Table 3); stop when none is waiting
    keep_translations: bool = False  # store dev hypotheses/references in the trial (for reports)


class TrialFailed(RuntimeError):
    """A trial's training process failed (its output is in the trial's run directory log)."""


class NothingQueued(RuntimeError):
    """A queue-only worker got a fresh trial because another worker took the last queued one."""


class Preempted(KeyboardInterrupt):
    """SLURM's pre-emption notice reached the worker: stop as on SIGTERM."""


class Objective:
    """Runs one trial in a child process and returns dev ppl or BLEU; records results as user attrs."""

    def __init__(self, settings: WorkerSettings, space: SearchSpace, storage: optuna.storages.BaseStorage) -> None:
        self.s, self.space, self.storage = settings, space, storage
        self.current: int | None = None

    def trial_overrides(self, trial: optuna.Trial) -> list[str]:
        attrs = trial.user_attrs
        if "overrides" in attrs:  # a retry copy: the same configuration
            return list(attrs["overrides"])
        if "enqueued_overrides" in attrs:
            return self.space.fixed_overrides() + list(attrs["enqueued_overrides"])
        return self.space.fixed_overrides() + self.space.sample(trial)

    def __call__(self, trial: optuna.Trial) -> float:
        self.current = trial.number
        queued = "overrides" in trial.user_attrs or "enqueued_overrides" in trial.user_attrs
        if self.s.queue_only and not queued:
            trial.set_user_attr("nothing_queued", True)
            raise NothingQueued(f"trial {trial.number}: no queued configuration left")
        twin = owner_of_run_dir(trial.study.get_trials(deepcopy=False), trial.number,
                                trial.user_attrs.get("run_dir"))
        if twin is not None:
            trial.set_user_attr("nothing_queued", True)
            trial.set_user_attr("duplicate_of", twin)
            raise NothingQueued(f"trial {trial.number}: trial {twin} trains in its run directory")
        overrides = self.trial_overrides(trial)
        run_dir = trial.user_attrs.get("run_dir") or str(
            (Path(self.s.runs_dir) / self.s.study / f"trial-{trial.number}").resolve())
        trial.set_user_attr("overrides", overrides)
        trial.set_user_attr("run_dir", run_dir)
        # host:pid:number. A retry copy inherits its dead predecessor's value (another number), so
        # no worker mistakes a copy that was just claimed for the dead worker's trial.
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}:{trial.number}")
        retried = retried_trial_number(frozen_trial(self.storage, self.s.study, trial.number))
        if retried is not None:
            trial.set_user_attr("retry_of", retried)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        row = trial.user_attrs.get("row")
        # W&B: a sweep's trials form one group; a table's rows each form one, its seeds the runs
        group = f"{self.s.study}/{row}" if row else self.s.study
        job = {"storage": self.s.storage, "study": self.s.study, "trial_number": trial.number,
               "pruner": [self.s.pruner, self.s.prune_startup_trials, self.s.prune_warmup_steps],
               "report": self.s.objective == "ppl", "out": run_dir,
               "preset": self.s.preset, "row": row or self.s.row,
               "config": self.s.config, "spec": self.s.spec,
               "overrides": [*self.s.overrides, *overrides, f"train.wandb_group={group}"]}
        env = {k: v for k, v in os.environ.items() if k != WORKER_ENV}
        child = spawn([sys.executable, "-m", "sweeps.trial_run"], env={**env, JOB_ENV: json.dumps(job)},
                      log=Path(run_dir) / "trial.log")
        try:
            code = child.wait()
        except KeyboardInterrupt as stop:
            _stop_child(child, stop)
            raise
        if code == EXIT_PRUNED:
            raise optuna.TrialPruned()
        results = read_results(Path(run_dir)) or RunResult()
        if results.status == "failed":  # e.g. a NaN loss: the reason goes with the trial
            trial.set_user_attr("fail_reason", results.reason)
            raise TrialFailed(f"trial {trial.number} failed: {results.reason}")
        if code != 0 or results.status != "complete":
            trial.set_user_attr("fail_reason", f"exit status {code}")
            raise TrialFailed(f"trial {trial.number} exited with status {code}; see {run_dir}/trial.log")
        for key, value in results.select("trial").items():
            trial.set_user_attr(key, value)
        if self.s.queue_only:  # Table 3: one line per finished row instead of Optuna's log
            print(f"{trial.user_attrs.get('row')} seed {results.seed}: "
                  f"{results.convergence or 'unclassified'}, dev PPL {results.ppl}, "
                  f"dev BLEU {results.bleu}, {results.train_time_s} s training, "
                  f"{results.params:,} parameters", flush=True)
        if self.s.keep_translations:
            for name in ("hyp", "ref"):
                lines = (Path(run_dir) / f"dev.{name}.txt").read_text(encoding="utf-8").splitlines()
                trial.set_user_attr(f"dev_{name}", pack_lines(lines))
        return float(getattr(results, self.s.objective))


def owner_of_run_dir(trials: list[optuna.trial.FrozenTrial], number: int, run_dir: str | None) -> int | None:
    """Another trial that owns the queued run directory of trial `number`: a complete one, or a
    waiting or running one with a lower number (None: `number` may train there).

    Two launchers queueing one table at the same moment (array tasks starting together) can both
    queue a (row, seed). Claims are exclusive, and the lowest-numbered live copy never yields, so
    exactly one of the copies trains in the directory; the others end as empty claims.
    """
    if run_dir is None:
        return None
    for t in trials:
        if t.number == number or t.user_attrs.get("run_dir") != run_dir:
            continue
        if t.state == TrialState.COMPLETE or (t.number < number and t.state in (TrialState.WAITING,
                                                                                TrialState.RUNNING)):
            return t.number
    return None


def should_start(study: optuna.Study, settings: WorkerSettings) -> bool:
    """Whether another trial is needed: finished + running < n_trials, and not failing endlessly."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    finished = sum(s in FINISHED for s in states)
    running = states.count(TrialState.RUNNING)
    # a spare worker that found the queue empty records a FAIL trial: not a failure of a run
    failed = sum(t.state == TrialState.FAIL and not t.user_attrs.get("nothing_queued") for t in trials)
    if failed >= max(settings.n_trials, 3):
        print(f"worker {os.getpid()}: too many failed trials, stopping", file=sys.stderr)
        return False
    return finished + running < settings.n_trials


def _stop_child(child: subprocess.Popen, stop: KeyboardInterrupt) -> None:
    """Pass the stop on to the trial (SIGUSR1 for a pre-emption notice, else SIGINT) and give it
    two minutes to save its checkpoint; further stop signals are ignored meanwhile."""
    for sig in (signal.SIGTERM, REQUEUE_SIGNAL):
        signal.signal(sig, signal.SIG_IGN)
    child.send_signal(REQUEUE_SIGNAL if isinstance(stop, Preempted) else signal.SIGINT)
    try:
        child.wait(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _raise_preempted(signum: int, frame: Any) -> None:
    signal.signal(REQUEUE_SIGNAL, signal.SIG_IGN)  # once: SLURM and the launcher may both send it
    raise Preempted


class _NoInterruptTraceback(logging.Filter):
    """Optuna logs a trial stopped by Ctrl-C/SIGTERM with a traceback; the worker says it in a line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt))


def run_worker(settings: WorkerSettings) -> int:
    """Optimise until the study has `n_trials` finished trials; 130 when interrupted."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if on_slurm():
        signal.signal(REQUEUE_SIGNAL, _raise_preempted)
    for handler in optuna.logging.get_logger("optuna").handlers:  # records of optuna.* reach these
        handler.addFilter(_NoInterruptTraceback())
    if settings.queue_only:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(settings.space) if settings.space else SearchSpace(path="", params=())
    storage = make_storage(settings.storage, settings.heartbeat_s)
    sampler = make_sampler(settings.sampler, space, settings.seed)
    study = optuna.load_study(study_name=settings.study, storage=storage, sampler=sampler,
                              pruner=make_pruner(settings.pruner, settings.prune_startup_trials,
                                                 settings.prune_warmup_steps))
    objective = Objective(settings, space, storage)
    stop_at_n = MaxTrialsCallback(settings.n_trials, states=FINISHED)
    try:
        while True:
            fail_stale_trials(study)  # before counting: a dead worker's trial is not "running"
            reclaim_dead_local_trials(study, storage)
            if not should_start(study, settings):
                break
            if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study):
                break
            if settings.queue_only and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                break
            try:
                study.optimize(objective, n_trials=1, callbacks=[stop_at_n],
                               catch=(TrialFailed, NothingQueued))
            except (UpdateFinishedTrialError, ValueError) as err:  # another worker finished it first
                if not isinstance(err, UpdateFinishedTrialError) and "Cannot tell" not in str(err):
                    raise
                print(f"worker {os.getpid()}: trial {objective.current} was finished by another "
                      f"worker; going on", file=sys.stderr)
    except KeyboardInterrupt as stop:
        for sig in (signal.SIGTERM, REQUEUE_SIGNAL):  # a requeue's SIGTERM must not cut this short
            signal.signal(sig, signal.SIG_IGN)
        _requeue_interrupted(study, objective.current)
        how = "pre-empted" if isinstance(stop, Preempted) else "interrupted"
        print(f"worker {os.getpid()}: {how}; trial {objective.current} resumes from its "
              f"checkpoint when the same command runs again", file=sys.stderr)
        return 130
    return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _worker_of(value: str) -> tuple[str, int | None, int | None]:
    """(host, pid, trial number) of a `worker` attribute 'host:pid:number'."""
    parts = value.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return "", None, None
    return parts[0], int(parts[1]), int(parts[2])


def reclaim_dead_local_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """Fail and re-queue RUNNING trials whose worker ran on this host and is gone.

    The heartbeat finds every dead worker's trial, but only after its grace period; a worker on
    this machine can tell at once (its pid is gone), so a re-run right after a kill resumes the
    trial instead of waiting. Returns the numbers of the trials reclaimed.
    """
    host, reclaimed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        name, pid, number = _worker_of(str(trial.user_attrs.get("worker", "")))
        if number != trial.number:  # a retry copy whose new worker has not recorded itself yet
            continue
        if name != host or pid is None or _pid_alive(pid):
            continue
        if not fail_running_trial(storage, study.study_name, trial.number):  # the heartbeat was quicker
            continue
        queue_retry(study, frozen_trial(storage, study.study_name, trial.number))
        reclaimed.append(trial.number)
    return reclaimed


def _requeue_interrupted(study: optuna.Study, number: int | None) -> None:
    """Queue a retry copy of the trial that an interrupt failed (same configuration and run dir)."""
    if number is None:
        return
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is not None and trial.state == TrialState.FAIL:
        queue_retry(study, trial)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return run_worker(WorkerSettings(**json.loads(args[0] if args else os.environ[WORKER_ENV])))


def settings_json(settings: WorkerSettings) -> str:
    return json.dumps(asdict(settings))


if __name__ == "__main__":
    sys.exit(main())
