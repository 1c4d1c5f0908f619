"""SLURM pre-emption: a run that is a SLURM job is requeued before its time runs out.

With `#SBATCH --signal=USR1@90` SLURM sends SIGUSR1 90 s before the job's time limit. Every
process of the job records it in its stop request (`foundation.stop.STOP`); it never kills a process.
A training process acts on it at the end of a training step (`callbacks.StopAtStepEnd`, every
DDP rank together): Lightning's `SLURMEnvironment(auto_requeue=True)` handler saves
`checkpoints/hpc_ckpt_N.ckpt` and runs `scontrol requeue $SLURM_JOB_ID`
(`${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}` in an array), and the run stops, exiting with
status 130 like any interrupted run; the requeued job runs the same command and resumes from the
newest checkpoint. A notice before training takes effect at the first step; one after training
lets the evaluation finish.

Start-up: the `ablate` command records the notice as its first act (`keep_notices`), and the
processes a sweep spawns hold the signal back (blocked, not lost) until they record it, so a
notice while Python starts, imports torch or prepares the data never kills a process. A launcher
noticed before it has started any worker requeues the job itself (`requeue_job`): nothing else
of the task could.

`train.slurm_requeue: false` turns this off (Lightning then gets `auto_requeue=False`). Nothing
here loads torch: the sweep workers use `on_slurm` too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from foundation.stop import REQUEUE_SIGNAL, STOP

def on_slurm(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a SLURM task, by Lightning's rule (`SLURMEnvironment.detect`):
    SLURM_NTASKS is set and the job is not named `bash` or `interactive` (an interactive
    allocation whose processes are started by hand)."""
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def keep_notices() -> None:
    """Under SLURM, from now on a pre-emption notice is recorded in `STOP`, not fatal."""
    if on_slurm():
        STOP.install(REQUEUE_SIGNAL)


def requeue_job() -> str:
    """`scontrol requeue` this job (an array task as ARRAY_JOB_TASK), as Lightning's handler does;
    returns the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
    subprocess.run(["scontrol", "requeue", job], check=False)
    return job


def task_cores(env: Mapping[str, str] = os.environ) -> int:
    """The cores this process may use: a SLURM task's `--cpus-per-task` ($SLURM_CPUS_PER_TASK),
    else the CPUs it may run on (its affinity: a job step bound to some of a node's cores), else the
    machine's. A node's own core count would give each of its tasks threads for the whole node."""
    text = env.get("SLURM_CPUS_PER_TASK", "").strip()
    if on_slurm(env) and text.isascii() and text.isdigit() and int(text) > 0:
        return int(text)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1

