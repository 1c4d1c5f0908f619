"""Derived values stay derived: every way of asking for one model builds that model.

d_k and d_v are d_model / h, and n_kv_heads is h, unless a row, a file or an override sets them;
the model's vocabulary
is the tokenizer's. A saved config.yaml records what was asked for (derived head sizes as null,
no tokenizer keys), so loading it with overrides gives what the same overrides give a fresh row.
"""

from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
import torch
import yaml

from ablations.resolve import resolve
from ablations.spec import load_spec
from lightning_modules.config import TransformerConfig, to_yaml
from lightning_modules.transformer import Transformer

OVERRIDES = [[], ["d_model=256"], ["n_heads=4"], ["d_model=64", "n_heads=2"], ["d_model=256", "d_v=8"]]


def shapes(model: TransformerConfig) -> dict[str, tuple[int, ...]]:
    torch.manual_seed(0)
    return {k: tuple(v.shape) for k, v in Transformer(model.with_vocabulary(100, 0)).state_dict().items()}


def every_way(tmp_path, row: str, overrides: list[str]) -> dict[str, TransformerConfig]:
    """The same request reached by a row, a saved config.yaml and a spec file of one's own."""
    saved = tmp_path / f"{row}-config.yaml"
    saved.write_text(to_yaml(resolve("tiny", row)))
    table = load_spec()
    spec = tmp_path / "mine.yaml"
    spec.write_text(yaml.safe_dump({"base": table["base"], "mine": copy.deepcopy(table[row])}))  # no YAML alias for base
    return {
        "row + overrides": resolve("tiny", row, overrides=overrides).model,
        "saved config + overrides": resolve("tiny", "base", config_file=saved, overrides=overrides).model,
        "spec file + overrides": resolve("tiny", "mine", overrides=overrides, spec_path=spec).model,
    }


@pytest.mark.parametrize("row", ["base", "A1", "A3", "B1", "B2", "C4", "big"])
@pytest.mark.parametrize("overrides", OVERRIDES, ids=" ".join)
def test_every_way_to_ask_builds_the_identical_model(tmp_path, row, overrides):
    models = every_way(tmp_path, row, overrides)
    first = models["row + overrides"]
    for way, model in models.items():
        assert asdict(model) == asdict(first), way
        assert model.derived_keys() == first.derived_keys(), way
    assert shapes(models["saved config + overrides"]) == shapes(first)


def test_saved_base_config_with_a_new_width_derives_the_head_sizes_again(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(resolve("tiny", "base")))
    assert yaml.safe_load(saved.read_text())["model"]["d_k"] is None
    m = resolve("tiny", "base", config_file=saved, overrides=["d_model=256"]).model
    assert (m.d_k, m.d_v) == (32, 32) == (resolve("tiny", "base", overrides=["d_model=256"]).model.d_k,) * 2
    assert m.n_heads * m.d_k == m.d_model


@pytest.mark.parametrize("row", ["B1", "B2"])
def test_a_row_that_sets_d_k_keeps_it(tmp_path, row):
    width = 0.25  # the tiny preset
    explicit = round(load_spec()[row]["model"]["d_k"] * width)
    for way, model in every_way(tmp_path, row, ["d_model=256"]).items():
        assert model.d_k == explicit, way
        assert model.d_v == 256 // 8, way  # d_v was never set: it follows d_model
        assert model.derived_keys() == ("d_v", "n_kv_heads"), way


def test_key_value_heads_follow_h_unless_set(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(resolve("tiny", "base")))
    assert yaml.safe_load(saved.read_text())["model"]["n_kv_heads"] is None
    m = resolve("tiny", "base", config_file=saved, overrides=["n_heads=4"]).model
    assert (m.n_heads, m.n_kv_heads) == (4, 4)
    spec = "ablations/modifications.yaml"
    saved.write_text(to_yaml(resolve("tiny", "mqa", spec_path=spec)))
    for model in (resolve("tiny", "base", config_file=saved, overrides=["n_heads=4"]).model,
                  resolve("tiny", "mqa", overrides=["n_heads=4"], spec_path=spec).model):
        assert (model.n_heads, model.n_kv_heads, model.derived_keys()) == (4, 1, ("d_k", "d_v"))


def test_config_yaml_holds_no_derived_value():
    saved = yaml.safe_load(to_yaml(resolve("tiny", "B1")))
    assert saved["model"]["d_k"] == 4 and saved["model"]["d_v"] is None
    assert "vocab_size" not in saved["model"] and "pad_id" not in saved["model"]
    assert saved["data"]["vocab_size"] == 4000


def test_model_keeps_explicit_and_derived_head_sizes_apart():
    m = TransformerConfig(d_model=96, n_heads=6, d_k=4)
    assert (m.d_k, m.d_v, m.derived_keys()) == (4, 16, ("d_v", "n_kv_heads"))
    assert m.requested()["d_v"] is None and asdict(m)["d_v"] == 16
    bigger = TransformerConfig(**{**m.requested(), "d_model": 192})
    assert (bigger.d_k, bigger.d_v) == (4, 32)
    sized = m.with_vocabulary(500, 0)
    assert (sized.vocab_size, sized.d_k, sized.derived_keys()) == (500, 4, ("d_v", "n_kv_heads"))
