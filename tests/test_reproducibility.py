"""Same command, same seed, same setup: the same losses bit for bit, and results.json records
what the numbers depend on (issue 12: one seed gave dev PPL 116.43 on one CPU, 120.72 on another;
what differs between CPUs is measured in benchmarks/results/reproducibility-cpu-2026-11-22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from lightning_modules.metrics_log import read_rows

STEPS = 8
# the machine's own ATen kernels, named: the numbers do not change, the record shows the variable
CAPABILITY = torch.backends.cpu.get_cpu_capability()
TINY = ["--max-steps", str(STEPS), "--seed", "3", "--no-wandb", "d_model=32", "d_ff=64", "n_heads=4",
        "n_layers=1", "data.vocab_size=500", "data.max_tokens=1000", "eval.max_len_offset=10",
        "eval.beam_size=1", "eval.decode_test=false", "train.progress_bar=false", "train.log_every_n_steps=1",
        "train.val_check_interval=100000", "train.checkpoint_every=100000", "train.threads=1"]


def losses(run_dir: Path) -> list[tuple[int, str]]:
    """Every step's logged loss, as the CSV holds it (the float's repr: exact)."""
    return [(int(r["step"]), r["train/loss"]) for r in read_rows(run_dir / "logs") if r.get("train/loss")]


def test_the_same_command_and_seed_give_bitwise_identical_losses_and_record_the_setup(tmp_path, small_corpus):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ATEN_CPU_CAPABILITY": CAPABILITY.lower()}
    runs = ("a", "b")
    procs = [subprocess.Popen([sys.executable, "-m", "ablate", "train", "--out", str(tmp_path / name),
                               *small_corpus, *TINY], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for name in runs]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    first, second = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert len(first) == STEPS and first == second
    results = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in runs}
    assert results["a"]["ppl"] == results["b"]["ppl"]
    environment = results["a"]["environment"]
    assert environment["cpu_capability"] == CAPABILITY
    assert environment["variables"]["ATEN_CPU_CAPABILITY"] == CAPABILITY.lower()
    assert environment["torch_threads"] == 1  # train.threads pins it
    assert environment["deterministic_algorithms"] is True  # train.deterministic: auto = on for CPU runs


def test_deterministic_algorithms_are_on_for_cpu_runs_unless_turned_off():
    from ablations.resolve import resolve
    from lightning_modules.run.train import deterministic

    assert deterministic(resolve("tiny", "base", None, ["train.accelerator=cpu"], None))
    assert not deterministic(resolve("tiny", "base", None, ["train.deterministic=false"], None))
    assert deterministic(resolve("tiny", "base", None, ["train.deterministic=true"], None))


def test_a_run_killed_mid_epoch_and_resumed_has_the_losses_of_an_uninterrupted_one(tmp_path, small_corpus):
    """Killed after step 7 of 12 (checkpoint at step 6, epochs of 5 batches: the resume starts in
    the middle of the second epoch), then the same command: every later step's loss is the
    uninterrupted run's, bit for bit (the same batches, the same dropout masks)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ATEN_CPU_CAPABILITY": CAPABILITY.lower()}
    env.pop("ABLATE_FAULT", None)
    args = [*small_corpus, *TINY, "--max-steps", "12", "data.max_tokens=25000", "train.checkpoint_every=3"]

    def run(name: str, fault: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ablate", "train", "--out", str(tmp_path / name), *args],
                              env={**env, **({"ABLATE_FAULT": fault} if fault else {})},
                              capture_output=True, text=True, timeout=300)

    whole = run("whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    batches = json.loads((tmp_path / "whole" / "results.json").read_text())["data"]["train_batches"]
    assert 3 < batches < 7, batches  # a few batches per epoch: step 7 is inside the second epoch
    killed = run("resumed", "train_step@7")
    assert killed.returncode == -9, killed.stderr[-3000:]
    again = run("resumed")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Restored all states from the checkpoint" in again.stderr
    assert "not resumable" not in again.stderr  # Lightning's warning for a loader it cannot resume
    expected, resumed = losses(tmp_path / "whole"), losses(tmp_path / "resumed")
    assert len(expected) == 12 and resumed == expected
    results = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("whole", "resumed")]
    assert results[0]["ppl"] == results[1]["ppl"]


def test_a_run_stopped_inside_a_step_resumes_with_every_row_and_draw_of_an_uninterrupted_one(
        tmp_path, small_corpus):
    """Ctrl-C in the forward pass of step 7 (windows of 2 steps, epochs of ~5 batches): the
    checkpoint is written inside the step. The resumed run does step 7 again with the dropout masks
    it had, and Lightning's logging step stays the optimizer step (`lightning_api`): every window
    is written under its own step with the uninterrupted run's values, bit for bit (else each is
    written a window late and one per epoch is lost, as in the cpu table of 2026-11-23)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ATEN_CPU_CAPABILITY": CAPABILITY.lower()}
    env.pop("ABLATE_FAULT", None)
    args = [*small_corpus, *TINY, "--max-steps", "24", "data.max_tokens=25000", "train.checkpoint_every=5",
            "train.log_every_n_steps=2"]

    def run(name: str, fault: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ablate", "train", "--out", str(tmp_path / name), *args],
                              env={**env, **({"ABLATE_FAULT": fault} if fault else {})},
                              capture_output=True, text=True, timeout=300)

    whole = run("whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = run("resumed", "train_forward@7:SIGINT")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "interrupted.ckpt", weights_only=False)
    assert saved["global_step"] == 6  # step 7 had not finished
    again = run("resumed")
    assert again.returncode == 0, again.stderr[-3000:]
    expected, resumed = losses(tmp_path / "whole"), losses(tmp_path / "resumed")
    assert [step for step, _ in expected] == list(range(1, 24, 2))
    assert resumed == expected
    results = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("whole", "resumed")]
    assert results[0]["ppl"] == results[1]["ppl"]
    assert results[0]["dev_ppl_curve"] == results[1]["dev_ppl_curve"]
