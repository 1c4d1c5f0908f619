"""End-to-end runs of `ablate train` on the real default corpus (Ding), on CPU.

Small models and few steps: these check that the pieces fit together (data, Lightning, resume,
decoding, sacreBLEU, results.json, W&B offline), not translation quality.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
import yaml

from ablate.cli import main
from here import ablate_here
from lightning_modules.metrics_log import read_rows
from lightning_modules.run.environment import native_bf16
from foundation.io import atomic_write_json

# A model small enough to train in seconds; dev/test cut to 100 pairs so decoding is quick.
SMALL = ["d_model=32", "d_ff=64", "n_heads=4", "n_layers=1", "data.vocab_size=500",
         "data.ding_dictionary=false", "data.valid_size=100", "data.test_size=100",
         "data.max_tokens=2000", "eval.max_len_offset=10", "train.progress_bar=false"]
RESULT_KEYS = {"row", "params", "bleu", "ppl", "test_bleu", "sacrebleu_signature", "train_time_s",
               "tokens_per_s", "steps", "seed", "status"}


def ablate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One complete short run, with Weights & Biases in offline mode."""
    out = tmp_path_factory.mktemp("run") / "base"
    code = main(["train", "--out", str(out), "--max-steps", "12", "--seed", "3", "--wandb", "offline",
                 *SMALL, "train.val_check_interval=6", "train.log_every_n_steps=3"])
    assert code == 0
    return out


def test_run_writes_complete_results(finished_run: Path):
    results = json.loads((finished_run / "results.json").read_text())
    assert RESULT_KEYS <= set(results)
    assert results["status"] == "complete" and results["steps"] == 12 and results["seed"] == 3
    assert results["row"] == "base" and results["preset"] == "tiny"
    state = torch.load(finished_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert results["params"] == sum(v.numel() for v in state.values())
    assert results["ppl"] > 1 and results["train_time_s"] > 0 and results["tokens_per_s"] > 0
    assert results["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    # where the start-up went: its parts in order, adding up to startup_s (each rounded to 10 ms)
    parts = results["startup"]
    assert [p["part"] for p in parts] == ["imports", "checks", "data", "model", "trainer", "fit"]
    assert all(p["s"] >= 0 for p in parts) and parts[2]["s"] > 0
    assert abs(sum(p["s"] for p in parts) - results["startup_s"]) < 0.05, (parts, results["startup_s"])
    for name in ("config.yaml", "spm.model", "logs/metrics.csv"):
        assert (finished_run / name).is_file(), name


def test_translations_are_saved_and_rescore_to_the_reported_bleu(finished_run: Path):
    results = json.loads((finished_run / "results.json").read_text())
    for split, key in (("dev", "bleu"), ("test", "test_bleu")):
        src, ref, hyp = ((finished_run / f"{split}.{kind}.txt").read_text().splitlines()
                         for kind in ("src", "ref", "hyp"))
        assert len(src) == len(ref) == len(hyp) == 100
        assert round(sacrebleu.corpus_bleu(hyp, [ref]).score, 2) == results[key]


def test_dev_perplexity_is_logged_by_step(finished_run: Path):
    lines = (finished_run / "logs" / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    steps = [int(r["step"]) for r in rows if r.get("val/ppl")]
    assert steps and all(s > 0 for s in steps)


def test_every_training_row_logs_its_rate_and_the_rows_add_up_to_the_run(finished_run: Path):
    """train/tokens_per_s per window: window tokens over window seconds of training. Over the
    rows, the tokens add up to results.json's and the seconds to its training time."""
    rows = [r for r in read_rows(finished_run / "logs") if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == [2, 5, 8, 11]  # windows of 3 steps
    tokens = [float(r["train/tokens"]) * 3 for r in rows]  # mean per batch x batches
    seconds = [t / float(r["train/tokens_per_s"]) for t, r in zip(tokens, rows)]
    results = json.loads((finished_run / "results.json").read_text())
    assert sum(tokens) == pytest.approx(results["target_tokens"])
    assert all(s > 0 for s in seconds)
    # validation (two dev passes inside fit) is left out of both clocks; train_time_s has 1 decimal
    assert abs(sum(seconds) - results["train_time_s"]) <= 0.1 + 0.2 * results["train_time_s"]


def test_wandb_offline_run_is_written(finished_run: Path):
    runs = list((finished_run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert any(runs[0].rglob("*.wandb"))


def test_wandb_offline_run_holds_the_runs_attention_figure(finished_run: Path):
    """The finished run's attention figure, drawn from its attention.npz, is an image of its W&B
    record: the offline run's media holds it (the same pixels) and a history record names it."""
    import io

    import numpy as np
    import wandb
    from PIL import Image

    from lightning_modules.run.attention_figures import ATTENTION_FILE, run_attention_png

    wandb.finish()  # the training's W&B run, still open in this process: its record as it syncs
    (run,) = (finished_run / "wandb").glob("offline-run-*")
    (image,) = (run / "files" / "media" / "images").glob("attention_*.png")
    drawn = Image.open(io.BytesIO(run_attention_png(finished_run / ATTENTION_FILE, "base")))
    assert np.array_equal(np.asarray(Image.open(image)), np.asarray(drawn))
    (record,) = run.glob("*.wandb")
    assert image.relative_to(run / "files").as_posix().encode() in record.read_bytes()


def test_files_the_run_writes_are_as_readable_as_any_file_written_here(finished_run: Path, tmp_path: Path):
    """Atomic writes go through a temporary file that is private to its owner; the results must not
    stay so (a teammate on the same cluster, or a synced archive, reads them)."""
    (plain := tmp_path / "plain.txt").write_text("written with open()\n")
    for name in ("results.json", "config.yaml", "dev.hyp.txt", "logs/metrics.csv"):
        assert stat.S_IMODE((finished_run / name).stat().st_mode) == stat.S_IMODE(plain.stat().st_mode), name


def test_an_atomic_rewrite_keeps_the_permissions_a_file_was_given(tmp_path: Path):
    (path := tmp_path / "results.json").write_text("{}\n")
    path.chmod(0o640)
    atomic_write_json(path, {"status": "complete"})
    assert json.loads(path.read_text()) == {"status": "complete"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_finished_run_is_not_trained_again(finished_run: Path, capsys):
    before = (finished_run / "results.json").stat().st_mtime_ns
    assert main(["train", "--out", str(finished_run), "--max-steps", "12", "--seed", "3",
                 "--no-wandb", *SMALL, "train.val_check_interval=6"]) == 0
    assert (finished_run / "results.json").stat().st_mtime_ns == before
    out = capsys.readouterr().out
    assert "dev BLEU" in out and re.search(r"start-up \(s\)\s+[\d.]+ \(imports [\d.]+, checks [\d.]+, data", out), out


def test_run_directory_of_another_model_is_refused(finished_run: Path, capsys):
    code = main(["train", "--out", str(finished_run), "--max-steps", "12", "--no-wandb",
                 *SMALL, "d_model=64", "train.val_check_interval=6"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "model.d_model=32" in err[0]



def test_a_run_directory_written_before_markers_is_claimed_and_a_folder_whose_config_is_not_ours_is_not(
        tmp_path: Path):
    """A folder without the marker is ours only when its config.yaml is a run's (a mapping with
    preset, model, train and data): a list, a mapping missing a section, or text that is not YAML
    leaves it someone else's, refused in one line with nothing written."""
    from foundation.errors import UserError
    from foundation.rundir import MARKER, claim

    old = tmp_path / "old"
    old.mkdir()
    (old / "config.yaml").write_text("preset: tiny\nmodel: {d_model: 32}\ntrain: {}\ndata: {}\n")
    (old / "results.json").write_text("{}")
    claim(old)
    assert (old / MARKER).is_file()
    for n, text in enumerate(["- 1\n- 2\n", "preset: tiny\nmodel: {}\ntrain: {}\n", "model: {d_model: [1, 2\n"]):
        other = tmp_path / f"other{n}"
        other.mkdir()
        (other / "config.yaml").write_text(text)
        with pytest.raises(UserError, match="is not an ablate run directory"):
            claim(other)
        assert sorted(p.name for p in other.iterdir()) == ["config.yaml"]


def test_saved_config_trains_the_same_model_with_the_same_overrides(finished_run: Path):
    """config.yaml holds what was asked for: a width override derives d_k again (d_model / h)."""
    from ablations.resolve import resolve

    saved = yaml.safe_load((finished_run / "config.yaml").read_text())
    assert saved["model"]["d_k"] is None and "vocab_size" not in saved["model"]
    results = json.loads((finished_run / "results.json").read_text())
    assert results["model"]["d_k"] == 32 // 4 and results["model"]["vocab_size"] == 500  # as built
    again = resolve("tiny", "base", config_file=finished_run / "config.yaml", overrides=["d_model=64"])
    fresh = resolve("tiny", "base", overrides=[*SMALL, "d_model=64"])
    assert (again.model.d_k, again.model.d_v) == (16, 16)
    assert again.model == fresh.model

@pytest.mark.parametrize("case", ["missing", "counts", "utf8", "empty"])
def test_bad_corpus_gives_one_line_error(tmp_path: Path, capsys, case: str):
    good_src = tmp_path / "good.en"
    good_src.write_text("a b\nc d\n")
    good_tgt = tmp_path / "good.de"
    good_tgt.write_text("x y\nz w\n")
    bad = tmp_path / "bad.de"
    if case == "counts":
        bad.write_text("x y\n")
    elif case == "utf8":
        bad.write_bytes(b"x y\n\xff\xfe z\n")
    elif case == "empty":
        bad.write_text("")
    code = main(["train", "--out", str(tmp_path / "run"), "--no-wandb",
                 "--train-src", str(good_src), "--train-tgt", str(bad),
                 "--valid-src", str(good_src), "--valid-tgt", str(good_tgt)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ablate: error:")
    assert "bad.de" in err[0]
    if case == "utf8":
        assert "line 2" in err[0]
    assert not (tmp_path / "run" / "results.json").exists()


def test_bad_corpus_from_the_command_line_has_no_traceback(tmp_path: Path, capfd):
    """Missing corpus files: exit 2, no traceback, the last line `ablate: error:` naming the file. In
    this process (`ablate_here`): the message is the point; test_bad_input's
    test_real_process_prints_no_traceback checks that a real process prints no traceback."""
    result = ablate_here(capfd, "train", "--out", str(tmp_path / "run"), "--no-wandb",
                         "--train-src", str(tmp_path / "nope.en"), "--train-tgt", str(tmp_path / "nope.de"),
                         "--valid-src", str(tmp_path / "nope.en"), "--valid-tgt", str(tmp_path / "nope.de"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("ablate: error:")
    assert "nope.en" in result.stderr


def test_unwritable_output_directory_is_refused_before_training(tmp_path: Path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = main(["train", "--out", str(blocker / "run"), "--no-wandb", *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot write to output directory" in err[0]


def test_two_process_ddp_run_on_cpu(tmp_path: Path):
    """Lightning DDP (gloo, 2 processes): both ranks train, rank 0 evaluates and writes results.
    The two ranks share one step's `data.max_tokens` (#70: each had taken all of it, so a step
    trained on twice the tokens of a one-device run): a step holds what one device's does, the
    epoch's mean step at that budget."""
    out = tmp_path / "ddp"
    result = ablate("train", "--out", str(out), "--devices", "2", "--accelerator", "cpu",
                    "--max-steps", "6", "--no-wandb", *SMALL, "train.val_check_interval=3")
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["steps"] == 6 and results["status"] == "complete"
    assert "Starting with 2 processes" in result.stderr + result.stdout
    per_step = results["target_tokens"] / results["steps"]  # rank 0's tokens x 2 ranks
    one_device = results["data"]["train_tokens"] / 2 / results["data"]["train_batches"]  # a side's mean step
    assert per_step <= 2000 and 0.75 < per_step / one_device < 1.25, (per_step, one_device)


def test_bad_devices_value_is_a_one_line_error(tmp_path: Path, capsys):
    code = main(["train", "--out", str(tmp_path / "run"), "--no-wandb", "--devices", "two", *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "train.devices" in err[0]


@pytest.fixture
def cpu_without_bf16(tmp_path: Path) -> Path:
    """This machine's /proc/cpuinfo with the flags of native bf16 taken out: a real CPU's text that
    `ABLATE_CPUINFO` puts in place of /proc/cpuinfo (the run's check reads it as it reads the real one)."""
    real = Path("/proc/cpuinfo")
    text = real.read_text() if real.is_file() else "flags\t\t: fpu sse2 avx avx2 avx512f fma\n"
    lacking = tmp_path / "cpuinfo"
    lacking.write_text(re.sub(r"\b(avx512_bf16|amx_\w+) ?", "", text))
    return lacking


def test_bf16_on_a_cpu_without_native_bf16_is_refused_in_one_line_before_any_folder(
        tmp_path: Path, capsys, monkeypatch, cpu_without_bf16: Path):
    monkeypatch.setenv("ABLATE_CPUINFO", str(cpu_without_bf16))
    out = tmp_path / "run"
    code = main(["train", "--out", str(out), "--no-wandb", "--precision", "bf16-mixed", *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "train.precision=bf16-mixed" in err[0] and "neither avx512_bf16 nor amx_bf16" in err[0]
    assert not out.exists()


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bf16 (avx512_bf16 or amx_bf16)")
def test_a_bf16_run_on_this_cpu_trains_records_its_precision_and_is_decoded_in_it(
        tmp_path: Path, capsys, monkeypatch, cpu_without_bf16: Path):
    """bf16-mixed on a CPU with native bf16: CPU autocast; results.json and its environment name the
    precision; decoding the run later follows it (the run's own dev translations, line for line),
    and is fp32 on a CPU without native bf16 (the stated rule)."""
    out = tmp_path / "bf16"
    assert main(["train", "--out", str(out), "--max-steps", "6", "--no-wandb", "--precision", "bf16-mixed",
                 *SMALL]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["ppl"] > 1 and results["bleu"] is not None
    assert results["precision"] == results["environment"]["precision"] == "bf16-mixed"
    stem = out / "evaluate-valid-last-beam4-a0.6-len10"
    for native in (False, True):
        with monkeypatch.context() as m:
            if not native:
                m.setenv("ABLATE_CPUINFO", str(cpu_without_bf16))
            assert main(["evaluate", str(out), "--split", "valid", "--device", "cpu"]) == 0
        assert json.loads(Path(f"{stem}.json").read_text())["settings"]["bf16_autocast"] is native
    assert Path(f"{stem}.hyp.txt").read_text() == (out / "dev.hyp.txt").read_text()
