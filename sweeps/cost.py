"""What a table will cost before it runs (`ablate table3 --dry-run`); nothing is written.

Training FLOPs of a run ≈ 6 · parameters · target tokens (the convention behind the MFU figures
in benchmarks/), target tokens = steps × the token budget per step (an upper bound: batches fill
their budget to ~95%). Time = FLOPs ÷ the rate the preset's device sustained on the base row,
plus a fixed per-run overhead (start-up, dev decoding), both measured and stated in the preset's
`table3.cost`. Rows narrower than base run below base's FLOP rate, so they take somewhat longer
than estimated; the estimate says which device it holds for.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pandas as pd

from ablations.resolve import resolve
from ablations.spec import table3_section
from lightning_modules.config import RunConfig, count_parameters, parse_devices
from lightning_modules.errors import UserError
from sweeps.table3 import Table3Plan


@dataclass(frozen=True)
class DeviceRate:
    """How fast the preset's device trained the base row (from `table3.cost` in the preset)."""

    device: str
    base_tokens_per_s: float  # target tokens per second on the base row, whole device
    overhead_s: float  # per run: start-up and dev decoding
    measured: str  # the command and date behind the figures

    @classmethod
    def of_preset(cls, preset: str) -> DeviceRate:
        cost = table3_section(preset).get("cost")
        if not cost:
            raise UserError(f"preset {preset!r} states no table3.cost (device and measured "
                            f"base-row throughput), so --dry-run cannot estimate its time")
        return cls(str(cost["device"]), float(cost["base_tokens_per_s"]), float(cost["overhead_s"]),
                   str(cost["measured"]))


@dataclass(frozen=True)
class TimeUnit:
    """How device time is printed: hours, or minutes for a table of under an hour (the demo's)."""

    name: str  # in sentences: "device-hours"
    short: str  # in column heads: "hours/run"
    per_hour: float

    @classmethod
    def of(cls, table: pd.DataFrame) -> TimeUnit:
        """The unit of an estimate (`estimate`'s table), by its total device-hours."""
        return cls("minutes", "min", 60.0) if table["hours"].sum() < 1.0 else cls("hours", "hours", 1.0)


def parameters(cfg: RunConfig) -> int:
    """The row's parameter count with the BPE vocabulary the tokenizer will have."""
    return count_parameters(cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id))


def tokens_per_step(cfg: RunConfig) -> int:
    """The token budget of one optimizer step; `auto` devices count as one (their number is unknown here)."""
    devices = parse_devices(cfg.train.devices)
    devices = len(devices) if isinstance(devices, list) else devices if isinstance(devices, int) else 1
    return cfg.data.max_tokens * cfg.train.accumulate_grad_batches * devices * cfg.train.num_nodes


def training_flops(cfg: RunConfig, params: int) -> float:
    return 6.0 * params * cfg.train.max_steps * tokens_per_step(cfg)


def estimate(plan: Table3Plan) -> tuple[pd.DataFrame, DeviceRate]:
    """One line per row: parameters, steps, tokens, FLOPs and device-hours for all its seeds."""
    rate = DeviceRate.of_preset(plan.preset)
    configs = {row: resolve(plan.preset, row, plan.config, plan.overrides, plan.spec_path)
               for row in plan.rows}
    base = configs.get("base") or resolve(plan.preset, "base", plan.config, plan.overrides, plan.spec_path)
    flops_per_s = 6.0 * parameters(base) * rate.base_tokens_per_s
    lines = []
    for row, cfg in configs.items():
        params = parameters(cfg)
        flops = training_flops(cfg, params)
        seconds = flops / flops_per_s + rate.overhead_s
        lines.append({"row": row, "params": params, "steps": cfg.train.max_steps,
                      "tokens/step": tokens_per_step(cfg), "PFLOP": flops / 1e15,
                      "hours/run": seconds / 3600, "seeds": len(plan.seeds_of(row)),
                      "hours": seconds * len(plan.seeds_of(row)) / 3600})
    return pd.DataFrame(lines).set_index("row"), rate


def run_seconds(plan: Table3Plan, workers: int, devices: list[str] | None) -> dict[str, float]:
    """Each row's expected run time on one worker, for a part of a table (`--stop-after`,
    `sweeps.worker.Part`): the estimate, which is of the whole device, times the workers sharing a
    CPU (one GPU per worker has the whole device); empty, with a note, when the preset states no
    cost (then every queued run starts)."""
    try:
        table, _ = estimate(plan)
    except UserError as err:
        print(f"table3 {plan.study}: {err}; --stop-after stops whatever still runs at its end",
              file=sys.stderr, flush=True)
        return {}
    share = workers if devices is None else 1
    return {row: float(hours) * 3600 * share for row, hours in table["hours/run"].items()}


def describe(plan: Table3Plan) -> str:
    """The dry-run's printout: the table, the total and what the estimate assumes."""
    table, rate = estimate(plan)
    unit = TimeUnit.of(table)
    shown = table.assign(**{col: table[col] * unit.per_hour for col in ("hours/run", "hours")}) \
        .rename(columns={"hours/run": f"{unit.short}/run", "hours": unit.short})
    text = shown.to_string(formatters={"params": "{:,}".format, "steps": "{:,}".format,
                                       "tokens/step": "{:,}".format, "PFLOP": "{:.3g}".format,
                                       f"{unit.short}/run": "{:.2f}".format, unit.short: "{:.2f}".format})
    return (f"{text}\n\n{len(table)} rows x {plan.describe_seeds()}, {int(table['seeds'].sum())} runs: "
            f"about {shown[unit.short].sum():.1f} device-{unit.name} on "
            f"{rate.device} (base row at {rate.base_tokens_per_s:,.0f} target tokens/s, "
            f"{rate.overhead_s:.0f} s per run for start-up and decoding; measured: {rate.measured}). "
            f"FLOPs = 6 x parameters x target tokens; narrower rows run below base's rate.")
