"""A sweep worker (`python -m sweeps.worker`, settings as JSON in $ABLATE_WORKER): loops on
`study.optimize`, one trial at a time.

Each trial trains in a child process (`sweeps.trial_run`) in `<runs_dir>/<study>/trial-<number>`.
The trial's overrides and run directory are stored as user attributes when it starts, so a retry
copy (made by the heartbeat's `RetryHeartbeatStaleTrialCallback`, which copies user attributes)
trains the same configuration in the same directory, resuming from its checkpoint.

The worker stops when the finished (COMPLETE + PRUNED) plus running trials reach `n_trials`
(`MaxTrialsCallback` ends the current `optimize` call; the check before each trial keeps K
workers from overshooting), when a grid is exhausted, or after `n_trials` failures.

SIGTERM/SIGINT, and under SLURM SIGUSR1 (the pre-emption notice of `#SBATCH --signal=USR1@90`),
are only recorded (`lightning_modules.base.stop`); the worker acts on them where stopping cuts
nothing in two: before it claims a trial, while it waits, and while a trial's process trains. Then
the process gets SIGINT (SIGUSR1 for a pre-emption: it also requeues the job,
`lightning_modules/run/slurm.py`) and saves a checkpoint at the end of its step; Optuna records the
trial FAIL, and the worker queues a retry copy through the same `RetryHeartbeatStaleTrialCallback`:
re-running the sweep resumes it. A claim or a storage update is never cut in two, and a second
signal (a requeue sends SIGTERM to the whole job) never cuts the trial's clean stop short. A
SIGKILLed worker takes its child with it (parent-death signal); `sweeps.claims` says who takes its
trial back, and when. Killed, interrupted or pre-empted trials (they have a retry copy) and empty
claims (a spare worker's, or a copy of a row queued twice) are not failures.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from lightning_modules.base.rundir import claim, saved_config
from lightning_modules.base.errors import UserError, exit_status
from lightning_modules.metrics_log import last_step
from lightning_modules.run.results import RunResult, read_results
from lightning_modules.run.slurm import on_slurm
from lightning_modules.base.stop import INTERRUPTS, POLL_S, REQUEUE_SIGNAL, STOP, TO_TRIAL, StopRequest
from sweeps.claims import UnrecordedClaims, reclaim_dead_local_trials, worker_record
from sweeps.optuna_api import (RetriesFirstStudy, fail_stale_trials, frozen_trial, queue_retry, retried_numbers,
                               retried_trial_number)
from sweeps.processes import EXIT_PRUNED, JOB_ENV, WORKER_ENV, spawn
from sweeps.space import SearchSpace, load_space
from sweeps.storage import make_storage
from sweeps.study import FINISHED, make_pruner, make_sampler, superseded, translation_attrs


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
    # The end of a part (`--stop-after`, seconds since the epoch) and each row's estimated run time
    # on one worker: a queue-only worker claims only the queued runs expected to finish by then.
    finish_by: float | None = None
    run_seconds: dict[str, float] = field(default_factory=dict)


CLAIM_POLL_S = 2.0  # how often a queue-only worker looks again at a claim without its worker
STOP_GRACE_S = 120  # how long a trial's process may take to save and stop when asked to


class TrialFailed(RuntimeError):
    """A trial's training process failed (its output is in the trial's run directory log)."""


class Stopped(KeyboardInterrupt):
    """The worker was asked to stop while its trial trained (or was about to): raised by the
    objective, at its own safe point, so that Optuna records the trial FAIL; the worker then queues
    its retry copy."""


class NothingQueued(RuntimeError):
    """An empty claim: a queue-only worker got a fresh trial because another worker took the last
    queued one, or a copy of a (row, seed) queued twice yields to the trial `duplicate_of`."""

    def __init__(self, number: int, duplicate_of: int | None = None) -> None:
        super().__init__(f"trial {number}: " + ("no queued configuration left" if duplicate_of is None
                                                 else f"trial {duplicate_of} trains in its run directory"))
        self.number, self.duplicate_of = number, duplicate_of


class Objective:
    """Runs one trial in a child process and returns dev ppl or BLEU; records results as user attrs."""

    def __init__(self, settings: WorkerSettings, space: SearchSpace, storage: optuna.storages.BaseStorage,
                 stop: StopRequest = STOP) -> None:
        self.s, self.space, self.storage, self.stop = settings, space, storage, stop
        self.current: int | None = None  # the trial being run now (an interrupt queues its retry)
        self.last: int | None = None  # the trial run last

    def trial_overrides(self, trial: optuna.Trial) -> list[str]:
        attrs = trial.user_attrs
        if "overrides" in attrs:  # a retry copy: the same configuration
            return list(attrs["overrides"])
        if "enqueued_overrides" in attrs:
            return self.space.fixed_overrides() + list(attrs["enqueued_overrides"])
        return self.space.fixed_overrides() + self.space.sample(trial)

    def __call__(self, trial: optuna.Trial) -> float:
        self.current = self.last = trial.number
        try:
            value = self.run(trial)
        except Stopped:
            raise  # still current: the worker queues its retry
        except BaseException:
            self.current = None
            raise
        self.current = None
        return value

    def run(self, trial: optuna.Trial) -> float:
        queued = "overrides" in trial.user_attrs or "enqueued_overrides" in trial.user_attrs
        if self.s.queue_only and not queued:
            trial.set_user_attr("nothing_queued", True)
            raise NothingQueued(trial.number)
        # First of all, so that no claim stays without its worker (see sweeps.claims).
        trial.set_user_attr("worker", worker_record(trial.number))
        # A stop waits: a copy of a row queued twice ends as an empty claim, with its worker.
        twin = owner_of_run_dir(trial.study.get_trials(deepcopy=False), trial.number,
                                trial.user_attrs.get("run_dir"))
        if twin is not None:
            trial.set_user_attr("nothing_queued", True)
            trial.set_user_attr("duplicate_of", twin)
            raise NothingQueued(trial.number, duplicate_of=twin)  # like any empty claim: not current
        if trial.user_attrs.get("nothing_queued"):  # a retry copy of an empty claim that trains
            trial.set_user_attr("nothing_queued", False)
        overrides = self.trial_overrides(trial)
        place = trial.user_attrs.get("run_dir") or f"{self.s.study}/trial-{trial.number}"
        run_dir = str(resolve_run_dir(self.s.runs_dir, place))
        trial.set_user_attr("overrides", overrides)
        trial.set_user_attr("run_dir", place)
        retried = retried_trial_number(frozen_trial(self.storage, self.s.study, trial.number))
        if retried is not None:
            trial.set_user_attr("retry_of", retried)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        claim(Path(run_dir))  # ours before its trial.log is written (lightning_modules/base/rundir.py)
        row = trial.user_attrs.get("row")
        # W&B: a sweep's trials form one group; a table's rows each form one, its seeds the runs
        group = f"{self.s.study}/{row}" if row else self.s.study
        job = {"storage": self.s.storage, "study": self.s.study, "trial_number": trial.number,
               "pruner": [self.s.pruner, self.s.prune_startup_trials, self.s.prune_warmup_steps],
               "report": self.s.objective == "ppl", "out": run_dir,
               "preset": self.s.preset, "row": row or self.s.row,
               "config": self.s.config, "spec": self.s.spec,
               "overrides": [*self.s.overrides, *overrides, f"train.wandb_group={group}"]}
        code = self.train(job, Path(run_dir))
        return self.collect(trial, Path(run_dir), code)

    def train(self, job: dict[str, Any], run_dir: Path) -> int:
        """The trial process's exit status. A stop asked for before it starts keeps it from
        starting; one asked for while it runs is passed on (`_stop_child`). Either way the trial
        ends as `Stopped`, unless its process finished it meanwhile."""
        if self.stop.requested:
            raise Stopped()
        env = {k: v for k, v in os.environ.items() if k != WORKER_ENV}
        child = spawn([sys.executable, "-m", "sweeps.trial_run"], env={**env, JOB_ENV: json.dumps(job)},
                      log=run_dir / "trial.log")
        while True:
            try:
                return child.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            if self.stop.requested:
                code = _stop_child(child, self.stop.preempted)
                if code in (0, EXIT_PRUNED):  # it finished (or was pruned) before it could stop
                    return code
                raise Stopped()

    def collect(self, trial: optuna.Trial, run_dir: Path, code: int) -> float:
        """The trial's objective value from its results.json, its results as user attributes."""
        if code == EXIT_PRUNED:
            raise optuna.TrialPruned()
        results = read_results(run_dir) or RunResult()
        if results.status == "failed":  # e.g. a NaN loss: the reason goes with the trial
            trial.set_user_attr("fail_reason", results.reason)
            raise TrialFailed(f"trial {trial.number} failed: {results.reason}")
        if code != 0 or not results.complete:
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
            self.keep_translations(trial, run_dir)
        return float(getattr(results, self.s.objective))

    @staticmethod
    def keep_translations(trial: optuna.Trial, run_dir: Path) -> None:
        """The dev hypotheses and references as user attributes (the report's paired bootstrap).
        A run restored from its results.json alone (`ablate.table3.archive`) has none: said, not failed."""
        kept = translation_attrs(run_dir)
        if kept is None:
            print(f"{trial.user_attrs.get('row')} seed {trial.user_attrs.get('seed')}: no dev translations "
                  f"in {run_dir}; the report's paired bootstrap leaves this run out", flush=True)
            return
        for key, value in kept.items():
            trial.set_user_attr(key, value)


def resolve_run_dir(runs_dir: str | Path, place: str) -> Path:
    """Where a trial's run directory is on this machine: its `run_dir` attribute names it relative
    to the runs directory (`--runs-dir`), so that a study read in another folder or on another
    machine still finds its runs there."""
    return (Path(runs_dir) / place).resolve()


def owner_of_run_dir(trials: list[optuna.trial.FrozenTrial], number: int, run_dir: str | None) -> int | None:
    """Another trial that owns the queued run directory of trial `number`: a complete one, or a
    waiting or running one with a lower number (None: `number` may train there).

    Two launchers queueing one table at the same moment (array tasks starting together) can both
    queue a (row, seed). Claims are exclusive, and the lowest-numbered live copy never yields, so
    exactly one of the copies trains in the directory; the others end as empty claims.
    """
    if run_dir is None:
        return None
    replaced = superseded(trials)  # a redo trains where the run it replaces trained (`ablate.table3.redo`)
    for t in trials:
        if t.number == number or t.number in replaced or t.user_attrs.get("run_dir") != run_dir:
            continue
        if t.state == TrialState.COMPLETE or (t.number < number and t.state in (TrialState.WAITING,
                                                                                TrialState.RUNNING)):
            return t.number
    return None


def counted_failures(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The FAIL trials that count towards the "too many failed trials" stop: failed runs.

    Not failures of a run: an empty claim (a spare worker's, the queue being empty, or a copy of a
    row queued twice that yielded), and a trial whose worker was killed, interrupted or pre-empted,
    which has a retry copy that resumes it.
    """
    retried = retried_numbers(trials)
    return [t for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("nothing_queued")
            and t.number not in retried]


def should_start(study: optuna.Study, settings: WorkerSettings) -> bool:
    """Whether another trial is needed: finished + running < n_trials, and not failing endlessly."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    finished = sum(s in FINISHED for s in states)
    running = states.count(TrialState.RUNNING)
    if len(counted_failures(trials)) >= max(settings.n_trials, 3):
        print(f"worker {os.getpid()}: too many failed trials, stopping", file=sys.stderr)
        return False
    return finished + running < settings.n_trials


def describe_duration(seconds: float) -> str:
    """`2h 30m`, `90s`: a duration as a person writes it."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return " ".join(parts) or "0s"


def own_or_overall(measured: Iterable[tuple[str, float]]) -> Callable[[str], float | None]:
    """How a table's measured runs speak for a row (`measured`: (row, value) per run): the median of
    the row's own values, or the median over every row for a row with none (FLOPs alone miss what
    makes a row slow: on 2 cores, A3's 16 heads of 4 dimensions trained at two thirds of A2's
    tokens/s with the same parameters); None before any run is measured. Medians, so that one run
    slowed by other work beside it does not speak for the rest. Both `--dry-run`'s time left at
    each row's own rate (`ablate.table3.progress`) and a part's choice of runs that fit (`pace`) read it."""
    by_row: dict[str, list[float]] = {}
    for row, value in measured:
        by_row.setdefault(row, []).append(value)
    overall = statistics.median(v for values in by_row.values() for v in values) if by_row else None
    own = {row: statistics.median(values) for row, values in by_row.items()}
    return lambda row: own.get(row, overall)


def pace(trials: list[optuna.trial.FrozenTrial], run_seconds: dict[str, float]) -> Callable[[str], float]:
    """How many times its estimate a run of a row takes here: over this study's complete runs, the
    ratio of a run's training seconds (`train_time_s`, its own over every part it ran in: a resumed
    run counts whole, the time between parts not at all) to its row's estimate; the row's own
    median, or the median over every row for a row with none (`own_or_overall`);
    1.0 before any has finished."""
    ratios = own_or_overall(
        (row, float(t.user_attrs["train_time_s"]) / run_seconds[row]) for t in trials
        if t.state == TrialState.COMPLETE and (row := t.user_attrs.get("row")) in run_seconds
        and t.user_attrs.get("train_time_s"))
    return lambda row: ratios(row) or 1.0


@dataclass
class Part:
    """A part of a long table (`--stop-after`): a run still training at its end is stopped, and its
    checkpoint, git-ignored, does not travel with a committed archive, so a queue-only worker starts
    only the queued runs it expects to finish in time: each row's estimate (`ablate.table3.cost`) times the pace
    of this study's finished runs (`pace`), times the part of it still ahead (`ahead`: a stopped
    run resumes from its checkpoint). A run without an estimate always starts."""

    finish_by: float | None
    run_seconds: dict[str, float]
    runs_dir: str | Path | None = None  # where a retry copy's run directory and its progress are
    pace: Callable[[str], float] = lambda row: 1.0

    def update(self, study: optuna.Study) -> None:
        self.pace = pace(study.get_trials(deepcopy=False), self.run_seconds)

    def expected_s(self, trial: optuna.trial.FrozenTrial) -> float | None:
        row = trial.user_attrs.get("row")
        estimate = self.run_seconds.get(row)
        return None if estimate is None else estimate * self.pace(row) * self.ahead(trial)

    def ahead(self, trial: optuna.trial.FrozenTrial) -> float:
        """The part of a run's training still ahead: a retry copy resumes from its checkpoint, so
        its last logged step of its `train.max_steps` is behind it (1.0 for a run never started,
        and where its run directory is not on this machine)."""
        place = trial.user_attrs.get("run_dir")
        if self.runs_dir is None or not place or retried_trial_number(trial) is None:
            return 1.0
        run = resolve_run_dir(self.runs_dir, place)
        try:
            max_steps = int(saved_config(run)["train"]["max_steps"])  # type: ignore[index]
        except (KeyError, TypeError, ValueError):  # TypeError: no config (None)
            return 1.0
        return max(0.0, 1.0 - last_step(run / "logs") / max_steps) if max_steps > 0 else 1.0

    def fits(self, trial: optuna.trial.FrozenTrial) -> bool:
        expected = self.expected_s(trial)
        return self.finish_by is None or expected is None or time.time() + expected <= self.finish_by


def _stop_child(child: subprocess.Popen, preempted: bool) -> int:
    """Pass the stop on to the trial's process (SIGUSR1 for a pre-emption notice, else SIGINT) and
    give it `STOP_GRACE_S` to save its checkpoint; its exit status."""
    child.send_signal(REQUEUE_SIGNAL if preempted else TO_TRIAL)
    try:
        return child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


class _NoTrialTracebacks(logging.Filter):
    """Optuna logs every trial its objective raised in with a traceback. None is a bug here: a trial
    stopped by Ctrl-C/SIGTERM/pre-emption (the worker says it in a line: dropped), an empty claim,
    a spare worker's or a duplicate copy's (not news: dropped, with Optuna's "Trial N failed" line
    after it), a failed run (the reason in one line; the details are in its trial.log)."""

    def __init__(self) -> None:
        super().__init__()
        self.empty_claims: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, KeyboardInterrupt):
            return False
        if isinstance(error, NothingQueued):
            self.empty_claims.add(error.number)
            return False
        if isinstance(error, TrialFailed):
            record.exc_info = record.exc_text = None
        return not any(record.getMessage().startswith(f"Trial {n} ") for n in self.empty_claims)


def run_worker(settings: WorkerSettings) -> int:
    """Optimise until the study has `n_trials` finished trials; 130 when stopped."""
    # Held since the process started (sweeps.processes.spawn); from now on only recorded, and
    # acted on between trials, while the worker waits, and while a trial trains (Objective.train).
    STOP.install(*INTERRUPTS, *([REQUEUE_SIGNAL] if on_slurm() else []))
    for handler in optuna.logging.get_logger("optuna").handlers:  # records of optuna.* reach these
        handler.addFilter(_NoTrialTracebacks())
    if settings.queue_only:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(settings.space) if settings.space else SearchSpace(path="", params=())
    storage = make_storage(settings.storage, settings.heartbeat_s)
    sampler = make_sampler(settings.sampler, space, settings.seed)
    part = Part(settings.finish_by, settings.run_seconds, settings.runs_dir)
    study = RetriesFirstStudy(study_name=settings.study, storage=storage, sampler=sampler,
                              pruner=make_pruner(settings.pruner, settings.prune_startup_trials,
                                                 settings.prune_warmup_steps), claimable=part.fits)
    objective = Objective(settings, space, storage)
    unrecorded = UnrecordedClaims(2 * settings.heartbeat_s if settings.heartbeat_s else None)
    try:
        while not STOP.requested and next_trial_needed(study, storage, settings, sampler, unrecorded, STOP, part):
            run_one_trial(study, objective, settings)
    except Stopped:  # Optuna has recorded the trial FAIL
        pass
    if not STOP.requested:
        return 0
    _requeue_interrupted(study, objective.current)
    how = "pre-empted" if STOP.preempted else "interrupted"
    resumes = f"; trial {objective.current} resumes from its checkpoint when the same command runs " \
              f"again" if objective.current is not None else ""
    print(f"worker {os.getpid()}: {how}{resumes}", file=sys.stderr)
    return 130


def next_trial_needed(study: optuna.Study, storage: optuna.storages.BaseStorage, settings: WorkerSettings,
                      sampler: optuna.samplers.BaseSampler, unrecorded: UnrecordedClaims,
                      stop: StopRequest, part: Part | None = None) -> bool:
    """Take back dead workers' trials, then say whether to run another; a queue-only worker waits
    while a claim without its worker may still be queued again (and not once asked to stop), and
    stops when no queued run can finish before the part ends (`Part`)."""
    while True:
        fail_stale_trials(study)  # before counting: a dead worker's trial is not "running"
        reclaim_dead_local_trials(study, storage)
        for number in unrecorded.reclaim(study, storage):
            print(f"worker {os.getpid()}: trial {number} was claimed by a worker that died before "
                  f"recording itself; queued again", file=sys.stderr)
        if not should_start(study, settings):
            return False
        if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study):
            return False
        if not settings.queue_only:
            return True
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting and part is not None:
            part.update(study)
            if not any(part.fits(t) for t in waiting):
                first = min(waiting, key=lambda t: part.expected_s(t) or 0.0)
                row = first.user_attrs.get("row")
                print(f"worker {os.getpid()}: the {len(waiting)} queued run(s) left cannot finish in the "
                      f"{describe_duration(max(0.0, (part.finish_by or 0) - time.time()))} left of this part "
                      f"(--stop-after; the shortest, {row}, is expected to take "
                      f"{describe_duration(part.expected_s(first) or 0.0)}, {part.pace(row):.2f} x its "
                      f"estimate); leaving them for the next part", file=sys.stderr)
                return False
        if waiting:
            return True
        if not unrecorded.pending or stop.wait(CLAIM_POLL_S):
            return False


def run_one_trial(study: optuna.Study, objective: Objective, settings: WorkerSettings) -> None:
    """`study.optimize` for one trial; a trial another worker finished first is one line."""
    try:
        study.optimize(objective, n_trials=1, callbacks=[MaxTrialsCallback(settings.n_trials, states=FINISHED)],
                       catch=(TrialFailed, NothingQueued))
    except (UpdateFinishedTrialError, ValueError) as err:  # another worker finished it first
        if not isinstance(err, UpdateFinishedTrialError) and "Cannot tell" not in str(err):
            raise
        print(f"worker {os.getpid()}: trial {objective.last} was finished by another worker; going on",
              file=sys.stderr)


def _requeue_interrupted(study: optuna.Study, number: int | None) -> None:
    """Queue a retry copy of the trial that an interrupt failed (same configuration and run dir)."""
    if number is None:
        return
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is not None and trial.state == TrialState.FAIL:
        queue_retry(study, trial)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        return run_worker(WorkerSettings(**json.loads(args[0] if args else os.environ[WORKER_ENV])))
    except UserError as err:  # e.g. the database went away
        print(f"worker {os.getpid()}: error: {err}", file=sys.stderr)
        return exit_status(err)


if __name__ == "__main__":
    sys.exit(main())
