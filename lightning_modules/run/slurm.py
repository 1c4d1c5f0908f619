"""SLURM pre-emption (docs/reliability.md, "SLURM pre-emption loses at most the current step"): the
notice (`#SBATCH --signal=USR1@90`) is recorded by every process (`foundation.stop`), never fatal; a
training process acts on it at a step's end (`callbacks.StopAtStepEnd`: save, `scontrol requeue`,
exit 130). A launcher noticed before any worker started requeues the job itself (`requeue_job`).
Nothing here loads torch: the sweep workers use `on_slurm` too."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from foundation.stop import REQUEUE_SIGNAL, STOP

def on_slurm(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this is a SLURM task, by Lightning's rule (SLURM_NTASKS set, not an interactive job)."""
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def keep_notices() -> None:
    """Under SLURM, from now on a pre-emption notice is recorded in `STOP`, not fatal."""
    if on_slurm():
        STOP.install(REQUEUE_SIGNAL)


def requeue_job() -> str:
    """`scontrol requeue` this job (or array task), as Lightning's handler does; the job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
    subprocess.run(["scontrol", "requeue", job], check=False)
    return job


def task_cores(env: Mapping[str, str] = os.environ) -> int:
    """The cores this process may use: a SLURM task's `--cpus-per-task`, else its CPU affinity, else
    the machine's (a node's count would give each of its tasks threads for the whole node)."""
    text = env.get("SLURM_CPUS_PER_TASK", "").strip()
    if on_slurm(env) and text.isascii() and text.isdigit() and int(text) > 0:
        return int(text)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1

