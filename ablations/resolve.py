"""Resolve a run's configuration from presets, Table 3 rows, a YAML file and key=value overrides.

Order, later wins: `RunConfig` defaults < preset (`ablations/presets/NAME.yaml`) < the row of the
ablation spec (`ablations/table3.yaml`), scaled by the preset's rule < `--config FILE` <
`key=value` overrides. The scale rule itself is the preset's unless the file or an override sets
`scale.*` (then that scale applies to the row). OmegaConf checks every key and type against the
dataclasses; `row` and `preset` are chosen by their options, not by overrides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablations.spec import RECIPE_SECTIONS, load_preset, load_spec, load_yaml, recipe_ratios, row_settings
from lightning_modules.config import TOKENIZER_KEYS, RunConfig, ScaleConfig, requested_config
from foundation.errors import UserError, did_you_mean
from foundation.schema import read
from foundation.yaml_input import parse_yaml

# Keys that the tokenizer decides; a flat `vocab_size=` means the BPE vocabulary (data.vocab_size).
TOKENIZER_PATHS = {f"model.{key}" for key in TOKENIZER_KEYS}
# Labels of config.yaml that an option chooses (with what it brings: the row's model, the preset's
# scale); as a key=value override they would only relabel the run.
CHOSEN_BY_OPTION = {"row": "--row", "preset": "--preset"}


def _leaf_paths() -> dict[str, list[str]]:
    """Every settable key ('model.d_model', ...) by its last component ('d_model')."""
    paths: dict[str, list[str]] = {}
    for section in fields(RunConfig):
        sub = getattr(RunConfig(), section.name)
        if not hasattr(sub, "__dataclass_fields__"):  # row, preset: chosen by their options
            continue
        for name in (f.name for f in fields(sub)):
            full = f"{section.name}.{name}"
            if full not in TOKENIZER_PATHS:
                paths.setdefault(name, []).append(full)
    return paths


def _field_type(path: str) -> str:
    """The annotation of a dotted key ('train.wandb' -> 'str'), as written in config.py."""
    section, name = path.split(".", 1)
    owner = type(getattr(RunConfig(), section))
    return str(owner.__dataclass_fields__[name].type)


def _parse_value(path: str, raw: str) -> Any:
    """YAML scalars (`1e-3`, `true`, `null`, `[1, 2]`), but text fields keep their text (`off`)."""
    raw = raw.strip()
    if not raw or raw in ("null", "None", "~"):
        return None
    if "." in path and _field_type(path).startswith("str"):
        return raw
    try:
        return parse_yaml(raw, path)
    except UserError:
        return raw


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` strings (`d_model=256` or `model.d_model=256`) into a nested dict."""
    leaves = _leaf_paths()
    every_path = sorted(p for group in leaves.values() for p in group)
    nested: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise UserError(f"override {item!r} is not of the form key=value")
        if key in TOKENIZER_PATHS:
            raise UserError(f"{key} is set by the tokenizer; set data.vocab_size instead")
        if key in CHOSEN_BY_OPTION:
            raise UserError(f"{key} is not a config key to override (it would only relabel the run); "
                            f"choose the {key} with {CHOSEN_BY_OPTION[key]}")
        if "." not in key:
            matches = leaves.get(key, [])
            if len(matches) > 1:
                raise UserError(f"key {key!r} is ambiguous: write one of {', '.join(matches)}")
            key = matches[0] if matches else key
        if key not in every_path:
            raise UserError(f"unknown config key {key!r}{_suggest(key)}")
        value = _parse_value(key, raw)
        node = nested
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def check_override_types(items: list[str], source: str) -> None:
    """Parse key=value overrides and check each value, one by one, against its config field's type,
    naming `source` (a value's range is checked where a run's whole configuration is resolved)."""
    schema = OmegaConf.structured(RunConfig)
    for item in items:
        try:
            nested = parse_overrides([item])
        except UserError as err:
            raise UserError(f"{source}: {err}") from None
        _merge(schema, nested, source)


def _suggest(key: str) -> str:
    """' (did you mean ...?)' for the settable key closest to `key`, or ''."""
    every_path = sorted(p for group in _leaf_paths().values() for p in group)
    return did_you_mean(key, every_path) or did_you_mean(key.split(".")[-1], _leaf_paths())


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A `--config` file (a run's saved config.yaml too, of any version: `foundation.schema`):
    its keys as asked for."""
    return read("config", load_yaml(path, "config file"), f"config file {path}")


def _merge(base, update: dict[str, Any], source: str):
    try:
        return OmegaConf.merge(base, update)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or ""
        message = str(err).splitlines()[0]
        if "not in" in message and "Key" in message:
            raise UserError(f"{source}: unknown config key {key!r}{_suggest(key)}") from None
        raise UserError(f"{source}: {key + ': ' if key else ''}{message}") from None


@dataclass(frozen=True)
class Recipe:
    """What a run is made from: a scale preset, a row of an ablation spec (`spec`: its file; None:
    Table 3's), a `--config` file and `key=value` overrides, later winning (see the module's
    docstring). The one type a command, a table's plan, a sweep worker and a W&B sweep's run pass
    on; `Resolver` makes configurations of it."""

    preset: str = "tiny"
    row: str = "base"
    config: str | None = None
    spec: str | None = None
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(str(item) for item in self.overrides))

    def plus(self, *overrides: str, row: str | None = None) -> Recipe:
        """This recipe with more overrides (they win), for `row` where given."""
        return replace(self, row=row or self.row, overrides=(*self.overrides, *overrides))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recipe:
        return cls(**{**data, "overrides": tuple(data.get("overrides") or ())})

    def resolve(self) -> RunConfig:
        """The complete, validated configuration of this recipe's run."""
        return Resolver(self).resolve(self.row)


class Resolver:
    """The configurations of one recipe's rows: its preset, spec and --config file are read and
    its overrides parsed once, however many rows (and seeds: `extra` overrides) it resolves."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.spec = load_spec(recipe.spec)
        preset = {k: v for k, v in load_preset(recipe.preset).items() if k != "table3"}  # its rows, not settings
        self.preset = _merge(_merge(_defaults(), {"preset": recipe.preset}, "arguments"), preset,
                             f"preset {recipe.preset}")
        self.later = [(str(recipe.config), load_config_file(recipe.config))] if recipe.config else []
        self.later += [("override", parse_overrides(list(recipe.overrides)))] if recipe.overrides else []
        self.paper: dict[str, Any] | None = None

    def resolve(self, row: str | None = None, extra: Sequence[str] = ()) -> RunConfig:
        """The configuration of `row` (default: the recipe's), `extra` overrides after the recipe's."""
        row = row or self.recipe.row
        later = self.later + ([("override", parse_overrides(list(extra)))] if extra else [])
        # The defaults as asked for (head sizes not set: they follow the final d_model and h), the preset
        cfg = _merge(self.preset, {"row": row}, "arguments")
        for source, values in later:  # a scale given there scales the row too (it would do nothing after it)
            cfg = _merge(cfg, {"scale": values.get("scale") or {}}, source)
        scale = ScaleConfig(**OmegaConf.to_container(cfg.scale))
        ratios = recipe_ratios(_recipe(cfg), self.paper_recipe())
        cfg = _merge(cfg, row_settings(row, self.spec, scale, ratios), f"row {row}")
        for source, values in later:
            cfg = _merge(cfg, values, source)
        try:
            return OmegaConf.to_object(cfg)
        except OmegaConfBaseException as err:
            raise UserError(str(err).splitlines()[0]) from None
        except UserError as err:  # the model the row makes cannot be built (n_kv_heads: 3 of 8 heads): name it
            spec = f", spec {self.recipe.spec}" if self.recipe.spec else ""
            raise UserError(f"row {row!r} (preset {self.recipe.preset}{spec}): {err}") from None

    def setting(self, key: str) -> Any:
        """A setting no row may change (`ablations.spec.ROW_REFUSED`, e.g. train.seed) as the preset,
        the --config file and the overrides give it: no row resolved."""
        cfg = self.preset
        for source, values in self.later:
            cfg = _merge(cfg, values, source)
        return OmegaConf.select(cfg, key)

    def paper_recipe(self) -> dict[str, Any]:
        """The paper's training and data settings (the `paper` preset): what a row's numbers are
        read against (`ablations.spec.recipe_ratios`)."""
        if self.paper is None:
            paper = {k: v for k, v in load_preset("paper").items() if k != "table3"}
            self.paper = _recipe(_merge(_defaults(), paper, "preset paper"))
        return self.paper


def _defaults():
    """The configuration's defaults as asked for (`requested_config`), as OmegaConf checks types."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), requested_config(RunConfig()))


def _recipe(cfg) -> dict[str, Any]:
    """The training and data sections of a configuration, as plain values."""
    return {section: OmegaConf.to_container(cfg[section]) for section in RECIPE_SECTIONS}


def resolve(preset: str = "tiny", row: str = "base", config_file: str | Path | None = None,
            overrides: list[str] | None = None, spec_path: str | Path | None = None) -> RunConfig:
    """The complete, validated configuration of one run (`Recipe.resolve`)."""
    return Recipe(preset, row, str(config_file) if config_file else None, str(spec_path) if spec_path else None,
                  tuple(overrides or ())).resolve()
