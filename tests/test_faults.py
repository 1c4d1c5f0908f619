"""Fault injection with real processes and real signals: SIGKILL/SIGTERM at named points of a run
(`ABLATE_FAULT`, see foundation/faults.py), a damaged checkpoint, a NaN loss. After each,
running the same command again finishes the work from what was saved, and no half-written file
is ever read. (The run that is killed is a process of its own; the same command run after it
runs in the test's process where only what it reads and writes is checked; so does the run
whose loss becomes NaN, a numerical fault and no signal.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from ablate.cli import main
from here import ablate_here
from lightning_modules.convergence import read_curves
from sweeps.storage import make_storage
from sweeps.study import enqueue, open_study

SMALL = ["--max-steps", "20", "--no-wandb", "d_model=32", "d_ff=64", "n_heads=4", "n_layers=1",
         "data.vocab_size=500", "data.valid_size=100", "data.test_size=100", "data.max_tokens=2000",
         "eval.max_len_offset=10", "train.progress_bar=false", "train.checkpoint_every=5",
         "train.val_check_interval=10", "train.log_every_n_steps=5"]


def ablate(*args: str, fault: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ABLATE_FAULT"}
    if fault:
        env["ABLATE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True,
                          text=True, timeout=timeout, env={**env, "PYTHONUNBUFFERED": "1"})


@contextlib.contextmanager
def lightning_log() -> Iterator[list[str]]:
    """The messages Lightning logs in this process meanwhile: the lines a process of its own
    prints on stderr (its INFO records, "Restoring states from the checkpoint ...")."""
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def all_checkpoints_load(ckpt_dir: Path) -> dict[str, int]:
    """Every *.ckpt file loads (safely); returns their global steps."""
    return {p.name: torch.load(p, weights_only=True)["global_step"] for p in ckpt_dir.glob("*.ckpt")}


SLOW = pytest.mark.slow  # in `make test-slow`, not `make test` (the suite stays under ~10 minutes)

# (fault, signal that kills, the newest checkpoint step left behind)
FAULTS = [
    # in the middle of training (test_reproducibility's "killed mid-epoch" checks it bit for bit in `make test`)
    pytest.param("train_step@7", signal.SIGKILL, 5, id="train_step@7", marks=SLOW),
    pytest.param("train_step@13:SIGTERM", signal.SIGTERM, 13, id="SIGTERM@13", marks=SLOW),  # interrupted ckpt
    pytest.param("train_step@13:SIGHUP", signal.SIGHUP, 13, id="SIGHUP@13"),  # a closed terminal = SIGTERM
    pytest.param("validation@10", signal.SIGKILL, 10, id="validation@10", marks=SLOW),  # during validation
    pytest.param("checkpoint_write@15", signal.SIGKILL, 10, id="checkpoint_write@15"),  # a checkpoint written, not yet renamed
    pytest.param("decode", signal.SIGKILL, 20, id="decode", marks=SLOW),  # during the final beam search
    pytest.param("results_write", signal.SIGKILL, 20, id="results_write", marks=SLOW),  # results.json not renamed
]


def window_rows(resumed_at: int, every: int, last: int) -> list[int]:
    """The training rows of a run resumed at step `resumed_at` (the CSV's step column: the
    window's last step index, one below the step count). Windows end every `every` steps; after
    the resume, one shorter than `every` is carried into the next row, except the last
    (`TranslationModule.on_train_batch_end`): resumed at 13, the row at 15 would span 2 steps."""
    ends, start = [end for end in range(every, last + 1, every) if end <= resumed_at], resumed_at
    for end in range(every, last + 1, every):
        if end > resumed_at and (end - start >= every or end == last):
            ends.append(end)
            start = end
    return [end - 1 for end in ends]


def test_window_rows_follow_the_carry_rule():
    assert window_rows(5, 5, 20) == window_rows(20, 5, 20) == [4, 9, 14, 19]
    assert window_rows(13, 5, 20) == [4, 9, 19] and window_rows(7, 5, 20) == [4, 14, 19]


@pytest.mark.parametrize("fault,sig,saved_step", FAULTS)
def test_killed_run_is_finished_by_the_same_command(tmp_path: Path, fault: str, sig: signal.Signals,
                                                    saved_step: int, capsys):
    """Killed at `fault` (a process of its own, a real signal), then the same command (in this
    process: what is tested is what it reads of what the killed process left). Killed while the
    checkpoint of step 15 is written but not yet renamed, the run also has its newest checkpoint damaged before it
    is resumed (last.ckpt cut in half, as if copied in half): the damaged file is set aside as
    last.ckpt.corrupt with a warning, and the run resumes from the intact step10.ckpt."""
    out = tmp_path / "run"
    args = ["train", "--out", str(out), *SMALL]
    first = ablate(*args, fault=fault)
    if sig == signal.SIGKILL:
        assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    else:  # Lightning turns SIGTERM into a clean stop; the CLI exits non-zero with one line
        assert first.returncode != 0 and "Traceback" not in first.stderr, first.stderr[-2000:]
    assert not (out / "results.json").exists()
    steps = all_checkpoints_load(out / "checkpoints")
    assert max(steps.values()) == saved_step, steps
    damaged = fault.startswith("checkpoint_write")
    if damaged:  # the damaged-checkpoint case (it had a test and a killed run of its own)
        assert steps == {"last.ckpt": 10, "step10.ckpt": 10}, steps  # an intact older copy beside last.ckpt
        last = out / "checkpoints" / "last.ckpt"
        last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])

    # the same command again, in this process: what it reads is what the killed process left
    with lightning_log() as messages:
        assert main(args) == 0
    err, logged = capsys.readouterr().err, "\n".join(messages)
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["steps"] == 20
    assert "Restoring states from the checkpoint" in logged  # resumed, not restarted
    if damaged:
        assert (out / "checkpoints" / "last.ckpt.corrupt").is_file()
        assert "last.ckpt is damaged; set aside" in err
        resumed = logged.split("Restored all states from the checkpoint at ")[1].split()[0]
        assert Path(resumed).name == "step10.ckpt", resumed
    assert not list(out.rglob(".*.tmp")), "a killed write's temporary file was left behind"
    all_checkpoints_load(out / "checkpoints")
    # the curves survive the resumption: every training window, every validation that finished
    dev, train = read_curves(out / "logs")
    assert [step for step, _ in train] == window_rows(resumed_at=saved_step, every=5, last=20)
    assert [step for step, _ in dev] == ([19, 20] if fault.startswith("validation") else [9, 19, 20])
    assert [step for step, _ in results["dev_ppl_curve"]] == [step for step, _ in dev]


@SLOW
def test_checkpoint_of_another_model_is_refused_with_one_line(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert ablate("train", "--out", str(a), *SMALL, fault="train_step@6").returncode == -signal.SIGKILL
    assert ablate("train", "--out", str(b), *SMALL, "d_ff=128", fault="train_step@6").returncode == -signal.SIGKILL
    (b / "checkpoints" / "last.ckpt").replace(a / "checkpoints" / "last.ckpt")  # b's weights in a's run
    result = ablate("train", "--out", str(a), *SMALL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "was saved by another model (d_ff=128, not 64)" in lines[-1]
    assert "Traceback" not in result.stderr and not (a / "results.json").exists()


def test_nan_loss_fails_the_run_with_its_reason_recorded(tmp_path: Path, capfd, monkeypatch):
    """NaN gradients at step 3 (a NaN loss from then on) fail the run: exit status 1, the reason as the last line of stderr
    and in results.json, no traceback; the same command then refuses the failed run. (Both run in
    this process: what is checked is the status, the output and the file, not a process's own.)"""
    out = tmp_path / "run"
    with monkeypatch.context() as env:
        env.setenv("ABLATE_FAULT", "nan_grad@3")
        result = ablate_here(capfd, "train", "--out", str(out), *SMALL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "the training loss became nan" in lines[-1], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    recorded = json.loads((out / "results.json").read_text())
    assert recorded["status"] == "failed" and "nan" in recorded["reason"]
    # a failed run is not silently retried (a refusal before any training)
    again = ablate_here(capfd, "train", "--out", str(out), *SMALL)
    assert again.returncode == 1 and "holds a failed run" in again.stderr


@SLOW
def test_diverging_trial_fails_with_its_reason_and_the_sweep_goes_on(tmp_path: Path):
    db = f"sqlite:///{tmp_path}/sweeps.db"
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  dropout: {type: float, low: 0.0, high: 0.2}\n")
    study = open_study("nan", make_storage(db, None))
    enqueue(study, ["train.lr_scale=1e7", "train.warmup_steps=2"])  # diverges within a few steps
    enqueue(study, ["train.lr_scale=0.5"])
    result = ablate("sweep", "optuna", "--study", "nan", "--storage", db, "--space", str(space),
                    "--n-trials", "2", "--runs-dir", str(tmp_path / "runs"), "--no-prune", *SMALL,
                    "--max-steps", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = optuna.load_study(study_name="nan", storage=db).get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "the training loss became nan" in failed[0].user_attrs["fail_reason"]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2  # the sweep went on to finish


@SLOW  # ~100 s of compilation twice; the compiled step's losses are checked in `make test` (test_buckets)
def test_sigterm_while_compiling_stops_at_once_and_the_run_resumes(tmp_path: Path):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), *SMALL, "train.compile=true"]
    start = time.monotonic()
    first = ablate(*args, fault="compile:SIGTERM")
    stopped_after = time.monotonic() - start
    assert first.returncode != 0 and "Traceback" not in first.stderr, first.stderr[-2000:]
    assert first.stderr.strip().splitlines()[-1].startswith("ablate:"), first.stderr[-500:]
    # the signal came inside the first compilation: nothing trained, a step-0 checkpoint saved
    assert all_checkpoints_load(out / "checkpoints") == {"interrupted.ckpt": 0}
    assert stopped_after < 60, f"{stopped_after:.0f} s"  # start-up + a fraction of one compilation

    second = ablate(*args)
    assert second.returncode == 0, second.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["steps"] == 20 and results["compiled"]
    assert results["compiled_graphs"] == 1 and results["recompiled_because"] == []
