"""SLURM pre-emption, with SLURM simulated, where a real cluster cannot reach (test_slurm_cluster.py
runs the array recipe on a real one): a notice at a chosen moment of a process's start-up, two
DDP ranks, a suspended run. The environment variables a SLURM task has, a fake `scontrol` on PATH
that records its arguments (the one SLURM program Lightning calls), and a real SIGUSR1 sent from
outside to real processes, as `#SBATCH --signal=USR1@90` does.

To signal at a known step the run stops itself there with SIGSTOP (`ABLATE_FAULT=train_step@7:
SIGSTOP`); the test sends SIGUSR1 to the stopped process (and, for a sweep, to every process of
the job, as SLURM does) and then SIGCONT.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from optuna.trial import TrialState

from ablate.cli import main
from lightning_modules.run.slurm import on_slurm
from test_faults import SMALL

JOB = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
       "SLURM_NODEID": "0", "SLURM_JOB_NAME": "table3"}


def slurm_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment as a SLURM task's, with a fake `scontrol` that appends its arguments to
    tmp/scontrol.log."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp / "scontrol.log"}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "ABLATE_FAULT"}
    return {**env, **JOB, **extra, "PATH": f"{bin_dir}:{env['PATH']}", "PYTHONUNBUFFERED": "1"}


def state(pid: int) -> str:
    """The process's state letter from /proc (T = stopped), '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def wait_until_stopped(root: subprocess.Popen, timeout: float = 300) -> int:
    """The pid of the process (root or below) that stopped itself; fails if none does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and root.poll() is None:
        stopped = [p for p in [root.pid, *descendants(root.pid)] if state(p) == "T"]
        if stopped:
            return stopped[0]
        time.sleep(0.1)
    root.kill()
    output = root.communicate()[0] or ""  # None where its output went elsewhere than a pipe
    pytest.fail(f"no process stopped at the fault point; output: {output[-3000:]}")


@contextlib.contextmanager
def slurm_task_here(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], cwd: Path | None = None) -> Iterator[None]:
    """This process with `env` (`slurm_env`'s) as its environment, and `cwd`, for a command run in
    it (`ablate.cli.main`, "the same command again"); the pre-emption notice's handler that the
    command installs under SLURM is put back after, and so are the variables and the folder."""
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if cwd is not None:
        monkeypatch.chdir(cwd)
    handler = signal.getsignal(signal.SIGUSR1)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, handler)
        monkeypatch.undo()


def checkpoint_steps(folder: Path) -> dict[str, int]:
    return {p.name: torch.load(p, weights_only=True)["global_step"] for p in folder.glob("*.ckpt")}


@pytest.mark.parametrize("env, expected", [
    ({}, False), ({"SLURM_JOB_ID": "1"}, False), ({"SLURM_NTASKS": "1"}, True),
    ({"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash"}, False),
    ({"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "interactive"}, False),
    ({"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "table3"}, True)])
def test_slurm_is_detected_by_lightnings_rule(monkeypatch, env: dict[str, str], expected: bool):
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert on_slurm() == SLURMEnvironment.detect() == expected


HELD = 15  # seconds a run is held suspended


def test_a_run_suspended_mid_training_does_not_count_the_suspension_as_training_time(tmp_path: Path):
    """`scontrol suspend` (and Ctrl-Z) stop every process of the job with SIGSTOP, the host clock
    running on; `scontrol resume` sends SIGCONT. A run held 15 s at step 12 (inside the steady
    window, steps 10-20) finishes as usual, and neither its training time nor its steady rate
    counts those 15 s."""
    out = tmp_path / "run"
    started = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "ablate", "train", "--out", str(out), *SMALL],
                           env={**os.environ, "ABLATE_FAULT": "train_step@12:SIGSTOP"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = wait_until_stopped(run)
    held = time.monotonic()
    time.sleep(HELD)
    os.kill(pid, signal.SIGCONT)
    held = time.monotonic() - held  # at least HELD: the process was stopped before it began
    output = run.communicate(timeout=300)[0]
    lifetime = time.monotonic() - started
    assert run.returncode == 0, output[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["steps"] == 20
    # Counting the hold would make the training time at least HELD, and more than the process's
    # lifetime less the hold (its start-up, some 7 s of imports, is not training). 20 steps of a
    # 1-layer, 32-wide model take a second or two, well under HELD even on a machine oversubscribed
    # several times. (The stopwatch's own exactness is test_training's stopped-stretch test.)
    seen = (results, f"lifetime {lifetime:.1f} s, held {held:.1f} s")  # a failure's rates and times, to tell load from counting
    assert results["train_time_s"] < HELD, seen
    assert results["train_time_s"] < lifetime - held, seen
    assert results["tokens_per_s"] >= results["target_tokens"] / (results["train_time_s"] + 0.05)  # 1 decimal
    # the steady window (steps 10-20, a part of target_tokens) holds the stop: counted, its rate would
    # fall below target_tokens / HELD
    assert results["steady_tokens_per_s"] > results["target_tokens"] / HELD, results




def test_notice_during_start_up_is_kept_and_requeues_at_the_first_step(tmp_path: Path):
    """SIGUSR1 while `ablate train` starts (before its checks, data and Trainer) does not kill it:
    the notice is kept, and at the end of the first step the run saves, requeues and stops."""
    out = tmp_path / "run"
    env = slurm_env(tmp_path)
    run = subprocess.Popen([sys.executable, "-m", "ablate", "train", "--out", str(out), *SMALL],
                           env={**env, "ABLATE_FAULT": "startup:SIGSTOP"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = wait_until_stopped(run)
    os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGCONT)
    output = run.communicate(timeout=300)[0]
    assert run.returncode == 130, (run.returncode, output[-3000:])  # -10 when SIGUSR1 killed it
    assert "Traceback" not in output
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    assert checkpoint_steps(out / "checkpoints")["hpc_ckpt_1.ckpt"] == 1


def test_a_table_noticed_before_its_workers_start_requeues_itself(tmp_path: Path, monkeypatch):
    """SIGUSR1 to the `ablate table3` launcher before it has started a worker: nothing else of the
    task exists to requeue it, so the launcher does (the array task), and exits 130; the same
    command (its launcher run in this process as the same task) then runs the table."""
    env = slurm_env(tmp_path, SLURM_ARRAY_JOB_ID="77", SLURM_ARRAY_TASK_ID="5")
    command = [sys.executable, "-m", "ablate", "table3", "--preset", "tiny", "--rows", "base",
               "--storage", f"sqlite:///{tmp_path}/t.db", "--runs-dir", str(tmp_path / "runs"), "--no-report", *SMALL]
    launcher = subprocess.Popen(command, env={**env, "ABLATE_FAULT": "startup:SIGSTOP"}, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = wait_until_stopped(launcher)
    assert pid == launcher.pid and not descendants(pid)  # no worker yet
    os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGCONT)
    output = launcher.communicate(timeout=300)[0]
    assert launcher.returncode == 130, (launcher.returncode, output[-3000:])
    assert "before any worker started; requeued job 77_5" in output and "Traceback" not in output
    assert (tmp_path / "scontrol.log").read_text() == "requeue 77_5\n"
    with slurm_task_here(monkeypatch, env, cwd=tmp_path):  # the launcher in this process; its worker and trial not
        assert main(command[3:]) == 0
    assert json.loads((tmp_path / "runs" / "table3-tiny" / "base-s1" / "results.json").read_text())["steps"] == 20


@pytest.mark.slow  # a Table 3 row pre-empted while its trial starts: ~40 s
def test_notice_while_a_trial_process_starts_is_held_until_it_can_requeue(tmp_path: Path):
    """SIGUSR1 to every process of a table's task while its trial process is still starting (it
    blocks the signal from its spawn until its notice is installed): nothing is killed by it; the
    trial saves at its first step and requeues the job, the worker re-queues the trial, all exit 130."""
    env = slurm_env(tmp_path)
    command = [sys.executable, "-m", "ablate", "table3", "--preset", "tiny", "--rows", "base",
               "--storage", f"sqlite:///{tmp_path}/t.db", "--runs-dir", str(tmp_path / "runs"), "--no-report", *SMALL]
    task = subprocess.Popen(command, env={**env, "ABLATE_FAULT": "startup:SIGSTOP"}, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launcher = wait_until_stopped(task)  # the launcher stops at its own start first
    assert launcher == task.pid
    os.kill(launcher, signal.SIGCONT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and task.poll() is None:
        stopped = [p for p in descendants(task.pid) if state(p) == "T"]
        if stopped:
            break
        time.sleep(0.1)
    else:
        task.kill()
        pytest.fail(f"no trial process stopped at start-up: {task.communicate()[0][-3000:]}")
    trial = stopped[0]
    for pid in [task.pid, *descendants(task.pid)]:
        os.kill(pid, signal.SIGUSR1)
    os.kill(trial, signal.SIGCONT)
    output = task.communicate(timeout=300)[0]
    assert task.returncode == 130 and "pre-empted" in output and "Traceback" not in output, output[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    study = optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{tmp_path}/t.db")
    first, retry = study.get_trials()
    assert first.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert checkpoint_steps(tmp_path / "runs" / first.user_attrs["run_dir"] / "checkpoints")["hpc_ckpt_1.ckpt"] == 1


COUNTED_RANK = """
import json, os, sys
import lightning.pytorch as pl
import torch.distributed as dist
import lightning_modules.run.train as training
from ablate.cli import main

training_step = [None]  # the optimizer step being trained; None during validation
agreements: dict[int, int] = {}

def counted(collective):
    def call(*args, **kwargs):
        if training_step[0] is not None:
            agreements[training_step[0]] = agreements.get(training_step[0], 0) + 1
        return collective(*args, **kwargs)
    return call

dist.all_reduce, dist.all_gather = counted(dist.all_reduce), counted(dist.all_gather)

class Steps(pl.Callback):
    def on_train_batch_start(self, trainer, *args):
        training_step[0] = trainer.global_step + 1
    def on_validation_start(self, *args):
        training_step[0] = None

train = training.train
training.train = lambda *args, **kwargs: train(*args, **{**kwargs, "callbacks": [Steps()]})
try:
    code = main(sys.argv[1:])
finally:
    rank = os.environ["SLURM_PROCID"]
    with open(os.path.join(os.environ["COUNTS_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(agreements, f)
sys.exit(code)
"""


def test_ddp_ranks_agree_on_a_notice_once_per_logging_window_and_stop_together(tmp_path: Path):
    """Two DDP ranks (gloo) started as srun starts them. The ranks agree on a pending notice (and
    a non-finite loss) in one all-reduce at the first step and at each logging window's end (every
    5 steps), never in between: counted per step in both ranks. Only rank 1 gets SIGUSR1, at step 7;
    both stop together at the window's end, step 10, after one checkpoint and one requeue.
    (Lightning 2.6 also broadcasts its own SIGTERM flag from rank 0 at every DDP step, which this
    project cannot turn off; it is not counted here.)"""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    env = slurm_env(tmp_path, SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port), COUNTS_DIR=str(tmp_path), OMP_NUM_THREADS="1",
                    PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    args = ["train", "--out", str(out), "--devices", "2", "--accelerator", "cpu", *SMALL,
            "train.checkpoint_every=1000"]
    ranks = [subprocess.Popen([sys.executable, "-c", COUNTED_RANK, *args],
                              env={**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                                   **({"ABLATE_FAULT": "train_step@7:SIGUSR1"} if rank else {})},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    outputs = [rank.communicate(timeout=400)[0] for rank in ranks]
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == 130, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    counts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert counts[0] == counts[1] == {"1": 1, "5": 1, "10": 1}, counts  # steps 1-10, one agreement each
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    assert checkpoint_steps(out / "checkpoints") == {"hpc_ckpt_1.ckpt": 10, "interrupted.ckpt": 10}
