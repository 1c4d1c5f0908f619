"""A Weights & Biases sweep from the same search space: the sweep YAML, whose agent runs
`python -m sweeps.wandb_entry` with the sampled values, and launching an agent."""

from __future__ import annotations

from typing import Any

import yaml

from foundation.errors import UserError
from foundation.io import atomic_write_text, check_writable_file, disk_full_ends_the_run
from sweeps.space import Param, SearchSpace

METHODS = {"tpe": "bayes", "random": "random", "grid": "grid"}
METRICS = {"ppl": {"name": "val/ppl", "goal": "minimize"}, "bleu": {"name": "bleu", "goal": "maximize"}}


def wandb_parameter(p: Param, grid: bool) -> dict[str, Any]:
    """One parameter in W&B's sweep syntax."""
    if p.type == "categorical":
        return {"values": list(p.choices)}
    if grid or p.step is not None and p.type == "int":
        values = p.grid_values or tuple(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
        return {"values": list(values)}
    if p.type == "int":
        return {"distribution": "int_uniform", "min": int(p.low), "max": int(p.high)}
    if p.log:
        return {"distribution": "log_uniform_values", "min": float(p.low), "max": float(p.high)}
    if p.step is not None:
        return {"distribution": "q_uniform", "min": float(p.low), "max": float(p.high), "q": float(p.step)}
    return {"distribution": "uniform", "min": float(p.low), "max": float(p.high)}


def sweep_config(space: SearchSpace, run_args: list[str], name: str, sampler: str = "tpe",
                 objective: str = "ppl") -> dict[str, Any]:
    """The sweep definition; `run_args` are fixed `ablate train` arguments for every run."""
    grid = sampler == "grid"
    if grid:
        space.grid()  # a float range without 'grid:' values is an error here too
    return {
        "name": name,
        "method": METHODS[sampler],
        "metric": dict(METRICS[objective]),
        "parameters": {p.key: wandb_parameter(p, grid) for p in space.params},
        "command": ["${env}", "${interpreter}", "-m", "sweeps.wandb_entry", *run_args,
                    *space.fixed_overrides(), "${args_no_hyphens}"],
    }


def agent_args(config: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """The argument list an agent runs for sampled `values` (`${args_no_hyphens}` = key=value)."""
    from sweeps.space import format_value

    args: list[str] = []
    for item in config["command"][3:]:
        if item == "${args_no_hyphens}":
            args += [f"{k}={format_value(v)}" for k, v in values.items()]
        else:
            args.append(item)
    return args[1:]  # without the module name


def write_config(config: dict[str, Any], path: str) -> None:
    check_writable_file(path, "the W&B sweep YAML")
    with disk_full_ends_the_run(path):
        atomic_write_text(path, yaml.safe_dump(config, sort_keys=False))


def launch(config: dict[str, Any], project: str, count: int | None) -> None:
    """Register the sweep with W&B and run an agent here (needs an API key)."""
    from lightning_modules.run.preflight import wandb_mode

    if wandb_mode("auto") != "online":
        raise UserError("--launch needs a W&B API key (run `wandb login` or set WANDB_API_KEY)")
    import wandb

    sweep_id = wandb.sweep(config, project=project)
    wandb.agent(sweep_id, project=project, count=count)
