"""A sweep worker (`python -m sweeps.worker`, its settings as JSON in $ABLATE_WORKER): loops on
`study.optimize`, one trial at a time.

Each trial trains in a child process (`sweeps.trial_run`) in `<runs_dir>/<study>/trial-<number>`.
The trial's overrides and run directory are stored as user attributes when it starts, so a retry
copy (made by the heartbeat's `RetryHeartbeatStaleTrialCallback`, which copies user attributes)
trains the same configuration in the same directory, resuming from its checkpoint.

The worker stops when the finished (COMPLETE + PRUNED) plus running trials reach `n_trials`
(`MaxTrialsCallback` ends the current `optimize` call; the check before each trial keeps K
workers from overshooting), when a grid is exhausted, or after `n_trials` failures.

SIGTERM/SIGINT, and under SLURM SIGUSR1 (the pre-emption notice of `#SBATCH --signal=USR1@90`),
are only recorded (`foundation.stop`); the worker acts on them where stopping cuts
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

import importlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from ablations.resolve import Recipe
from foundation.rundir import claim
from foundation.errors import UserError, exit_status
from lightning_modules.run.results import RunResult, read_results
from lightning_modules.run.slurm import on_slurm
from foundation.stop import INTERRUPTS, POLL_S, REQUEUE_SIGNAL, STOP, TO_TRIAL, StopRequest
from sweeps.claims import UnrecordedClaims, reclaim_dead_local_trials, worker_record
from sweeps.optuna_api import (RetriesFirstStudy, fail_stale_trials, frozen_trial, queue_retry, retried_numbers,
                               retried_trial_number)
from sweeps.processes import EXIT_PRUNED, JOB_ENV, WORKER_ENV, spawn
from sweeps.space import SearchSpace, load_space
from sweeps.storage import make_storage
from sweeps.study import COUNTED, PRUNING, make_pruner, make_sampler, superseded


@dataclass
class WorkerSettings:
    """Everything a worker needs, as JSON in $ABLATE_WORKER (`sweeps.launch.run_workers`)."""

    study: str
    storage: str
    space: str | None  # None: no sampled keys (queued trials only)
    n_trials: int
    runs_dir: str
    recipe: Recipe = field(default_factory=Recipe)  # what every trial is made from, before its own overrides
    sampler: str = "tpe"
    objective: str = "ppl"
    pruner: str = "median"
    prune_startup_trials: int = 5
    prune_warmup_steps: int = 0
    heartbeat_s: int = 60
    seed: int | None = None
    # How the worker takes and reports trials, a `Policy` of the caller's: "module:Class" and its
    # arguments (a table's: `tables.policy.TablePolicy`); None: a sampled sweep's
    policy: str | None = None
    policy_args: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "recipe": self.recipe.to_json()})

    @classmethod
    def from_json(cls, text: str) -> WorkerSettings:
        data = json.loads(text)
        return cls(**{**data, "recipe": Recipe.from_json(data.get("recipe") or {})})


class Policy:
    """How a worker takes and reports trials; this one is a sampled sweep's: every trial, sampled
    or queued, and nothing said beyond Optuna's own lines. A caller's own policy (a table's) is a
    subclass the worker builds from `WorkerSettings.policy`."""

    queue_only = False  # run queued trials only, and stop when none waits

    def update(self, study: optuna.Study) -> None:
        """Before the queue is looked at: what the policy learns from the study (a table's pace)."""

    def takes(self, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether this worker may claim the queued `trial` now."""
        return True

    def none_taken(self, waiting: list[optuna.trial.FrozenTrial]) -> str:
        """Why no trial of `waiting` may be claimed (the worker then stops)."""
        return "no queued trial may be claimed"

    def done(self, trial: optuna.Trial, results: RunResult, run_dir: Path) -> None:
        """A trial that finished, its results already on it."""


def load_policy(settings: WorkerSettings) -> Policy:
    """The settings' policy, built here (`module:Class` and its arguments), else a sweep's."""
    if settings.policy is None:
        return Policy()
    module, _, name = settings.policy.partition(":")
    return getattr(importlib.import_module(module), name)(**settings.policy_args)


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
                 stop: StopRequest = STOP, policy: Policy | None = None) -> None:
        self.s, self.space, self.storage, self.stop = settings, space, storage, stop
        self.policy = policy or Policy()
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
        if self.policy.queue_only and not queued:
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
        claim(Path(run_dir))  # ours before its trial.log is written (foundation/rundir.py)
        row = trial.user_attrs.get("row")
        # W&B: a sweep's trials form one group; a table's rows each form one, its seeds the runs
        group = f"{self.s.study}/{row}" if row else self.s.study
        recipe = self.s.recipe.plus(*overrides, f"train.wandb_group={group}", row=row)
        own = trial.user_attrs.get(PRUNING)  # the trial's own pruning, else the workers'
        pruner = [own["pruner"], 0, own["min_resource"]] if own else \
            [self.s.pruner, self.s.prune_startup_trials, self.s.prune_warmup_steps]
        job = {"storage": self.s.storage, "study": self.s.study, "trial_number": trial.number, "pruner": pruner,
               "cohort": (own or {}).get("cohort"), "reference": (own or {}).get("reference", False),
               "report": self.s.objective == "ppl", "out": run_dir, "recipe": recipe.to_json()}
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
        self.policy.done(trial, results, run_dir)
        return float(getattr(results, self.s.objective))


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
    replaced = superseded(trials)  # a redo trains where the run it replaces trained (`tables.redo`)
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
    """Whether another trial is needed: counted (complete or pruned) + running < n_trials, and not
    failing endlessly."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    counted = sum(s in COUNTED for s in states)
    running = states.count(TrialState.RUNNING)
    if len(counted_failures(trials)) >= max(settings.n_trials, 3):
        print(f"worker {os.getpid()}: too many failed trials, stopping", file=sys.stderr)
        return False
    return counted + running < settings.n_trials


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
    policy = load_policy(settings)
    if policy.queue_only:  # its policy says what it does, instead of Optuna's lines
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(settings.space) if settings.space else SearchSpace(path="", params=())
    storage = make_storage(settings.storage, settings.heartbeat_s)
    sampler = make_sampler(settings.sampler, space, settings.seed)
    study = RetriesFirstStudy(study_name=settings.study, storage=storage, sampler=sampler,
                              pruner=make_pruner(settings.pruner, settings.prune_startup_trials,
                                                 settings.prune_warmup_steps), claimable=policy.takes)
    objective = Objective(settings, space, storage, policy=policy)
    unrecorded = UnrecordedClaims(2 * settings.heartbeat_s if settings.heartbeat_s else None)
    try:
        while not STOP.requested and next_trial_needed(study, storage, settings, sampler, unrecorded, STOP, policy):
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
                      stop: StopRequest, policy: Policy | None = None) -> bool:
    """Take back dead workers' trials, then say whether to run another; a queue-only worker waits
    while a claim without its worker may still be queued again (and not once asked to stop), and
    stops when its policy takes none of the queued trials left (a table's part: `Policy.none_taken`)."""
    policy = policy or Policy()
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
        if not policy.queue_only:
            return True
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            policy.update(study)
            if not any(policy.takes(t) for t in waiting):
                print(f"worker {os.getpid()}: {policy.none_taken(waiting)}", file=sys.stderr)
                return False
            return True
        if not unrecorded.pending or stop.wait(CLAIM_POLL_S):
            return False


def run_one_trial(study: optuna.Study, objective: Objective, settings: WorkerSettings) -> None:
    """`study.optimize` for one trial; a trial another worker finished first is one line."""
    try:
        study.optimize(objective, n_trials=1, callbacks=[MaxTrialsCallback(settings.n_trials, states=COUNTED)],
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
        return run_worker(WorkerSettings.from_json(args[0] if args else os.environ[WORKER_ENV]))
    except UserError as err:  # e.g. the database went away
        print(f"worker {os.getpid()}: error: {err}", file=sys.stderr)
        return exit_status(err)


if __name__ == "__main__":
    sys.exit(main())
