"""`sweeps/slurm/array.sbatch` on a real SLURM: a single-node cluster of Debian's slurm-wlm and
munge that the test starts (`slurm_cluster.py`), a real array job of Table 3, and both ways a
cluster pre-empts a task: `scontrol requeue` (SLURM stops the task's processes and runs the task
again) and `--signal=USR1@N`, SLURM's own notice before the time limit (the trial saves, requeues
its task with `scontrol requeue`, and the requeued task resumes it). Every (row, seed) ends exactly
once. The cases that need several nodes, or a notice at an exact moment of a process's start-up,
stay in test_slurm.py, with SLURM simulated.

To pre-empt while a run trains, each trial holds itself after step 7 (`ABLATE_FAULT=train_step@7:
SIGSTOP`); SLURM continues a process before it signals it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from slurm_cluster import Cluster, start_cluster
from test_table3 import SMALL

RECIPE = Path(__file__).resolve().parents[1] / "sweeps" / "slurm" / "array.sbatch"
ROWS = ["base", "E"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from start_cluster(tmp_path_factory.mktemp("slurm"))


def held_trials(job: str) -> dict[str, int]:
    """Each array task's trial process that holds itself (state T), by task id."""
    held = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
                continue
            env = dict(item.split("=", 1) for item in (stat.parent / "environ").read_text().split("\0") if "=" in item)
        except (OSError, IndexError, ValueError):
            continue
        if env.get("SLURM_ARRAY_JOB_ID") == job:
            held[env["SLURM_ARRAY_TASK_ID"]] = int(stat.parent.name)
    return held


def wait(what: str, check, cluster: Cluster, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{cluster.logs()}")
        time.sleep(0.2)
    return found


def submit(cluster: Cluster, tmp_path: Path, tasks: str, *options: str) -> tuple[str, Path]:
    """`sbatch --array=TASKS sweeps/slurm/array.sbatch table3 ... --no-report` (base and E, tiny, 10 steps, one
    worker a task, every trial held after step 7), its study's journal in `tmp_path`: the job id and
    the journal. The workers' threads are left to the task's cores (no $OMP_NUM_THREADS)."""
    journal = tmp_path / "sweeps.journal"
    env = cluster.env(ABLATE=str(Path(sys.executable).parent / "ablate"), ABLATE_STORAGE=f"journal:///{journal}",
                      ABLATE_FAULT="train_step@7:SIGSTOP", PYTHONUNBUFFERED="1")
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(key, None)
    job = cluster.sbatch(f"--array={tasks}", "--gpus-per-task=0", "--cpus-per-task=1", "--mem=1G", *options,
                         f"--output={tmp_path}/slurm-%A_%a.out", str(RECIPE), "table3", "--preset", "tiny",
                         "--rows", ",".join(ROWS), "--seeds", "1", "--runs-dir", str(tmp_path / "runs"), "--no-report", *SMALL,
                         env=env, cwd=tmp_path)
    return job, journal


def ended_once(cluster: Cluster, tmp_path: Path, job: str, journal: Path, requeued: list[str]) -> None:
    """Wait for the array to end; then each (row, seed) is complete exactly once, each run at its
    last step, trained on one thread (`--cpus-per-task=1` on a node of more cores), and each task in
    `requeued` ran twice."""
    wait("the array to end", lambda: not cluster.jobs(job), cluster, timeout=400)
    for task in requeued:
        text = (tmp_path / f"slurm-{job}_{task}.out").read_text()
        assert f"array task {job}_{task} (restart 1)" in text and "Traceback" not in text, text[-3000:]
    study = optuna.load_study(study_name="table3-tiny", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))))
    complete = [(t.user_attrs["row"], t.user_attrs["seed"]) for t in study.trials if t.state == TrialState.COMPLETE]
    assert sorted(complete) == [(row, 1) for row in sorted(ROWS)]  # each exactly once
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in study.trials)
    for row in ROWS:
        results = json.loads((tmp_path / "runs" / "table3-tiny" / f"{row}-s1" / "results.json").read_text())
        assert results["status"] == "complete" and results["steps"] == 10
        assert results["environment"]["torch_threads"] == 1 < (os.cpu_count() or 1)
        assert not list((tmp_path / "runs" / "table3-tiny" / f"{row}-s1" / "checkpoints").glob("hpc_ckpt_*"))


def test_an_array_preempted_both_ways_resumes_and_ends_every_row_once(cluster: Cluster, tmp_path: Path):
    """Two array tasks, one worker each, on one journal study, each run held at step 7, under
    `--time=2 --signal=USR1@110`. Task 0 is requeued with `scontrol requeue`: SLURM stops its
    processes (SIGCONT, SIGTERM), the trial saves and goes back to the queue. Task 1 gets SLURM's
    own notice some 10 s after it starts (its timer looks every 30 s), which continues the held run
    (SIGCONT, then USR1): the trial saves, runs `scontrol requeue` for its task and stops, and the
    worker and the launcher say so. SLURM runs both tasks again, 11 s later (`cred_expire`); their
    time limit is raised meanwhile, so the reruns get no notice of their own. They resume, and the
    table ends with every (row, seed) complete exactly once."""
    job, journal = submit(cluster, tmp_path, "0-1", "--time=2", "--signal=USR1@110")
    wait("both tasks' runs to reach step 7", lambda: len(held_trials(job)) == 2, cluster)
    cluster.run("scontrol", "requeue", f"{job}_0")
    for task in ("0", "1"):
        wait(f"task {task} to be requeued", lambda: cluster.jobs(job).get(f"{job}_{task}") == "PENDING", cluster,
             timeout=120)
        cluster.run("scontrol", "update", f"JobId={job}_{task}", "TimeLimit=30")
    ended_once(cluster, tmp_path, job, journal, requeued=["0", "1"])
    first, second = ((tmp_path / f"slurm-{job}_{task}.out").read_text() for task in ("0", "1"))
    assert "pre-empted (SLURM)" in second and "pre-empted (SLURM)" not in first.split("(restart 1)")[0]
