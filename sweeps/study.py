"""The Optuna study of a sweep (in a `sweeps.storage`): create-or-load, sampler, pruner, queue, and
the trials queued to replace complete ones (`REDO_OF`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from foundation.errors import UserError
from ablations.resolve import parse_overrides
from sweeps.optuna_api import quiet_optuna
from sweeps.space import SearchSpace

OBJECTIVES = {"ppl": "minimize", "bleu": "maximize"}  # dev perplexity / dev BLEU
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)  # the trials that count towards --n-trials
HALVING = 3  # successive halving's reduction factor: a rung's best third goes on
REDO_OF = "redo_of"  # trial user attribute: the number of the complete trial this one replaces (a redo)
# A queued trial's own pruning attribute, in place of `--pruner`: {"pruner", "min_resource", "cohort",
# "reference"}: it competes only with its cohort; a reference reports its rungs and is never stopped.
PRUNING = "pruning"


def superseded(trials: Iterable[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials a redo (`REDO_OF`) replaces (whether or not the redo has finished)."""
    return {int(t.user_attrs[REDO_OF]) for t in trials if t.user_attrs.get(REDO_OF) is not None}


def open_study(name: str, storage: BaseStorage | str, objective: str = "ppl") -> optuna.Study:
    """Create the study, or load it if it exists (its direction must match `objective`)."""
    direction = OBJECTIVES[objective]
    with quiet_optuna():
        study = optuna.create_study(study_name=name, storage=storage, direction=direction, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise UserError(f"study {name!r} exists and is {study.direction.name.lower()}d; "
                        f"--objective {objective} needs {direction}: use another --study")
    saved = study.user_attrs.get("objective")
    if saved is None:
        study.set_user_attr("objective", objective)
    elif saved != objective:
        raise UserError(f"study {name!r} optimises {saved}, not {objective}: use another --study")
    return study


def make_sampler(name: str, space: SearchSpace, seed: int | None = None) -> optuna.samplers.BaseSampler:
    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(name: str, startup_trials: int = 5, warmup_steps: int = 0) -> optuna.pruners.BasePruner:
    """Median, 25th-percentile, Hyperband, halving (`HALVING`) or no pruning on step-keyed dev PPL."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)
    if name == "percentile":
        return optuna.pruners.PercentilePruner(25.0, n_startup_trials=startup_trials,
                                               n_warmup_steps=warmup_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup_steps))
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, warmup_steps), reduction_factor=HALVING)
    return optuna.pruners.NopPruner()


def in_cohort(cohort: str | None) -> Callable[[optuna.trial.FrozenTrial], bool] | None:
    """Whether a trial belongs to `cohort` (`PRUNING`); None for no cohort (the whole study)."""
    if cohort is None:
        return None
    return lambda trial: (trial.user_attrs.get(PRUNING) or {}).get("cohort") == cohort


def enqueue(study: optuna.Study, overrides: list[str], user_attrs: dict[str, Any] | None = None) -> bool:
    """Queue a fixed configuration unless one alike is live or finished and not superseded; whether it was."""
    wanted = parse_overrides(overrides)
    row = (user_attrs or {}).get("row")
    live = (*COUNTED, TrialState.WAITING, TrialState.RUNNING)
    trials = study.get_trials(deepcopy=False)
    replaced = superseded(trials) | {(user_attrs or {}).get(REDO_OF)}
    for trial in trials:
        if trial.state not in live or trial.number in replaced:
            continue
        queued = trial.user_attrs.get("enqueued_overrides")
        if queued is not None and parse_overrides(queued) == wanted and trial.user_attrs.get("row") == row:
            return False
    study.enqueue_trial({}, user_attrs={**(user_attrs or {}), "enqueued_overrides": list(overrides)},
                        skip_if_exists=False)
    return True
