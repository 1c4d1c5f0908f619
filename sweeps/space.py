"""A sweep's search space, read from YAML (sweeps/example.yaml): sampled `params` and `fixed` key=value
overrides, every key one of `ablate train`'s (checked like a key=value override)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from foundation.errors import UserError
from ablations.resolve import check_override_types, parse_overrides
from ablations.spec import load_yaml

TYPES = ("categorical", "int", "float")
PARAM_FIELDS = {"categorical": {"type", "choices"},
                "int": {"type", "low", "high", "step", "log", "grid"},
                "float": {"type", "low", "high", "step", "log", "grid"}}


def format_value(value: Any) -> str:
    """A value as `ablate train` parses it back (YAML scalars; floats always with a dot)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:  # PyYAML reads '1e-05' as text, '1.0e-05' as a float
            text = f"{mantissa}.0e{exponent}"
        return text
    return str(value)


def override(key: str, value: Any) -> str:
    return f"{key}={format_value(value)}"


@dataclass(frozen=True)
class Param:
    """One sampled key: its Optuna distribution in YAML form."""

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    grid_values: tuple[Any, ...] = ()

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)


@dataclass(frozen=True)
class SearchSpace:
    """The parsed space: `sample(trial)` and `grid()` give key=value overrides / grid values."""

    path: str
    params: tuple[Param, ...]
    fixed: dict[str, Any] = field(default_factory=dict)

    def fixed_overrides(self) -> list[str]:
        return [override(k, v) for k, v in self.fixed.items()]

    def sample(self, trial: optuna.Trial) -> list[str]:
        """Sampled values as key=value overrides (fixed ones not included)."""
        return [override(p.key, p.suggest(trial)) for p in self.params]

    def grid(self) -> dict[str, list[Any]]:
        """The search space of Optuna's GridSampler; a float range needs an explicit `grid:`."""
        grid: dict[str, list[Any]] = {}
        for p in self.params:
            if p.grid_values:
                grid[p.key] = list(p.grid_values)
            elif p.type == "categorical":
                grid[p.key] = list(p.choices)
            elif p.type == "int":
                grid[p.key] = list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
            else:
                raise UserError(f"{self.path}: params.{p.key}: a float range needs a 'grid:' list "
                                f"of values for --sampler grid")
        return grid


def _number(where: str, spec: dict[str, Any], name: str, required: bool = True) -> float | None:
    value = spec.get(name)
    if value is None:
        if required:
            raise UserError(f"{where}: missing '{name}'")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: '{name}' must be a number, got {value!r}")
    return value


def _check_key(where: str, key: str) -> None:
    try:
        parse_overrides([f"{key}=0"])
    except UserError as err:
        raise UserError(f"{where}: {err}") from None


def _check_values(where: str, key: str, values: list[Any]) -> None:
    """Every value a trial can get must be of the key's type (else every trial fails)."""
    check_override_types([override(key, value) for value in values], where)


def parse_param(path: str, key: str, spec: Any) -> Param:
    """One `params` entry, validated; errors name the file and the key."""
    param = _parse_param(f"{path}: params.{key}", key, spec)
    _check_values(f"{path}: params.{key}", key, list(param.choices) or _range_values(param))
    return param


def _range_values(p: Param) -> list[Any]:
    """A range's ends, in the type the trials sample (an int range gives ints), and its grid."""
    cast = int if p.type == "int" else float
    return [cast(p.low), cast(p.high), *p.grid_values]


def _parse_param(where: str, key: str, spec: Any) -> Param:
    _check_key(where, key)
    if not isinstance(spec, dict):
        raise UserError(f"{where}: expected a mapping like {{type: float, low: 0.0, high: 1.0}}")
    kind = spec.get("type")
    if kind not in TYPES:
        raise UserError(f"{where}: unknown type {kind!r}; use one of {', '.join(TYPES)}")
    unknown = set(spec) - PARAM_FIELDS[kind]
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))} for type {kind}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: 'choices' must be a non-empty list")
        if any(isinstance(c, (list, dict)) for c in choices):
            raise UserError(f"{where}: choices must be scalars (numbers, text, true/false, null)")
        return Param(key, kind, choices=tuple(choices))
    low, high = _number(where, spec, "low"), _number(where, spec, "high")
    step, log = _number(where, spec, "step", required=False), spec.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{where}: 'log' must be true or false")
    if low >= high:
        raise UserError(f"{where}: empty range: low ({low}) must be below high ({high})")
    if kind == "int" and any(v is not None and v != int(v) for v in (low, high, step)):
        raise UserError(f"{where}: an int range needs integer low, high and step")
    if log and low <= 0:
        raise UserError(f"{where}: a log range needs low > 0, got {low}")
    if step is not None and (step <= 0 or log):
        raise UserError(f"{where}: 'step' must be > 0 and cannot be combined with log")
    grid = spec.get("grid")
    if grid is not None and (not isinstance(grid, list) or not grid or
                             any(not isinstance(v, (int, float)) or not low <= v <= high for v in grid)):
        raise UserError(f"{where}: 'grid' must be a non-empty list of numbers within [{low}, {high}]")
    return Param(key, kind, low=low, high=high, step=step, log=log, grid_values=tuple(grid or ()))


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space file (one-line UserError naming file and key)."""
    data = load_yaml(path, "search space")
    unknown = set(data) - {"params", "fixed"}
    if unknown:
        raise UserError(f"{path}: unknown section(s) {', '.join(sorted(map(str, unknown)))}; use params and fixed")
    params, fixed = data.get("params") or {}, data.get("fixed") or {}
    if not isinstance(params, dict) or not params:
        raise UserError(f"{path}: 'params' must be a non-empty mapping of keys to distributions")
    if not isinstance(fixed, dict):
        raise UserError(f"{path}: 'fixed' must be a mapping of keys to values")
    for key, value in fixed.items():
        _check_values(f"{path}: fixed.{key}", str(key), [value])
    clash = set(map(str, params)) & set(map(str, fixed))
    if clash:
        raise UserError(f"{path}: {', '.join(sorted(clash))} is both sampled and fixed")
    return SearchSpace(str(path), tuple(parse_param(str(path), str(k), v) for k, v in params.items()),
                       {str(k): v for k, v in fixed.items()})
