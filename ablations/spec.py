"""Table 3 as data: reading the ablation spec (`ablations/table3.yaml` or your own) and the scale
presets (`ablations/presets/`), and the scale rule that turns a row at the paper's scale into the
row at a preset's scale.

A spec is a mapping of row names to `{group, model, train, data, train_steps, paper}`; every row
overrides `base`. A row name given twice is refused (YAML would silently keep the last one).

A row's values are at the paper's scale, and a preset scales them by one rule (`row_settings`):
widths times scale.width, N times scale.depth, train_steps times scale.steps, and a `train:` or
`data:` number the paper sets (warmup 4000, lr_scale 1.0, 25K tokens, a 37K vocabulary, ...)
times the ratio the preset itself applies to that number (cpu's warmup 300 / the paper's 4000):
a row that halves the paper's warmup halves the preset's. Other `train:`/`data:` values (text,
switches, numbers the paper leaves unset or at zero) are taken as they are. What every row of a
table must share is refused in a row (`ROW_REFUSED`): the corpus and its dev and test sets, the
BLEU settings (`eval`), the seed (the table's), where a run trains, and output-only fields.
"""

from __future__ import annotations

import math
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_modules.config import MAX_NUMBER, DataConfig, ScaleConfig, TrainConfig, TransformerConfig
from foundation.errors import UserError, did_you_mean
from foundation.names import check_name
from foundation.io import check_readable_file
from foundation.yaml_input import read_yaml

if TYPE_CHECKING:
    from omegaconf import DictConfig

WIDTH_KEYS = ("d_model", "d_ff", "d_k", "d_v")  # what scale.width multiplies
# The keys each scale setting sets in a row (`row_settings`)
SCALED_KEYS = {"scale.width": {f"model.{key}" for key in WIDTH_KEYS}, "scale.depth": {"model.n_layers"},
               "scale.steps": {"train.max_steps"}}
MAX_ROWS = 1000  # rows a spec may have (the paper's Table 3 has 24)


def _ablations_dir() -> Path:
    return Path(str(resources.files("ablations")))


def load_yaml(path: str | Path, what: str = "file") -> dict[str, Any]:
    """A YAML mapping from `path`, or a one-line UserError. Every YAML file a command reads comes
    through here (`foundation.yaml_input`: size, alias and depth limits, and a key given
    twice is refused in every file)."""
    path = check_readable_file(path, what)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def preset_names() -> list[str]:
    return sorted(p.stem for p in (_ablations_dir() / "presets").glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    path = _ablations_dir() / "presets" / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"unknown preset {name!r}; choose from {', '.join(preset_names())}")
    return load_yaml(path, "preset")


def default_spec_path() -> Path:
    return _ablations_dir() / "table3.yaml"


def load_spec(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The ablation rows: {row name: {group, model, train_steps, paper}}, base first, each value
    checked against its type (model keys: TransformerConfig's, converted like '64' -> 64). A table's
    plan reads it once (`ablations.resolve.Resolver`)."""
    path = Path(path) if path else default_spec_path()
    rows = load_yaml(path, "ablation spec")
    if len(rows) > MAX_ROWS:  # each row is checked and may be planned: a bound on the time it takes
        raise UserError(f"{path}: {len(rows):,} rows, more than the {MAX_ROWS:,} a spec may have")
    if "base" not in rows:
        raise UserError(f"{path}: an ablation spec needs a 'base' row")
    from omegaconf import OmegaConf  # ~50 ms: not for `ablate --help`, which lists the presets

    schemas = {section: OmegaConf.structured(owner) for section, owner in (("model", TransformerConfig),
                                                                             *RECIPE_SECTIONS.items())}
    return {name: _checked_row(f"{path}: row {name!r}", name, row, schemas) for name, row in rows.items()}


ROW_KEYS = ("group", "model", "train", "data", "train_steps", "paper")
RECIPE_SECTIONS = {"train": TrainConfig, "data": DataConfig}  # a row's training and data settings
_SAME_DATA = "every row of a table is compared on the same corpus, dev and test sets"
# Settings a row may not change, and why: the table's comparison or its runs depend on them.
ROW_REFUSED = {
    **{f"data.{key}": _SAME_DATA for key in (
        "corpus", "src_lang", "tgt_lang", "ding_path", "valid_size", "test_size", "train_src",
        "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt", "data_dir", "base_url")},
    "train.max_steps": "a row sets its steps with train_steps (at the paper's scale)",
    "train.seed": "the seeds are the table's (--seeds), the same for every row",
    **{f"train.{key}": "where a run trains is the launcher's, not a row's" for key in (
        "accelerator", "devices", "strategy", "num_nodes")},
}
PAPER_KEYS = ("ppl", "bleu", "params_m")  # the paper's dev PPL, dev BLEU, parameters in millions


def _checked_row(where: str, name: Any, row: Any, schemas: dict[str, DictConfig]) -> dict[str, Any]:
    """One row of a spec, or a one-line UserError naming the row and key."""
    if not isinstance(name, str):
        raise UserError(f"{where}: a row name must be text (quote it: '{name}')")
    check_name(name, "row name", where.rsplit(": row ", 1)[0])
    if not isinstance(row, dict) or not isinstance(row.get("model", {}), dict):
        raise UserError(f"{where} must be a mapping with a 'model' mapping")
    if "eval" in row:
        raise UserError(f"{where}: a row cannot change eval: every row of a table is scored with the "
                        f"same BLEU settings (beam, length penalty, tokenizer)")
    unknown = set(row) - set(ROW_KEYS)
    if unknown:
        raise UserError(f"{where} has unknown keys: {', '.join(sorted(map(str, unknown)))}; "
                        f"a row has {', '.join(ROW_KEYS)}")
    steps = row.get("train_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise UserError(f"{where}: train_steps must be a whole number of steps >= 1, got {steps!r}")
    if not isinstance(row.get("group", ""), str):
        raise UserError(f"{where}: group must be text, got {row['group']!r}")
    if "group" in row:
        check_name(row["group"], "group name", where)
    _check_paper(where, row.get("paper"))
    recipe = {section: _typed_recipe(where, section, row[section], schemas[section])
              for section in RECIPE_SECTIONS if section in row}
    return {**row, **recipe, "model": _typed_model(where, row.get("model", {}), schemas["model"])}


def _typed_recipe(where: str, section: str, values: Any, schema: DictConfig) -> dict[str, Any]:
    """A row's `train:` or `data:` mapping: keys of TrainConfig or DataConfig (`schema`) that a row
    may change (`ROW_REFUSED` says why not), each of its field's type."""
    owner = RECIPE_SECTIONS[section]
    if not isinstance(values, dict):
        raise UserError(f"{where}: {section} must be a mapping like {{warmup_steps: 0}}, got {values!r}")
    known = {f.name: f for f in fields(owner)}
    for key in values:
        if key not in known:
            raise UserError(f"{where}: unknown {section} key {key!r}{did_you_mean(str(key), known)}")
        if f"{section}.{key}" in ROW_REFUSED:
            raise UserError(f"{where}: a row cannot change {section}.{key}: {ROW_REFUSED[f'{section}.{key}']}")
        if known[key].metadata.get("not_trained") == "output":
            raise UserError(f"{where}: a row cannot change {section}.{key}: it only chooses where or how "
                            f"often output is written, never what a run trains")
    return _typed(where, section, values, schema)


def _check_paper(where: str, paper: Any) -> None:
    """`paper`: a mapping of the paper's printed numbers (null where it prints none)."""
    if paper is None:
        return
    if not isinstance(paper, dict):
        raise UserError(f"{where}: paper must be a mapping like {{ppl: 4.92, bleu: 25.8, params_m: 65}}, "
                        f"got {paper!r}")
    unknown = set(paper) - set(PAPER_KEYS)
    if unknown:
        raise UserError(f"{where}: paper has unknown keys: {', '.join(sorted(map(str, unknown)))}; "
                        f"use {', '.join(PAPER_KEYS)}")
    for key, value in paper.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{where}: paper.{key} must be a number or null, got {value!r}")


def _typed_model(where: str, model: dict[str, Any], schema: DictConfig) -> dict[str, Any]:
    """The row's model keys, known to TransformerConfig (`schema`) and of its field types."""
    unknown = set(model) - {f.name for f in fields(TransformerConfig)}
    if unknown:
        raise UserError(f"{where} has unknown model keys: {', '.join(sorted(map(str, unknown)))}")
    return _typed(where, "model", model, schema)


def _typed(where: str, section: str, values: dict[str, Any], schema: DictConfig) -> dict[str, Any]:
    """`values` (known keys of `section`) as their fields' types (`schema`: the section's
    structured config; '64' -> 64), or one line naming the row and key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        typed = OmegaConf.merge(schema, values)
    except OmegaConfBaseException as err:
        raise UserError(f"{where}: {section}.{err.full_key}: {str(err).splitlines()[0]}") from None
    for key in values:  # before a preset's ratio multiplies it (a 401-digit warmup overflowed the float)
        value = typed[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not (abs(value) <= MAX_NUMBER and (isinstance(value, int) or math.isfinite(value))):
            raise UserError(f"{where}: {section}.{key} must be a finite number of at most {MAX_NUMBER:.0e} in size, "
                            f"got {str(value)[:20]}{'...' if len(str(value)) > 20 else ''}")
    return {key: typed[key] for key in values}


def row_settings(row: str, spec: dict[str, dict[str, Any]], scale: ScaleConfig,
                 ratios: dict[str, float] | None = None) -> dict[str, Any]:
    """The row's model keys, training steps and `train:`/`data:` settings (base overridden by the
    row), scaled by `scale` and by the preset's `ratios` ({'train.warmup_steps': 0.075, ...}: the
    preset's value of a key over the paper's, `recipe_ratios`; a key without one stays as given)."""
    if row not in spec:
        raise UserError(f"unknown row {row!r}{did_you_mean(row, spec)}; rows: {', '.join(spec)}")
    base, chosen = spec["base"], spec[row]
    model = {**base.get("model", {}), **chosen.get("model", {})}
    for key in WIDTH_KEYS:
        if model.get(key) is not None:
            model[key] = max(1, round(model[key] * scale.width))
    if "n_layers" in model:
        model["n_layers"] = max(1, round(model["n_layers"] * scale.depth))
    settings: dict[str, Any] = {"model": model}
    for section in RECIPE_SECTIONS:
        values = {**base.get(section, {}), **chosen.get(section, {})}
        if values:
            settings[section] = {key: _scaled(value, (ratios or {}).get(f"{section}.{key}"))
                                 for key, value in values.items()}
    steps = chosen.get("train_steps", base.get("train_steps"))
    if steps is not None:
        settings.setdefault("train", {})["max_steps"] = max(1, round(steps * scale.steps))
    return settings


def _scaled(value: Any, ratio: float | None) -> Any:
    """A row's number at the paper's scale times the preset's ratio for its key (whole numbers
    stay whole, and a positive one at least 1); anything else as it is."""
    if ratio is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        return max(1, round(value * ratio)) if value > 0 else value
    return value * ratio


def recipe_ratios(preset: dict[str, Any], paper: dict[str, Any]) -> dict[str, float]:
    """For each number the paper's configuration sets (`paper`: {'train': {...}, 'data': {...}},
    nonzero), the preset's value over it: how the preset scales that setting."""
    ratios = {}
    for section in RECIPE_SECTIONS:
        for key, ours in preset.get(section, {}).items():
            theirs = paper.get(section, {}).get(key)
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ours, theirs)) and theirs:
                ratios[f"{section}.{key}"] = ours / theirs
    return ratios


def recipe_changes(row: str, spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `train:`/`data:` settings where `row` differs from base, at the paper's scale:
    {'train.warmup_steps': 0}."""
    base, chosen = spec["base"], spec[row]
    return {f"{section}.{key}": value for section in RECIPE_SECTIONS
            for key, value in chosen.get(section, {}).items() if base.get(section, {}).get(key) != value}


def table3_section(preset: str) -> dict[str, Any]:
    """What a preset says about its Table 3 (`table3:` in its YAML: rows, seeds, note, cost)."""
    return load_preset(preset).get("table3") or {}


def default_rows(preset: str) -> list[str] | None:
    """A preset may name the rows its table runs by default (`table3: {rows: [...]}`)."""
    return table3_section(preset).get("rows")


def default_seeds(preset: str) -> list[int] | None:
    """A preset may name the seeds its table runs by default (`table3: {seeds: [1, 2, 3]}`)."""
    seeds = table3_section(preset).get("seeds")
    return [int(s) for s in seeds] if seeds else None


def one_seed_rows(preset: str, spec: dict[str, dict[str, Any]]) -> list[str]:
    """Rows a preset runs with its first seed only (`table3: {one_seed_when_paper_differs_by: F}`):
    those whose paper dev PPL differs from the paper's base by at least F x base's, a difference
    far beyond seed noise, so more seeds would not change what the row says. Rows or specs
    without the paper's numbers get every seed."""
    share = table3_section(preset).get("one_seed_when_paper_differs_by")
    if share is None:
        return []
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share:
        raise UserError(f"preset {preset!r}: table3.one_seed_when_paper_differs_by must be a positive "
                        f"fraction of base's PPL, got {share!r}")
    base = (spec.get("base", {}).get("paper") or {}).get("ppl")
    if not isinstance(base, (int, float)):
        return []
    rows = []
    for row, entry in spec.items():
        ppl = (entry.get("paper") or {}).get("ppl")
        if row != "base" and isinstance(ppl, (int, float)) and abs(ppl - base) >= share * base:
            rows.append(row)
    return rows
