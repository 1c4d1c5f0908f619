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

from sweeps.processes import (EXIT_PRUNED, JOB_ENV, StopRequests, accept_interrupts, die_with_parent,
                               ignore_interrupts)

STOP = StopRequests()


def run_trial(job: dict[str, Any]) -> int:
    """Train the trial described by `job` (storage, study, trial_id, out, overrides, ...).

    Interrupts stay held while it loads the training stack (Lightning's imports make garbage
    that a stop could be dropped in, see `StopRequests`); a stop asked for then arrives once they
    are loaded, and one dropped later is raised at the next training batch."""
    import lightning.pytorch as pl
    import optuna

    from ablations.resolve import resolve
    from lightning_modules.run.train import train
    from sweeps.optuna_api import RunningTrial
    from sweeps.pruning import StepPruningCallback
    from sweeps.storage import make_storage
    from sweeps.study import make_pruner

    class StopWhenAsked(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            STOP.check()

    STOP.install()
    accept_interrupts()  # held since the process started (sweeps.processes.spawn)
    cfg = resolve(job["preset"], job["row"], job.get("config"), job["overrides"], job.get("spec"))
    trial = None
    if is_rank_zero():
        storage, pruner = make_storage(job["storage"], None), make_pruner(*job["pruner"])
        study = optuna.load_study(study_name=job["study"], storage=storage, pruner=pruner)
        trial = RunningTrial(study, storage, job["trial_number"], pruner)
    callback = StepPruningCallback(trial, prune=job["pruner"][0] != "none")
    callbacks = [StopWhenAsked(), *([callback] if job["report"] else [])]
    try:
        train(cfg, job["out"], group=job["study"], callbacks=callbacks)
    except optuna.TrialPruned as pruned:
        if trial is not None:
            print(f"trial {trial.number}: {pruned}", file=sys.stderr)
        return EXIT_PRUNED
    return 0


def is_rank_zero() -> bool:
    """Lightning sets LOCAL_RANK/NODE_RANK for the ranks it launches; the trial process is rank 0."""
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def main(argv: list[str] | None = None) -> int:
    from lightning_modules.errors import UserError

    args = sys.argv[1:] if argv is None else argv
    if not is_rank_zero():
        die_with_parent()  # an extra DDP rank goes when its trial process goes
    try:
        return run_trial(json.loads(args[0] if args else os.environ[JOB_ENV]))
    except UserError as err:
        print(f"ablate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        ignore_interrupts()


if __name__ == "__main__":
    sys.exit(main())
