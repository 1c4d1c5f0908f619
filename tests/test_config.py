"""Configuration: validation, spec files, presets (tiny, paper, gpu), preset/row/file/override
resolution, `ablate params`. What the configuration refuses is tested here as the error it raises;
what a user sees of it on the command line (one line, exit 2) is in test_bad_input.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ablate.cli import main
from lightning_modules.config import ACCELERATORS, PRECISIONS, ScaleConfig, TrainConfig, TransformerConfig
from lightning_modules.data.corpora import WMT14_SPLITS
from foundation.errors import UserError
from ablations.resolve import parse_overrides, resolve
from ablations.spec import load_preset, load_spec, row_settings
from lightning_modules.transformer import Transformer, count_parameters

REPO = Path(__file__).resolve().parents[1]
TABLE3 = yaml.safe_load((REPO / "ablations" / "table3.yaml").read_text())
PRESETS = {name: yaml.safe_load((REPO / "ablations" / "presets" / f"{name}.yaml").read_text())
           for name in ("tiny", "paper")}
ROWS = ["base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
        "D1", "D2", "D3", "D4", "E", "big"]


def row_model(row: str) -> dict:
    """The row's model keys at the paper's scale: base's, overridden by the row's."""
    return {**TABLE3["base"]["model"], **TABLE3[row].get("model", {})}


def row_steps(row: str) -> int:
    return TABLE3[row].get("train_steps", TABLE3["base"]["train_steps"])


# --------------------------------------------------------------------------- TransformerConfig


@pytest.mark.parametrize("key", ["n_layers", "d_model", "d_ff", "n_heads", "max_len", "vocab_size",
                                 "d_k", "d_v"])
@pytest.mark.parametrize("value", [0, -1])
def test_config_rejects_non_positive_sizes(key, value):
    with pytest.raises(UserError, match=key):
        TransformerConfig(**{key: value})


@pytest.mark.parametrize("key", ["dropout", "label_smoothing"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_config_rejects_rates_outside_unit_interval(key, value):
    with pytest.raises(UserError, match=key):
        TransformerConfig(**{key: value})


@pytest.mark.parametrize("key", ["dropout", "label_smoothing"])
def test_config_accepts_rates_in_unit_interval(key):
    assert getattr(TransformerConfig(**{key: 0.0}), key) == 0.0
    assert getattr(TransformerConfig(**{key: 0.99}), key) == 0.99


def test_config_rejects_unknown_positional_kind():
    with pytest.raises(UserError, match="positional"):
        TransformerConfig(positional="rotary")
    assert TransformerConfig(positional="learned").positional == "learned"


def test_config_rejects_unknown_learning_rate_decay():
    with pytest.raises(UserError, match="lr_decay must be rsqrt or cosine"):
        TrainConfig(lr_decay="linear")


def test_config_needs_explicit_head_sizes_when_d_model_not_divisible():
    with pytest.raises(UserError, match="divisible"):
        TransformerConfig(d_model=100, n_heads=8)
    with pytest.raises(UserError, match="divisible"):
        TransformerConfig(d_model=100, n_heads=8, d_k=12)  # d_v still needs the default
    c = TransformerConfig(d_model=100, n_heads=8, d_k=12, d_v=13)
    assert (c.d_k, c.d_v) == (12, 13)


def test_head_sizes_default_to_d_model_over_h_and_are_independent():
    c = TransformerConfig(d_model=96, n_heads=6)
    assert (c.d_k, c.d_v) == (96 // 6, 96 // 6)
    c = TransformerConfig(d_model=96, n_heads=6, d_k=4)
    assert (c.d_k, c.d_v) == (4, 16)
    c = TransformerConfig(d_model=96, n_heads=6, d_v=40)
    assert (c.d_k, c.d_v) == (16, 40)


def test_config_rejects_pad_id_outside_vocabulary():
    with pytest.raises(UserError):
        TransformerConfig(vocab_size=10, pad_id=10)


# --------------------------------------------------------------------------- presets.resolve


@pytest.mark.parametrize("row", ROWS)
def test_tiny_preset_scales_each_row_by_one_rule(row):
    scale = PRESETS["tiny"]["scale"]
    paper = row_model(row)
    cfg = resolve("tiny", row)
    m = cfg.model
    assert cfg.row == row and cfg.preset == "tiny"
    assert m.d_model == round(paper["d_model"] * scale["width"])
    assert m.d_ff == round(paper["d_ff"] * scale["width"])
    assert m.n_layers == max(1, round(paper["n_layers"] * scale["depth"]))
    assert cfg.train.max_steps == round(row_steps(row) * scale["steps"])
    for key in ("d_k", "d_v"):  # head sizes a row sets explicitly are widths too
        if key in paper:
            assert getattr(m, key) == round(paper[key] * scale["width"])
    # what the rule keeps
    assert m.n_heads == paper["n_heads"]
    assert m.dropout == paper["dropout"]
    assert m.label_smoothing == paper["label_smoothing"]
    assert m.positional == paper["positional"]
    # the preset's own settings
    assert m.max_len == PRESETS["tiny"]["model"]["max_len"]
    assert cfg.train.warmup_steps == PRESETS["tiny"]["train"]["warmup_steps"]
    assert cfg.data.vocab_size == PRESETS["tiny"]["data"]["vocab_size"]


@pytest.mark.parametrize("row", ["A1", "A2", "A3", "A4"])
def test_tiny_a_rows_keep_h_times_d_k_equal_d_model(row):
    m = resolve("tiny", row).model
    assert m.n_heads * m.d_k == m.d_model
    assert m.n_heads * m.d_v == m.d_model
    assert m.n_heads == TABLE3[row]["model"]["n_heads"]


def test_tiny_b1_shrinks_d_k_and_keeps_d_v():
    base, b1 = resolve("tiny", "base").model, resolve("tiny", "B1").model
    width = PRESETS["tiny"]["scale"]["width"]
    assert b1.d_k == round(TABLE3["B1"]["model"]["d_k"] * width)
    assert b1.d_k < base.d_k
    assert b1.d_v == base.d_v
    assert (b1.d_model, b1.n_heads) == (base.d_model, base.n_heads)


@pytest.mark.parametrize("row", ["base", "B1", "C1", "C6", "D1", "E", "big"])
def test_tiny_default_head_sizes_are_scaled_d_model_over_h(row):
    m = resolve("tiny", row).model
    paper = row_model(row)
    width = PRESETS["tiny"]["scale"]["width"]
    assert m.d_v == round(paper["d_model"] // paper["n_heads"] * width) == m.d_model // m.n_heads
    if "d_k" not in paper:
        assert m.d_k == m.d_model // m.n_heads


def test_overriding_d_model_or_heads_rederives_default_head_sizes():
    m = resolve("paper", "base", overrides=["d_model=256"]).model
    assert (m.d_k, m.d_v) == (32, 32)
    with pytest.raises(UserError, match="divisible"):
        resolve("paper", "base", overrides=["n_heads=3"])


def test_paper_preset_is_unscaled():
    for row in ("base", "B1", "C5", "big"):
        cfg = resolve("paper", row)
        paper = row_model(row)
        for key in ("n_layers", "d_model", "d_ff", "n_heads", "dropout", "positional"):
            assert getattr(cfg.model, key) == paper[key], (row, key)
        assert cfg.train.max_steps == row_steps(row)


def test_overrides_flat_and_dotted_win_over_row_and_preset():
    cfg = resolve("tiny", "C1", overrides=["n_layers=2", "model.d_ff=100", "warmup_steps=7",
                                           "train.seed=5", "vocab_size=500", "beam_size=2",
                                           "length_penalty=1.0", "dropout=0.25"])
    assert cfg.model.n_layers == 2  # the row said 2 * 0.5 -> 1
    assert cfg.model.d_ff == 100
    assert cfg.model.dropout == 0.25
    assert cfg.train.warmup_steps == 7 and cfg.train.seed == 5
    assert cfg.data.vocab_size == 500  # a flat vocab_size is the BPE vocabulary
    assert cfg.eval.beam_size == 2 and cfg.eval.length_penalty == 1.0
    assert parse_overrides(["d_model=64", "train.compile=true", "data_dir=/x"]) == {
        "model": {"d_model": 64}, "train": {"compile": True}, "data": {"data_dir": "/x"}}


def test_a_scale_given_by_an_override_or_config_file_scales_the_row(tmp_path):
    """scale.* after the preset is the rule the row is scaled by (it was recorded, but did nothing)."""
    cfg = resolve("tiny", "C4", overrides=["scale.width=0.5"])
    assert (cfg.scale.width, cfg.model.d_model, cfg.model.d_k) == (0.5, 128, 16)  # C4: 256, 32 in the paper
    wide = tmp_path / "wide.yaml"
    wide.write_text("scale: {width: 1.0, steps: 0.001}\n")
    cfg = resolve("tiny", "C4", config_file=wide, overrides=["d_ff=100"])
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.train.max_steps) == (256, 100, 100)


@pytest.mark.parametrize("override", ["row=A1", "preset=paper"])
def test_row_and_preset_are_options_not_overrides(override):
    with pytest.raises(UserError, match="--row|--preset"):
        resolve("tiny", "base", overrides=[override])


def test_config_file_between_row_and_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model: {d_ff: 77, dropout: 0.05}\ntrain: {warmup_steps: 5}\n")
    cfg = resolve("tiny", "base", config_file=path)
    assert (cfg.model.d_ff, cfg.model.dropout, cfg.train.warmup_steps) == (77, 0.05, 5)
    cfg = resolve("tiny", "base", config_file=path, overrides=["d_ff=88"])
    assert (cfg.model.d_ff, cfg.train.warmup_steps) == (88, 5)


def test_tokenizer_derived_keys_cannot_be_overridden():
    with pytest.raises(UserError, match="data.vocab_size"):
        resolve("tiny", "base", overrides=["model.vocab_size=5"])


@pytest.mark.parametrize("override,closest", [("d_modle=3", "model.d_model"),
                                              ("model.d_modle=3", "model.d_model"),
                                              ("train.warmup_step=3", "train.warmup_steps")])
def test_unknown_key_suggests_closest(override, closest):
    with pytest.raises(UserError, match="unknown config key") as err:
        resolve("tiny", "base", overrides=[override])
    assert f"did you mean '{closest}'" in str(err.value)


@pytest.mark.parametrize("override,key", [("d_model=abc", "d_model"), ("max_steps=1.5", "max_steps"),
                                          ("n_layers=[1]", "n_layers")])
def test_wrong_type_is_a_user_error(override, key):
    with pytest.raises(UserError, match=key):
        resolve("tiny", "base", overrides=[override])


@pytest.mark.parametrize("override", ["dropout=1.5", "label_smoothing=-0.1", "positional=alibi",
                                      "d_ff=0", "beam_size=0"])
def test_invalid_values_are_user_errors(override):
    with pytest.raises(UserError):
        resolve("tiny", "base", overrides=[override])


@pytest.mark.parametrize("override,message", [
    ("norm_position=sandwich", "model.norm_position must be one of post, pre; got 'sandwich'"),
    ("norm=batchnorm", "model.norm must be one of layernorm, rmsnorm; got 'batchnorm'"),
    ("activation=swish", "model.activation must be one of relu, gelu, swiglu, geglu; got 'swish'"),
    ("positional=alibi", "model.positional must be one of sinusoidal, learned, rope; got 'alibi'"),
    ("tie_embeddings=encoder", "model.tie_embeddings must be one of all, decoder, none; got 'encoder'"),
    ("scale_embeddings=maybe", "model.scale_embeddings"),
    ("n_kv_heads=0", "model.n_kv_heads must be positive, got 0"),
    ("n_kv_heads=3", "model.n_kv_heads=3 does not divide model.n_heads=8"),
    ("n_kv_heads=16", "model.n_kv_heads=16 does not divide model.n_heads=8"),
    # kernel choices
    ("attention_backend=xformers", "model.attention_backend must be one of auto, math, flash, efficient, cudnn; "
                                   "got 'xformers'"),
    ("fused_qkv=maybe", "model.fused_qkv"),
    ("residual_bf16=maybe", "model.residual_bf16"),
    ("loss_chunks=-1", "train.loss_chunks must be 0 (off) or a count of chunks >= 1, got -1"),
    ("loss_chunks=2.5", "train.loss_chunks"),
    ("loss_chunks=true", "train.loss_chunks"),
])
def test_a_bad_modification_knob_or_kernel_choice_is_one_line(override, message):
    with pytest.raises(UserError) as err:
        resolve("tiny", "base", overrides=[override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [2.5, True, -3])
def test_loss_chunks_of_a_config_file_or_code_must_be_a_count(value):
    with pytest.raises(UserError, match=r"train.loss_chunks must be 0 \(off\) or a count of chunks >= 1"):
        TrainConfig(loss_chunks=value)
    with pytest.raises(UserError, match="model.fused_qkv must be true or false"):
        TransformerConfig(fused_qkv="yes")


def test_kernel_choices_resolve_from_overrides_and_default_to_the_unchanged_step():
    cfg = resolve("tiny", "base", overrides=["attention_backend=cudnn", "fused_qkv=true", "loss_chunks=8"])
    assert (cfg.model.attention_backend, cfg.model.fused_qkv, cfg.train.loss_chunks) == ("cudnn", True, 8)
    default = resolve("tiny", "base")
    assert (default.model.attention_backend, default.model.fused_qkv, default.train.loss_chunks) == ("auto", False, 0)


def test_rotary_positions_need_an_even_key_size():
    with pytest.raises(UserError, match="even model.d_k, got 5"):
        resolve("tiny", "base", overrides=["positional=rope", "d_k=5"])
    assert resolve("tiny", "base", overrides=["positional=rope", "d_k=6"]).model.d_k == 6


def test_precision_and_accelerator_names_are_lightnings():
    """The names train.precision and train.accelerator accept are the ones Lightning takes."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT
    from lightning.pytorch.accelerators import AcceleratorRegistry

    lightning_precisions = {str(v) for part in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(part)}
    assert set(PRECISIONS) - {"auto"} == lightning_precisions
    assert set(AcceleratorRegistry.available_accelerators()) | {"auto", "gpu"} == set(ACCELERATORS)


def test_malformed_override_is_a_user_error():
    with pytest.raises(UserError, match="key=value"):
        resolve("tiny", "base", overrides=["d_model"])


def test_unknown_row_and_preset():
    with pytest.raises(UserError, match="unknown row 'Z9'"):
        resolve("tiny", "Z9")
    with pytest.raises(UserError, match="unknown preset 'nope'") as err:
        resolve("nope", "base")
    assert "paper" in str(err.value) and "tiny" in str(err.value)


def test_config_file_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        resolve("tiny", "base", config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: 64\n  d_ff: 128: 7\ntrain: {}\n")
    with pytest.raises(UserError, match="line 3") as err:
        resolve("tiny", "base", config_file=bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="mapping"):
        resolve("tiny", "base", config_file=listing)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("model: {d_modle: 3}\n")
    with pytest.raises(UserError, match="did you mean 'model.d_model'"):
        resolve("tiny", "base", config_file=unknown)


def test_spec_validation(tmp_path):
    no_base = tmp_path / "nobase.yaml"
    no_base.write_text("X1: {model: {d_ff: 3}}\n")
    with pytest.raises(UserError, match="base"):
        load_spec(no_base)
    bad_key = tmp_path / "badkey.yaml"
    bad_key.write_text("base: {model: {d_model: 8}}\nX1: {model: {d_fff: 3}}\n")
    with pytest.raises(UserError, match="d_fff"):
        load_spec(bad_key)
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: {model: {d_model: 64, n_heads: 4}, train_steps: 10}\n"
                    "wide: {model: {d_ff: 300}}\n")
    cfg = resolve("paper", "wide", spec_path=mine)
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.train.max_steps) == (64, 300, 10)


def test_spec_with_a_row_given_twice_is_refused(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: {d_model: 8}}\nX1: {model: {d_ff: 3}}\nX1: {model: {d_ff: 4}}\n")
    with pytest.raises(UserError, match="'X1' is given twice"):
        load_spec(spec)


# --------------------------------------------------------------------------- ablate params


def expected_params(row: str, vocab_size: int = 37000) -> int:
    c = TransformerConfig(**{**row_model(row), "vocab_size": vocab_size,
                             "max_len": PRESETS["paper"]["model"]["max_len"]})
    return count_parameters(c)


def check_params_table(table: list[dict], vocab_size: int = 37000) -> None:
    assert [entry["row"] for entry in table] == ROWS
    for entry in table:
        assert entry["params"] == expected_params(entry["row"], vocab_size), entry["row"]
        assert entry["paper_params"] == TABLE3[entry["row"]]["paper"]["params_m"], entry["row"]


def test_params_json_subprocess():
    proc = subprocess.run([sys.executable, "-m", "ablate", "params", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = json.loads(proc.stdout)
    check_params_table(table)
    assert table[0]["params"] == 63_082_496


def test_params_json_in_process(capsys):
    assert main(["params", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    check_params_table(table)
    base = next(entry for entry in table if entry["row"] == "base")
    assert base["params"] == 63_082_496
    assert main(["params", "--json", "--vocab-size", "100"]) == 0
    small = json.loads(capsys.readouterr().out)
    check_params_table(small, vocab_size=100)
    assert small[0]["params"] == 63_082_496 - (37000 - 100) * 512  # only the shared matrix shrinks


def test_params_of_the_modifications_spec_are_the_instantiated_models(capsys):
    import torch

    assert main(["params", "--json", "--spec", "ablations/modifications.yaml"]) == 0
    table = {entry["row"]: entry for entry in json.loads(capsys.readouterr().out)}
    spec = load_spec("ablations/modifications.yaml")
    assert list(table) == list(spec)
    for row, entry in table.items():
        c = TransformerConfig(**{**row_settings(row, spec, ScaleConfig())["model"], "vocab_size": 37000,
                                 "max_len": PRESETS["paper"]["model"]["max_len"]})
        with torch.device("meta"):
            assert entry["params"] == sum(p.numel() for p in Transformer(c).parameters()), row
    # by hand, from base's 63,082,496 (d = 512, N = 6: 5 norms a layer pair, 18 attentions)
    base, d = 63_082_496, 512
    assert table["rmsnorm"]["params"] == base - 6 * 5 * d  # a norm loses its bias
    assert table["pre_ln"]["params"] == base + 2 * 2 * d  # two final LayerNorms
    assert table["untied"]["params"] == base + 2 * 37000 * d
    assert table["tie_decoder"]["params"] == base + 37000 * d
    assert table["mqa"]["params"] == base - 18 * 7 * (d * 128 + 128)  # 7 of 8 K/V heads gone
    assert table["swiglu"]["params"] == base - 12 * (2 * d * 2048 + 2048 + d) \
        + 12 * (3 * d * 1365 + 2 * 1365 + d)  # 12 FFNs, each with two input projections
    assert table["modern"]["modifications"] == "norm_position=pre, norm=rmsnorm, activation=swiglu"
    assert main(["params", "--spec", "ablations/modifications.yaml"]) == 0
    assert "n_kv_heads=1" in capsys.readouterr().out


def test_params_text_table_lists_every_row(capsys):
    assert main(["params"]) == 0
    out = capsys.readouterr().out
    assert "63,082,496" in out
    lines = out.splitlines()
    for row in ROWS:
        assert any(line.split()[0] == row for line in lines[3:] if line.strip()), row


def test_paper_preset_has_the_papers_training_setup():
    """Sections 5.1-5.4 and 6.1 of the paper, checked value by value (no GPU needed)."""
    base, big = resolve("paper", "base"), resolve("paper", "big")
    t, d, e = base.train, base.data, base.eval
    assert (t.adam_beta1, t.adam_beta2, t.adam_eps) == (0.9, 0.98, 1e-9)
    assert t.warmup_steps == 4000 and t.lr_scale == 1.0 and t.gradient_clip_val == 0.0
    assert t.max_steps == 100_000 and big.train.max_steps == 300_000
    assert d.corpus == "wmt14" and d.vocab_size == 37_000 and d.max_tokens == 25_000
    assert (e.beam_size, e.length_penalty, e.max_len_offset) == (4, 0.6, 50)
    assert (base.model.dropout, base.model.label_smoothing) == (0.1, 0.1)
    assert (big.model.d_model, big.model.d_ff, big.model.n_heads, big.model.dropout) == (1024, 4096, 16, 0.3)
    assert (base.model.d_k, base.model.d_v, big.model.d_k, big.model.d_v) == (64, 64, 64, 64)


def test_gpu_preset_is_the_papers_architecture_on_a_wmt14_subset_with_newstest2013_dev():
    for row in ("base", "C3", "big"):
        ours, paper = resolve("gpu", row), resolve("paper", row)
        assert replace(ours.model, max_len=paper.model.max_len) == paper.model  # no width or depth scaling
    cfg = resolve("gpu", "base")
    assert cfg.data.corpus == "wmt14" and WMT14_SPLITS["valid"] == "newstest2013"
    assert cfg.data.train_pairs == 1_000_000 and cfg.train.lr_decay == "cosine"
    assert cfg.eval.beam_size == 4 and cfg.eval.length_penalty == 0.6
    model = Transformer(cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id))
    assert sum(p.numel() for p in model.parameters()) == count_parameters(
        cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id))


def test_gpu_preset_warms_up_as_the_paper_to_the_papers_peak():
    """The preset's warmup and peak are the paper's for every row (a 1,000-step warmup doubled the
    peak and collapsed base on an H100: benchmarks/results/gpu-h100-2026-11-23)."""
    from lightning_modules.translation import lrate

    for row in ("base", "C3", "big"):
        ours, paper = resolve("gpu", row), resolve("paper", row)
        d_model, warmup = ours.model.d_model, paper.train.warmup_steps
        assert ours.train.warmup_steps == warmup == 4000
        peak = lrate(warmup, d_model, ours.train)
        assert peak == pytest.approx(lrate(warmup, d_model, paper.train))
        assert max(lrate(s, d_model, ours.train) for s in range(1, ours.train.max_steps + 1, 50)) <= peak
        assert lrate(ours.train.max_steps, d_model, ours.train) == pytest.approx(0.0, abs=1e-12)
    assert lrate(4000, 512, resolve("gpu", "base").train) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)


def test_a_spec_is_read_again_once_its_file_changes_and_each_caller_gets_its_own_copy(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {group: base, model: {}}\nwide: {group: C, model: {d_model: 1024}}\n")
    first = load_spec(spec)
    first["wide"]["model"]["d_model"] = 1  # a caller's change stays its own
    assert load_spec(spec)["wide"]["model"]["d_model"] == 1024
    spec.write_text("base: {group: base, model: {}}\nwide: {group: C, model: {d_model: 2048}}\n")
    os.utime(spec, ns=(0, spec.stat().st_mtime_ns + 1))  # a new version even on a coarse clock
    assert load_spec(spec)["wide"]["model"]["d_model"] == 2048
    assert resolve("tiny", "wide", spec_path=spec).model.d_model == 2048 * load_preset("tiny")["scale"]["width"]


def test_a_row_may_change_the_recipe_scaled_by_the_presets_own_ratio(tmp_path):
    """`train:`/`data:` in a row, at the paper's scale: a number the paper sets follows the preset's
    ratio for it (cpu's warmup 300 of the paper's 4,000, lr_scale 0.5 of 1, 1,500 of 25,000 tokens);
    0, text, switches and what the paper leaves unset are taken as given."""
    spec = tmp_path / "recipe.yaml"
    spec.write_text("base: {model: {d_model: 512}, train_steps: 100000}\n"
                    "slow: {train: {warmup_steps: 8000, lr_scale: 2.0, lr_decay: rsqrt}, data: {max_tokens: 50000}}\n"
                    "nowarm: {train: {warmup_steps: 0, gradient_clip_val: 1.0}, data: {train_pairs: 500}}\n")
    for preset, warmup, lr, tokens in (("paper", 8000, 2.0, 50000), ("cpu", 600, 1.0, 3000), ("gpu", 8000, 2.0, 50000)):
        cfg = resolve(preset, "slow", spec_path=spec)
        base = resolve(preset, "base", spec_path=spec)
        assert (cfg.train.warmup_steps, cfg.train.lr_scale, cfg.data.max_tokens) == (warmup, lr, tokens), preset
        assert cfg.train.lr_decay == "rsqrt" and cfg.train.max_steps == base.train.max_steps
        assert (cfg.model, cfg.data.corpus) == (base.model, base.data.corpus)
    nowarm = resolve("cpu", "nowarm", spec_path=spec)
    assert (nowarm.train.warmup_steps, nowarm.train.gradient_clip_val, nowarm.data.train_pairs) == (0, 1.0, 500)
    assert resolve("cpu", "nowarm", None, ["train.warmup_steps=5"], spec).train.warmup_steps == 5  # overrides win
    shipped = resolve("cpu", "pre_ln_nowarm", spec_path="ablations/modifications.yaml")
    assert (shipped.train.warmup_steps, shipped.model.norm_position) == (0, "pre")


@pytest.mark.parametrize("row,message", [
    ("{data: {corpus: multi30k}}", "cannot change data.corpus: every row of a table is compared on the same corpus"),
    ("{data: {valid_size: 10}}", "cannot change data.valid_size"),
    ("{eval: {beam_size: 1}}", "cannot change eval: every row of a table is scored with the same BLEU settings"),
    ("{train: {seed: 4}}", "cannot change train.seed: the seeds are the table's"),
    ("{train: {max_steps: 4}}", "cannot change train.max_steps: a row sets its steps with train_steps"),
    ("{train: {devices: '2'}}", "cannot change train.devices: where a run trains is the launcher's"),
    ("{train: {wandb: 'off'}}", "cannot change train.wandb: it only chooses where or how often output is written"),
    ("{train: {warmup_step: 0}}", "unknown train key 'warmup_step' (did you mean 'warmup_steps'?)"),
    ("{train: {warmup_steps: soon}}", "train.warmup_steps"),
    ("{train: [1]}", "train must be a mapping"),
])
def test_a_row_that_would_change_what_the_table_compares_on_is_refused_in_one_line(tmp_path, row, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"base: {{model: {{d_model: 64}}}}\nX9: {row}\n")
    with pytest.raises(UserError) as caught:
        load_spec(spec)
    assert message in str(caught.value) and "row 'X9'" in str(caught.value) and "\n" not in str(caught.value)


def test_a_rows_recipe_is_part_of_the_tables_identity_and_shows_as_a_change(tmp_path, capsys):
    from ablate.cli import main
    from reports.table3 import changes, paper_configuration
    from tables.plan import make_plan, queue

    spec = tmp_path / "mine.yaml"
    spec.write_text("base: {model: {d_model: 512}, train_steps: 100000}\nnowarm: {train: {warmup_steps: 0}}\n")
    rows = load_spec(spec)
    base = paper_configuration("base", rows)
    assert changes(pd.Series(paper_configuration("nowarm", rows), name="nowarm"), base) == "warmup_steps 0"
    assert changes(pd.Series(paper_configuration("base", rows), name="X"), base) == "as base"
    storage = f"sqlite:///{tmp_path}/t.db"
    queue(make_plan("demo", storage, str(tmp_path / "runs"), [], spec_path=str(spec)))
    assert main(["table3", "--preset", "demo", "--spec", str(spec), "--storage", storage, "--runs-dir",
                 str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[-1] == "recipe" and "warmup_steps 0" in out.splitlines()[3]
    spec.write_text("base: {model: {d_model: 512}, train_steps: 100000}\nnowarm: {train: {warmup_steps: 4000}}\n")
    assert main(["table3", "--preset", "demo", "--spec", str(spec), "--storage", storage, "--runs-dir",
                 str(tmp_path / "runs"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "train.warmup_steps: 0 -> 200 in nowarm-s1" in err and "the ablation spec" in err


def test_row_without_a_name_lists_the_rows_of_the_spec(capsys):
    assert main(["train", "--spec", "ablations/modifications.yaml", "--row"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "rows of ablations/modifications.yaml:"
    assert [line.split()[0] for line in out[1:]] == list(load_spec("ablations/modifications.yaml"))
    assert main(["train", "--row"]) == 0 and "  big " in capsys.readouterr().out  # Table 3's by default
