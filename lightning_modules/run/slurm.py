"""SLURM pre-emption: a run that is a SLURM job is requeued before its time runs out.

With `#SBATCH --signal=USR1@90` SLURM sends SIGUSR1 90 s before the job's time limit. During
training, Lightning's `SLURMEnvironment(auto_requeue=True)` handles it: it saves
`checkpoints/hpc_ckpt_N.ckpt` and runs `scontrol requeue $SLURM_JOB_ID`
(`${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}` in an array). `callbacks.RequeueAtStepEnd` runs
Lightning's handler at the end of the current training step instead of inside it (no checkpoint
holds half an optimizer step, as with SIGTERM) and then stops the run, which exits with status
130 like any interrupted run; the requeued job runs the same command and resumes from the newest
checkpoint. Outside training (data set-up, final evaluation) `PreemptionNotice` only records the
signal, so that it does not kill the process: a notice before training takes effect at the first
step, one after training lets the evaluation finish.

Start-up: the `ablate` command installs the process's one notice (`NOTICE`) as its first act, and
the processes a sweep spawns hold the signal back (blocked, not lost) until they install theirs,
so a notice while Python starts, imports torch or prepares the data never kills a process. A
launcher noticed before it has started any worker requeues the job itself (`requeue_job`):
nothing else of the task could.

`train.slurm_requeue: false` turns this off (Lightning then gets `auto_requeue=False`). Nothing
here loads torch: the sweep workers use `on_slurm` too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

REQUEUE_SIGNAL = signal.SIGUSR1  # what `#SBATCH --signal=USR1@90` sends; Lightning's default


def on_slurm(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a SLURM task, by Lightning's rule (`SLURMEnvironment.detect`):
    SLURM_NTASKS is set and the job is not named `bash` or `interactive` (an interactive
    allocation whose processes are started by hand)."""
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


class PreemptionNotice:
    """Records REQUEUE_SIGNAL while it is installed (the main thread's handler)."""

    def __init__(self) -> None:
        self.pending = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(REQUEUE_SIGNAL, self._note)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {REQUEUE_SIGNAL})  # held since spawn, if it was

    def _note(self, signum: int, frame: Any) -> None:
        self.pending = True


NOTICE = PreemptionNotice()  # the process's one notice (a signal handler is process-wide too)


def keep_notices() -> None:
    """Under SLURM, from now on a pre-emption notice is recorded in `NOTICE`, not fatal."""
    if on_slurm():
        NOTICE.install()


def requeue_job() -> str:
    """`scontrol requeue` this job (an array task as ARRAY_JOB_TASK), as Lightning's handler does;
    returns the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
    subprocess.run(["scontrol", "requeue", job], check=False)
    return job
