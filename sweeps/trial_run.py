"""One trial's training, in its own process (`python -m sweeps.trial_run`, the job as JSON in
$ABLATE_TRIAL_JOB: the environment, not the command line, since it holds the storage URL).

A fresh process per trial keeps memory from growing across trials. It trains through
`lightning_modules.run.train` with a `StepPruningCallback` bound to the trial in the shared
storage; exit status 0 = complete (results.json written), 3 = pruned, 2 = bad config, 130 = interrupted.

With `train.devices > 1` Lightning's DDP launcher re-runs this module once per extra rank with the
same JSON, so every rank trains the configuration the worker sampled; only rank 0 opens the study.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lightning_modules.run.slurm import keep_notices
from foundation.stop import INTERRUPTS, STOP
from sweeps.processes import EXIT_PRUNED, JOB_ENV, die_with_parent


def run_trial(job: dict[str, Any]) -> int:
    """Train the trial described by `job` (storage, study, trial number, out, its recipe, ...).

    The worker's stop (SIGINT) is recorded from the start (`foundation.stop`): the
    run saves and stops at the end of its next training step (`callbacks.StopAtStepEnd`), or at
    its first one if the stop came while it started; one after training lets the evaluation
    finish."""
    import optuna

    from ablations.resolve import Recipe
    from lightning_modules.run.train import train
    from sweeps.optuna_api import RunningTrial
    from sweeps.pruning import StepPruningCallback
    from sweeps.storage import make_storage
    from sweeps.study import in_cohort, make_pruner
    cfg = Recipe.from_json(job["recipe"]).resolve()
    trial = None
    if is_rank_zero():
        storage, pruner = make_storage(job["storage"], None), make_pruner(*job["pruner"])
        study = optuna.load_study(study_name=job["study"], storage=storage, pruner=pruner)
        trial = RunningTrial(study, storage, job["trial_number"], pruner, among=in_cohort(job.get("cohort")))
    callback = StepPruningCallback(trial, prune=job["pruner"][0] != "none", reference=bool(job.get("reference")))
    try:
        train(cfg, job["out"], group=job["study"], callbacks=[callback] if job["report"] else [])
    except optuna.TrialPruned as pruned:
        if trial is not None:
            print(f"trial {trial.number}: {pruned}", file=sys.stderr)
        return EXIT_PRUNED
    return 0


def is_rank_zero() -> bool:
    """Lightning sets LOCAL_RANK/NODE_RANK for the ranks it launches; the trial process is rank 0."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def main(argv: list[str] | None = None) -> int:
    from foundation.errors import UserError

    args = sys.argv[1:] if argv is None else argv
    STOP.install(*INTERRUPTS)  # held since the process started (sweeps.processes.spawn)
    keep_notices()
    if not is_rank_zero():
        die_with_parent()  # an extra DDP rank goes when its trial process goes
    try:
        return run_trial(json.loads(args[0] if args else os.environ[JOB_ENV]))
    except UserError as err:
        print(f"ablate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a run stopped at a step's end (train.py says it so)
        return 130


if __name__ == "__main__":
    sys.exit(main())
