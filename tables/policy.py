"""How a table's sweep workers take and report its runs (`TablePolicy`, a `sweeps.worker.Policy`):
queued runs only, in parts that start only what can finish, one line per finished run, and the
dev translations kept on the trial for the report's paired bootstrap.

The worker builds the policy in its own process from `WorkerSettings.policy` ("module:Class") and
`policy_args`, so the sweeps know nothing of tables.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from ablations.record import TUNE, tuned_name
from foundation.records import pack_lines
from foundation.rundir import saved_config
from lightning_modules.metrics_log import last_step
from lightning_modules.run.results import RunResult
from sweeps.launch import describe_duration
from sweeps.optuna_api import retried_trial_number
from sweeps.study import PRUNING
from sweeps.worker import Policy, resolve_run_dir

NAME = f"{__name__}:TablePolicy"  # what `WorkerSettings.policy` names


def own_or_overall(measured: Iterable[tuple[str, float]]) -> Callable[[str], float | None]:
    """How a table's measured runs speak for a row (`measured`: (row, value) per run): the median of
    the row's own values, or the median over every row for a row with none (FLOPs alone miss what
    makes a row slow: A3's 16 heads of 4 dimensions train below A2's tokens/s with the same
    parameters); None before any run is measured. Medians, so that one run slowed by other work
    beside it does not speak for the rest. Both `--dry-run`'s time left at each row's own rate
    (`tables.progress`) and a part's choice of runs that fit (`pace`) read it."""
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


def translation_attrs(run_dir: Path) -> dict[str, str] | None:
    """A run's dev hypotheses and references as a trial keeps them (`dev_hyp`, `dev_ref`: the
    report's paired bootstrap), or None when the run directory lacks either file."""
    paths = {name: Path(run_dir) / f"dev.{name}.txt" for name in ("hyp", "ref")}
    if not all(path.is_file() for path in paths.values()):
        return None
    return {f"dev_{name}": pack_lines(path.read_text(encoding="utf-8").splitlines()) for name, path in paths.items()}


class TablePolicy(Policy):
    """A table's runs: queued ones only. With a part's end (`finish_by`, `--stop-after`, seconds
    since the epoch) and each row's expected run time on one worker (`run_seconds`,
    `tables.cost.run_seconds`), a worker claims only the queued runs it expects to finish in
    time: a run still training at a part's end is stopped, and its checkpoint, git-ignored, does not
    travel with a committed archive. A run's expectation is its row's estimate times the pace of this
    study's finished runs (`pace`), times the part still ahead (`ahead`: a stopped run resumes from its
    checkpoint; a tuning candidate short of its first rung: to it, as planned); else it starts."""

    queue_only = True

    def __init__(self, runs_dir: str, finish_by: float | None = None,
                 run_seconds: dict[str, float] | None = None) -> None:
        self.runs_dir, self.finish_by, self.run_seconds = runs_dir, finish_by, dict(run_seconds or {})
        self.pace: Callable[[str], float] = lambda row: 1.0

    def update(self, study: optuna.Study) -> None:
        self.pace = pace(study.get_trials(deepcopy=False), self.run_seconds)

    def expected_s(self, trial: optuna.trial.FrozenTrial) -> float | None:
        row, ahead = trial.user_attrs.get("row"), self.ahead(trial)
        estimate, candidate = self.run_seconds.get(row), (trial.user_attrs.get(PRUNING) or {}).get("reference") is False
        rung = self.run_seconds.get(tuned_name(row, trial.user_attrs[TUNE])) if candidate and estimate else None
        left = ahead if rung is None or rung / estimate <= 1.0 - ahead else rung / estimate - (1.0 - ahead)
        return None if estimate is None else estimate * self.pace(row) * left

    def ahead(self, trial: optuna.trial.FrozenTrial) -> float:
        """The part of a run's training still ahead: a retry copy resumes from its checkpoint, so
        its last logged step of its `train.max_steps` is behind it (1.0 for a run never started,
        and where its run directory is not on this machine)."""
        if not (place := trial.user_attrs.get("run_dir")) or retried_trial_number(trial) is None:
            return 1.0
        run = resolve_run_dir(self.runs_dir, place)
        try:
            max_steps = int(saved_config(run)["train"]["max_steps"])  # type: ignore[index]
        except (KeyError, TypeError, ValueError):  # TypeError: no config (None)
            return 1.0
        return max(0.0, 1.0 - last_step(run / "logs") / max_steps) if max_steps > 0 else 1.0

    def takes(self, trial: optuna.trial.FrozenTrial) -> bool:
        expected = self.expected_s(trial)
        return self.finish_by is None or expected is None or time.time() + expected <= self.finish_by

    def none_taken(self, waiting: list[optuna.trial.FrozenTrial]) -> str:
        first = min(waiting, key=lambda t: self.expected_s(t) or 0.0)
        row = first.user_attrs.get("row")
        return (f"the {len(waiting)} queued run(s) left cannot finish in the "
                f"{describe_duration(max(0.0, (self.finish_by or 0) - time.time()))} left of this part "
                f"(--stop-after; the shortest, {row}, is expected to take "
                f"{describe_duration(self.expected_s(first) or 0.0)}, {self.pace(row):.2f} x its "
                f"estimate); leaving them for the next part")

    def done(self, trial: optuna.Trial, results: RunResult, run_dir: Path) -> None:
        """One line per finished run, and its dev translations on the trial (a run restored from its
        results.json alone, `tables.archive`, has none: said, not failed)."""
        row, setting = trial.user_attrs.get("row"), trial.user_attrs.get(TUNE)
        row = row if setting is None else tuned_name(row, setting)  # a tuned run (`tables.tune`)
        print(f"{row} seed {results.seed}: {results.convergence or 'unclassified'}, dev PPL {results.ppl}, "
              f"dev BLEU {results.bleu}, {results.train_time_s} s training, {results.params:,} parameters",
              flush=True)
        kept = translation_attrs(run_dir)
        if kept is None:
            print(f"{row} seed {trial.user_attrs.get('seed')}: no dev translations in {run_dir}; the report's "
                  f"paired bootstrap leaves this run out", flush=True)
            return
        for key, value in kept.items():
            trial.set_user_attr(key, value)
