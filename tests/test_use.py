"""Using a trained run: `ablate translate`, `ablate evaluate`, checkpoint averaging and `ablate
attention`, all on ONE tiny run trained once (two layers, four heads, three kept checkpoints)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate.cli import main
from lightning_modules.run.attention import attention_maps, fixed_sentence
from lightning_modules.run.attention_figures import (ATTENTION_FILE, KINDS, attention_figure, group_attention_figure,
                                                     load_attention)
from lightning_modules.run.use import average_state_dicts, load_run, load_weights, translate_lines
from lightning_modules.metrics_log import read_rows
from reports.attention import group_attention_pictures

SMALL = ["--max-steps", "12", "--no-wandb", "d_model=32", "d_ff=64", "n_heads=4", "n_layers=2",
         "model.max_len=40", "data.vocab_size=500", "data.ding_dictionary=false", "data.valid_size=40",
         "data.test_size=40", "data.max_tokens=2000", "eval.max_len_offset=10", "train.progress_bar=false",
         "train.val_check_interval=4", "train.checkpoint_every=4", "train.keep_checkpoints=3"]
SENTENCES = ["The cat sits on the mat.", "I like it.", "Where is the station?"]


def ablate(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kwargs)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("use") / "base"
    assert main(["train", "--out", str(out), *SMALL]) == 0
    return out


@pytest.fixture(scope="module")
def loaded(run_dir: Path):
    return load_run(run_dir, "last", "cpu")


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- translate --------------------------------------------------------------------------------

def _read_line(proc: subprocess.Popen, timeout: float = 60) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no translation came back before the input ended"
    return proc.stdout.readline().rstrip("\n")


def test_translate_streams_each_line_in_order(run_dir: Path, loaded):
    """Each line is answered before the next is sent; an empty line gives an empty line; an
    over-long line is cut with a warning naming it; the answers are the library's own."""
    long_line = " ".join(["the house is small and old"] * 12)  # > 39 wordpieces
    expected = translate_lines(loaded, [*SENTENCES, "", long_line], loaded.eval_config, warn=None)
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "translate", str(run_dir), "--batch-tokens", "1",
                             "--device", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        got = []
        for line in [*SENTENCES, "", long_line]:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            got.append(_read_line(proc))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert got == expected and got[3] == ""
    assert "line 5 has" in err and "Traceback" not in err


def test_translate_batch_from_file_equals_line_by_line(run_dir: Path, loaded, tmp_path: Path, capsys):
    """--input FILE, batched (sorted by length inside), comes out in input order."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    assert main(["translate", str(run_dir), "--input", str(src), "--device", "cpu"]) == 0
    one_by_one = [translate_lines(loaded, [s], loaded.eval_config)[0] for s in SENTENCES]
    assert capsys.readouterr().out.splitlines() == one_by_one
    # the fixed-size caches of --cuda-graphs (no graph on a CPU): the same search, the same lines
    assert main(["translate", str(run_dir), "--input", str(src), "--device", "cpu", "--cuda-graphs"]) == 0
    assert capsys.readouterr().out.splitlines() == one_by_one


# --- evaluate ---------------------------------------------------------------------------------

def test_evaluate_agrees_with_the_runs_own_numbers(run_dir: Path, capsys):
    results = (run_dir / "results.json").read_bytes()
    assert main(["evaluate", str(run_dir), "--split", "valid", "--device", "cpu"]) == 0
    stem = run_dir / "evaluate-valid-last-beam4-a0.6-len10"
    first = json.loads(Path(f"{stem}.json").read_text())
    saved = json.loads(results)
    assert first["bleu"] == saved["bleu"] and first["sacrebleu_signature"] == saved["sacrebleu_signature"]
    assert first["ppl"] == pytest.approx(saved["ppl"], abs=2e-3)
    assert Path(f"{stem}.hyp.txt").read_text() == (run_dir / "dev.hyp.txt").read_text()
    assert "BLEU" in capsys.readouterr().out
    assert main(["evaluate", str(run_dir), "--split", "valid", "--device", "cpu"]) == 0
    assert json.loads(Path(f"{stem}.json").read_text()) == first  # same sentences, same numbers
    assert main(["evaluate", str(run_dir), "--split", "test", "--device", "cpu"]) == 0
    test = json.loads((run_dir / "evaluate-test-last-beam4-a0.6-len10.json").read_text())
    assert test["bleu"] == saved["test_bleu"]
    assert (run_dir / "results.json").read_bytes() == results  # untouched


def test_evaluate_files_rescored_by_the_sacrebleu_cli(run_dir: Path, tmp_path: Path):
    """References half the run's own translations, half the dev references: a BLEU well above 0,
    which the sacrebleu command gives again from the saved files."""
    hyps = (run_dir / "dev.hyp.txt").read_text().splitlines()
    refs = (run_dir / "dev.ref.txt").read_text().splitlines()
    ref = tmp_path / "ref.txt"
    ref.write_text("".join(f"{h if i % 2 else r}\n" for i, (h, r) in enumerate(zip(hyps, refs))))
    assert main(["evaluate", str(run_dir), "--src", str(run_dir / "dev.src.txt"), "--ref", str(ref),
                 "--device", "cpu"]) == 0
    numbers = json.loads((run_dir / "evaluate-file-dev.src.txt-last-beam4-a0.6-len10.json").read_text())
    assert numbers["bleu"] > 5 and numbers["sentences"] == len(hyps)
    cli = subprocess.run([sys.executable, "-m", "sacrebleu", str(run_dir / numbers["references"]), "-i",
                          str(run_dir / numbers["hypotheses"]), "-b", "-w", "2", "-tok", "13a"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert float(cli.stdout.strip()) == numbers["bleu"]


# --- checkpoint averaging ----------------------------------------------------------------------

def test_average_of_two_hand_made_state_dicts():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([-0.5]), "n": torch.tensor(3)}
    mean = average_state_dicts([a, b])
    assert mean["w"].tolist() == [2.0, 4.0] and mean["b"].tolist() == [0.0] and mean["n"].item() == 3


def test_keep_checkpoints_and_average_are_parameter_means(run_dir: Path):
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step*.ckpt"))
    assert kept == ["step12.ckpt", "step4.ckpt", "step8.ckpt"]
    states = [torch.load(run_dir / "checkpoints" / name, weights_only=True)["state_dict"] for name in kept]
    averaged = load_weights(run_dir, "average:3")
    assert averaged.steps == [4, 8, 12]
    assert set(averaged.state) == {k[len("model."):] for k in states[0] if k.startswith("model.")}
    for key, value in averaged.state.items():
        by_hand = (states[0]["model." + key] + states[1]["model." + key] + states[2]["model." + key]) / 3
        assert torch.allclose(value, by_hand, atol=1e-7), key
    assert not torch.equal(averaged.state["embedding.weight"], load_weights(run_dir, "last").state["embedding.weight"])
    logged = {int(r["step"]): float(r["val/ppl"]) for r in read_rows(run_dir / "logs") if r.get("val/ppl")}
    assert load_weights(run_dir, "best").steps == [min((ppl, s) for s, ppl in logged.items() if s in (4, 8, 12))[1]]


# --- attention ---------------------------------------------------------------------------------

def test_explicit_attention_is_the_sdpa_models_attention(loaded):
    src = loaded.encode(["The cat sits on the mat."])[0]
    tgt = loaded.encode(["Die Katze sitzt auf der Matte."])[0]
    maps = attention_maps(loaded.model, src, tgt, loaded.pieces)
    assert maps.max_difference < 1e-5  # every sub-layer: W_o·softmax(QKᵀ/√d_k + mask)V = SDPA's output
    for kind in KINDS:
        w = maps.weights[kind]
        assert w.shape[:2] == (2, 4)
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
    dec = maps.weights[KINDS[1]]
    assert torch.all(dec.triu(diagonal=1) == 0)  # no position sees a later one
    assert maps.weights[KINDS[2]].shape[-2:] == (len(tgt) + 1, len(src) + 1)
    fig = attention_figure(maps, KINDS[0], [0, 1], [0, 1, 2, 3])
    assert len(fig.axes) == 2 * 4
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == maps.source


def test_attention_command_writes_one_png_per_kind(run_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "maps"
    assert main(["attention", str(run_dir), "--line", "2", "--layer", "2", "--head", "3", "--out", str(out),
                 "--device", "cpu"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["decoder-self-attention.png", "encoder-decoder-attention.png", "encoder-self-attention.png"]
    assert all((out / n).read_bytes().startswith(b"\x89PNG") for n in names)


# --- bad input: one line, exit 2, nothing written -------------------------------------------------

def _fails(capsys, argv: list[str], words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ablate: error:") and err.count("\n") == 1 and words in err, err


def test_bad_inputs(run_dir: Path, tmp_path: Path, capsys):
    before = _listing(run_dir)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.yaml", "spm.model"):
        shutil.copy(run_dir / name, bare / name)
    _fails(capsys, ["translate", str(bare), "--input", str(run_dir / "dev.src.txt")], "has no checkpoint")
    (bare / "config.yaml").write_text("- 1\n- 2\n")
    _fails(capsys, ["translate", str(bare), "--input", str(run_dir / "dev.src.txt")], "not a run's configuration")
    (bare / "config.yaml").unlink()
    _fails(capsys, ["translate", str(bare), "--input", str(run_dir / "dev.src.txt")], "is not a run directory")
    _fails(capsys, ["evaluate", str(run_dir), "--checkpoint", "average:4"], "keeps 3 checkpoint")
    _fails(capsys, ["evaluate", str(run_dir), "--checkpoint", "newest"], "last, best or average:K")
    _fails(capsys, ["attention", str(run_dir), "--sentence", "ツツツ ツ", "--out", str(tmp_path / "m")],
           "only pieces unknown")
    _fails(capsys, ["attention", str(run_dir), "--line", "1", "--layer", "3", "--out", str(tmp_path / "m")],
           "layers 1 to 2")
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("ツツツ\n")
    _fails(capsys, ["translate", str(run_dir), "--input", str(unknown)], "line 1 has only pieces unknown")
    _fails(capsys, ["evaluate", str(run_dir), "--src", str(unknown)], "--src FILE and --ref FILE")
    gpu = f"cuda:{torch.cuda.device_count()}"
    _fails(capsys, ["translate", str(run_dir), "--device", gpu, "--input", str(unknown)], f"--device {gpu}")
    assert not (tmp_path / "m").exists()
    assert _listing(run_dir) == before
    closed = subprocess.run(["bash", "-c", f'exec "{sys.executable}" -m ablate translate "{run_dir}" 0<&-'],
                            capture_output=True, text=True, timeout=120)
    assert closed.returncode == 2 and closed.stdout == ""
    assert closed.stderr.startswith("ablate: error: stdin is closed") and closed.stderr.count("\n") == 1


# --- the attention every finished run keeps, and the report's group A figure -----------------------

def test_finished_run_keeps_its_fixed_sentences_attention(run_dir: Path, loaded):
    path = run_dir / ATTENTION_FILE
    assert path.is_file() and path.stat().st_size < 100_000
    weights, source, target, line = load_attention(path)
    dev = (run_dir / "dev.src.txt").read_text().splitlines()
    src = loaded.encode([dev[line - 1]])[0]
    assert line - 1 == fixed_sentence(loaded.encode(dev)) and source == [*loaded.pieces(src), "</s>"]
    tgt = [loaded.tokenizer.piece_to_id(p) for p in target[1:]]  # the run's translation, after BOS
    maps = attention_maps(loaded.model, src, tgt, loaded.pieces)
    assert maps.target == target
    for kind in KINDS:
        assert weights[kind].shape == tuple(maps.weights[kind].shape)
        assert torch.allclose(torch.from_numpy(weights[kind]), maps.weights[kind], atol=2e-3)  # float16


def test_group_a_figure_puts_every_rows_heads_side_by_side(run_dir: Path):
    import pandas as pd

    place = run_dir.name  # trials name their run directory relative to the runs directory
    runs = pd.DataFrame([{"row": "A1", "group": "A", "seed": 1, "run_dir": place},
                         {"row": "base", "group": "base", "seed": 1, "run_dir": place},
                         {"row": "D1", "group": "D", "seed": 1, "run_dir": place}])
    assert group_attention_pictures(runs, run_dir.parent)["attention_A.png"].startswith(b"\x89PNG")
    assert group_attention_pictures(runs[runs["row"] != "base"], run_dir.parent) == {}
    assert group_attention_pictures(runs, None) == {}  # the database alone: no figure
    weights, source, _, _ = load_attention(run_dir / ATTENTION_FILE)
    rows = [("base", weights[KINDS[0]], source), ("A1", weights[KINDS[0]][:, :1], source)]
    assert len(group_attention_figure(rows).axes) == 4 + 1


# --- the model-use commands' one validation layer (#60 class 3): one line, exit 2, nothing changed ---

def _copy_run(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "copy"))


def _newest_step_files(run: Path) -> list[Path]:
    steps = {p: int(torch.load(p, map_location="cpu", weights_only=True)["global_step"])
             for p in (run / "checkpoints").glob("*.ckpt")}
    newest = max(steps.values())
    return [p for p, step in steps.items() if step == newest]


@pytest.mark.parametrize("data, words", [(b"good\n\xff\xfe not utf-8\n", "line 2 is not UTF-8 text"),
                                         (b"a\x00b\n", "line 1 holds a NUL byte")], ids=["invalid-utf8", "nul"])
def test_translate_stdin_that_is_not_text_is_one_line(run_dir: Path, data: bytes, words: str):
    result = subprocess.run([sys.executable, "-m", "ablate", "translate", str(run_dir), "--device", "cpu"],
                            input=data, capture_output=True, timeout=120)
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("ablate: error: the input: ") and words in err, err


def test_model_use_arguments_are_checked_in_one_line(run_dir: Path, tmp_path: Path, capsys):
    """Each used to end in a traceback with exit 1, or was accepted: a checkpoint choice that is
    not one, a beam that cannot fit, an alpha that is not a number, an --input that is a folder."""
    before = _listing(run_dir)
    dev = str(run_dir / "dev.src.txt")
    _fails(capsys, ["evaluate", str(run_dir), "--checkpoint", "average:abc"], "last, best or average:K")
    _fails(capsys, ["translate", str(run_dir), "--checkpoint", "average:٣", "--input", dev], "last, best or average:K")
    _fails(capsys, ["translate", str(run_dir), "--beam", "100000000", "--input", dev, "--device", "cpu"],
           "--beam: must be at most 1,024")  # a beam's range (#72); one that fits it but not memory: next
    _fails(capsys, ["translate", str(run_dir), "--beam", "1024", "--batch-tokens", "100000000", "--input", dev,
                    "--device", "cpu"], "beam search with --beam 1024 would need")
    _fails(capsys, ["translate", str(run_dir), "--batch-tokens", "1000000000000", "--input", dev, "--device", "cpu"],
           "lower --beam or --batch-tokens")
    for alpha in ("nan", "inf", "-1"):
        _fails(capsys, ["translate", str(run_dir), "--alpha", alpha, "--input", dev], "--alpha: must be a finite number")
    _fails(capsys, ["translate", str(run_dir), "--input", str(tmp_path)], "is a directory, not a --input file")
    assert _listing(run_dir) == before


def test_damaged_or_foreign_checkpoints_and_tokenizer_are_one_line_and_change_nothing(run_dir: Path, tmp_path: Path,
                                                                                     capsys):
    """A copy of the run damaged five ways, each refused in one line without a file set aside
    (the commands only read a run): the newest checkpoint another, wider model's (averaging),
    one without hyper_parameters, every checkpoint a text file, a damaged spm.model."""
    run = _copy_run(run_dir, tmp_path)
    originals = {p: p.read_bytes() for p in (run / "checkpoints").glob("*.ckpt")}
    for path in _newest_step_files(run):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt["hyper_parameters"]["model"]["d_model"] = 64
        ckpt["state_dict"] = {k: torch.zeros(v.shape[0] * 2, *v.shape[1:]) if v.dim() else v
                              for k, v in ckpt["state_dict"].items()}
        torch.save(ckpt, path)
    listing = _listing(run)
    _fails(capsys, ["evaluate", str(run), "--checkpoint", "average:2", "--device", "cpu"], "hold different models (d_model)")
    _fails(capsys, ["translate", str(run), "--input", str(run / "dev.src.txt"), "--device", "cpu"], "do not fit the model")
    assert _listing(run) == listing
    for path in _newest_step_files(run):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        torch.save({"state_dict": ckpt["state_dict"], "global_step": ckpt["global_step"]}, path)
    _fails(capsys, ["translate", str(run), "--input", str(run / "dev.src.txt")], "holds no hyper_parameters.model")
    for path in originals:
        path.write_text("not a checkpoint\n")
    listing = _listing(run)
    _fails(capsys, ["translate", str(run), "--input", str(run / "dev.src.txt")], "is not a checkpoint this harness writes")
    assert _listing(run) == listing  # nothing set aside
    for path, data in originals.items():
        path.write_bytes(data)
    (run / "spm.model").write_text("not a model\n")
    listing = _listing(run)
    _fails(capsys, ["translate", str(run), "--input", str(run / "dev.src.txt")], "spm.model is damaged")
    assert _listing(run) == listing


def test_attention_without_out_writes_inside_the_run(run_dir: Path, tmp_path: Path, capsys):
    run = _copy_run(run_dir, tmp_path)
    assert main(["attention", str(run), "--line", "2", "--layer", "1", "--device", "cpu"]) == 0
    out = run / "attention-line-2-last"
    assert sorted(p.name for p in out.iterdir()) == ["decoder-self-attention.png", "encoder-decoder-attention.png",
                                                      "encoder-self-attention.png"]
    assert f"wrote {out}/" in capsys.readouterr().out


def test_attention_on_a_full_disk_is_one_line_exit_1_and_leaves_no_folder(run_dir: Path, tmp_path: Path):
    """`ablate attention --out` on a full disk (a 20 MB tmpfs): one line, exit status 1 (it was an
    `OSError: [Errno 28]` traceback), and no folder of maps left half written. (One layer's one
    head: the three maps of one panel each, which draw in a third of the time of all eight.)"""
    from test_bad_input import on_a_full_disk

    report = on_a_full_disk(tmp_path, 0, "attention", str(run_dir), "--line", "1", "--layer", "1", "--head", "1",
                            "--device", "cpu", "--out", "MOUNT/maps")
    lines = report["stderr"].strip().splitlines()
    assert report["code"] == 1 and len(lines) == 1 and "the disk is full" in lines[0], report["stderr"][-3000:]
    assert report["after"] == report["before"]


@pytest.mark.parametrize("damage, said", [(b"step,val/ppl\n\xff\xfe,1\n", "not CSV text (UnicodeDecodeError)"),
                                          (b"step,val/ppl\n3,abc\n", "line 2: 'abc' is not a number"),
                                          (b"step,val/ppl\n3,5.0,7\n", "line 2: \"['7']\" is not a number"),
                                          (b"step,val/ppl\n,5.0\n", "line 2 has no step")])
def test_a_damaged_log_is_one_line_naming_it(damage: bytes, said: str, run_dir: Path, tmp_path: Path, capsys):
    """`evaluate --checkpoint best` reads the dev PPL the run logged: a damaged logs/metrics.csv had
    been a traceback (#72); a line still being written at its end is not read."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "logs" / "metrics.csv").write_bytes(damage)
    _fails(capsys, ["evaluate", str(run), "--checkpoint", "best", "--device", "cpu"], f"metrics.csv is damaged ({said}")
