"""What a table will cost before it runs (`ablate table3 --dry-run`); nothing is written, and no GPU
need be present: a cluster's table is planned from a laptop.

Training FLOPs of a run ≈ 6 · parameters · target tokens (the convention behind the MFU figures
in benchmarks/), target tokens = steps × the token budget per step (an upper bound: batches fill
their budget to ~95%). Time = FLOPs ÷ the FLOP rate the preset's device sustained on the base row
(× the devices a run trains on), plus a fixed per-run overhead (start-up, dev decoding), both
stated in the preset's `table3.cost`: measured there, or derived from another preset's
measurement (`derived_from: gpu`: that preset's base-row FLOP rate, taken to hold for this
preset's models too; the printout says which). Rows narrower than base run below base's FLOP rate,
so they take somewhat longer than estimated.

The wall-clock on N workers replays the launcher's own order (`tables.schedule`: longest first).
Disk and memory are the run's own preflight estimates (`lightning_modules.run.preflight`).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from ablations.resolve import Recipe
from ablations.record import setting_label, tuned_name, value_text
from ablations.spec import recipe_changes, table3_section
from lightning_modules.config import CORPORA, RunConfig
from foundation.errors import UserError
from lightning_modules.run.preflight import GB, checkpoint_bytes, estimate_memory_gb
from lightning_modules.config import run_devices
from tables.schedule import parameters, tokens_per_step, training_flops, wall_clock
from sweeps.study import HALVING
from tables.plan import Table3Plan, start_order


# The GPUs a plan can be made for (`--plan-for NAME`), by the name their CUDA device name contains,
# and each one's memory in GB (for the plan's question which rows fit): those this project has
# measured on (benchmarks/results). A rate is known for a GPU a preset's `table3.cost` names
# (`gpu:`); another known GPU is planned at that rate, and the plan says it extrapolates.
GPUS = {"H100": 80, "H200": 141}


def known_gpu(name: str | None) -> str | None:
    """The known GPU `name` is (H100 for 'h100' or 'NVIDIA H100 80GB HBM3'), or None."""
    words = set(re.findall(r"[A-Za-z0-9]+", (name or "").upper()))
    return next((gpu for gpu in GPUS if gpu in words), None)


@dataclass(frozen=True)
class DeviceRate:
    """How fast the preset's device trains the base row (from `table3.cost` in the preset)."""

    device: str
    base_tokens_per_s: float  # target tokens per second on this preset's base row, whole device
    overhead_s: float  # per run: start-up and dev decoding
    measured: str  # the command and date behind the figures
    derived: str = ""  # how this preset's rate follows from another's measurement ('' = measured here)
    corpus: str = ""  # what the measured run trained on
    caveat: str = ""  # what the measurement is known to miss
    memory_gb: float | None = None  # the planned device's memory (a known GPU's), for the rows that fit

    @classmethod
    def of_preset(cls, preset: str, base_params: int, device: str | None = None) -> DeviceRate:
        """The preset's rate on `device` (a known GPU's name, `GPUS`: anything else is refused; None:
        this machine's GPU, else the first device the preset names) for a base row of `base_params`
        parameters: its own measurement there, or (`derived_from: NAME`) NAME's measured FLOP rate on
        NAME's base row carried over. `table3.cost` is one measurement or `rates:`, a list of them
        (one per device); a known GPU none of them measured is planned at the first one's rate, and
        the rate says so."""
        cost = table3_section(preset).get("cost")
        if not cost:
            raise UserError(f"preset {preset!r} states no table3.cost (device and measured "
                            f"base-row throughput), so --dry-run cannot estimate its time")
        if device is not None and device.strip().upper().removeprefix("NVIDIA ").strip() not in GPUS:
            raise UserError(f"--plan-for {device!r} is not a GPU this project knows; plan for one of "
                            f"{', '.join(GPUS)} (a rate measured on one of them, or extrapolated from one, "
                            f"and its memory): another GPU's speed and memory are unknown here")
        source = cost.get("derived_from")
        if source is None:
            entries = cost.get("rates") or [cost]
            wanted = known_gpu(device) or known_gpu(_gpu_here())
            entry = next((e for e in entries if wanted and e.get("gpu") == wanted), None)
            if entry is None and device is not None and not any(e.get("gpu") for e in entries):
                raise UserError(f"preset {preset!r} is planned at a CPU's rate ({entries[0]['device']}); "
                                f"--plan-for names a GPU")
            note = "" if entry is not None or not device else (
                f"no rate of this preset is measured on {device}: extrapolated, at the rate measured on "
                f"{entries[0]['device']}")
            entry = entry or entries[0]
            target = wanted if device is not None or entry.get("gpu") == wanted else entry.get("gpu")
            return cls(str(entry["device"]), float(entry["base_tokens_per_s"]), float(entry["overhead_s"]),
                       str(entry["measured"]), derived=note, corpus=str(entry.get("corpus", "")),
                       caveat=str(entry.get("caveat", "")), memory_gb=GPUS.get(target or ""))
        if source == preset or table3_section(str(source)).get("cost", {}).get("derived_from"):
            raise UserError(f"preset {preset!r}: table3.cost.derived_from must name a preset with a "
                            f"measured rate, got {source!r}")
        their_params = parameters(Recipe(str(source)).resolve())
        theirs = cls.of_preset(str(source), their_params, device)
        flops_per_s = 6.0 * their_params * theirs.base_tokens_per_s
        extrapolated = f" ({theirs.derived})" if theirs.derived else ""
        return replace(theirs, base_tokens_per_s=flops_per_s / (6.0 * base_params),
                       derived=f"derived from the {source} preset's measured rate ({theirs.base_tokens_per_s:,.0f} "
                               f"target tokens/s on its base row, {flops_per_s / 1e12:.3g} TFLOP/s{extrapolated}) "
                               f"taken to hold for this preset's models, and its per-run overhead")


def _gpu_here() -> str | None:
    """This machine's first CUDA GPU's name, if it has one (a dry run on the machine it plans for)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


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


def row_configs(plan: Table3Plan) -> dict[str, RunConfig]:
    """Each planned row's configuration (its seeds differ in nothing the estimate reads)."""
    return {row: plan.config_of(row) for row in plan.rows}


def estimate(plan: Table3Plan, configs: dict[str, RunConfig] | None = None,
             device: str | None = None) -> tuple[pd.DataFrame, DeviceRate]:
    """One line per row: parameters, steps, tokens, FLOPs and device-hours for all its seeds, and
    its peak training memory per device (`configs`: `row_configs`, when the caller has them;
    `device`: the device to plan for, `DeviceRate.of_preset`)."""
    configs = configs or row_configs(plan)
    base = plan.base
    rate = DeviceRate.of_preset(plan.preset, parameters(base), device)
    flops_per_s = 6.0 * parameters(base) * rate.base_tokens_per_s
    spec = plan.spec
    lines = []
    for row, cfg in configs.items():
        flops = training_flops(cfg)
        devices = parallel_devices(cfg)
        seconds = flops / (flops_per_s * devices) + rate.overhead_s  # the run's wall-clock
        n = len(plan.seeds_of(row))
        recipe = ", ".join(recipe_text(key, value, cfg) for key, value in recipe_changes(row, spec).items())
        lines.append({"row": row, "params": parameters(cfg), "steps": cfg.train.max_steps,
                      "tokens/step": tokens_per_step(cfg), "devices/run": devices, "PFLOP": flops / 1e15,
                      "hours/run": seconds / 3600, "seeds": n, "hours": seconds * n * devices / 3600,
                      "memory GB": sum(estimate_memory_gb(cfg)), "recipe": recipe})
    table = pd.DataFrame(lines).set_index("row")
    unused = [col for col, shown in (("recipe", table["recipe"].astype(bool).any()),
                                     ("devices/run", (table["devices/run"] > 1).any())) if not shown]
    return table.drop(columns=unused), rate


def recipe_text(key: str, written: Any, cfg: RunConfig) -> str:
    """A row's `train:`/`data:` setting as the spec writes it (at the paper's scale) and, where the
    preset scales it (`ablations.spec.row_settings`), the value the run trains with: 'lr_scale 2.0 -> 1.0'."""
    section, name = key.split(".", 1)
    trained = getattr(getattr(cfg, section), name)
    return f"{name} {written}" if trained == written else f"{name} {written} -> {trained}"


RECIPE_RULE = ("recipe: a row's train:/data: settings as its spec writes them, at the paper's scale; '->' the value "
               "this preset trains: a number the paper sets times the preset's own ratio to it (the preset's "
               "warmup / the paper's 4,000, ...), as for every row")


def parallel_devices(cfg: RunConfig) -> int:
    """The devices that train one run side by side (GPUs under DDP); CPU processes share one
    machine, whose whole rate the CPU presets measure, so they count as one."""
    return 1 if cfg.train.accelerator == "cpu" else run_devices(cfg.train)


def run_seconds(plan: Table3Plan, workers: int, devices: list[str] | None) -> dict[str, float]:
    """Each row's expected run time on one worker (a tuning candidate's, `ROW+KEYVALUE`, to its first
    rung), for a part of a table (`--stop-after`, `tables.policy.TablePolicy`): the estimate (of the
    whole device) times the workers sharing a CPU (a GPU per worker has the whole device); empty,
    with a note, when the preset states no cost (then every queued run starts)."""
    try:
        table, _ = estimate(plan)
    except UserError as err:
        print(f"table3 {plan.study}: {err}; --stop-after stops whatever still runs at its end",
              file=sys.stderr, flush=True)
        return {}
    share = workers if devices is None else 1
    seconds = {row: float(hours) * 3600 * share for row, hours in table["hours/run"].items()}
    for row in plan.rows if plan.tuning is not None else ():  # where the plan expects a candidate to end
        cfg = plan.config_of(row)
        seconds |= {tuned_name(row, setting): seconds[row] * plan.tuning.first_rung(cfg) / cfg.train.max_steps
                    for setting in plan.tuning.candidates(plan.own(row))[1:]}
    return seconds


def fits(table: pd.DataFrame, rate: DeviceRate) -> str:
    """Which rows' estimated training memory (`estimate`'s, per device) exceeds the planned GPU's."""
    if rate.memory_gb is None:
        return ""
    over = [str(row) for row, gb in table["memory GB"].items() if gb > rate.memory_gb]
    if not over:
        return f"; every row fits the planned GPU's {rate.memory_gb:g} GB"
    return (f"; above the planned GPU's {rate.memory_gb:g} GB: {', '.join(over)} (split each step into more "
            f"batches, train.accumulate_grad_batches=K, or more devices a run, --devices-per-run)")


def parts_note(seconds: dict[str, float], stop_after_s: float) -> str:
    """What `--stop-after` leaves out (`seconds`: `run_seconds`): a part starts only the runs it
    expects to finish (`tables.policy.TablePolicy`), so a row whose run takes longer than a part never
    starts; '' when every row fits."""
    from sweeps.launch import describe_duration

    long = {row: s for row, s in seconds.items() if s > stop_after_s}
    if not long:
        return ""
    runs = ", ".join(f"{row} (about {describe_duration(max(60, round(s / 60) * 60))} a run)" for row, s in sorted(long.items(), key=lambda x: -x[1]))
    unit = 600 if max(long.values()) > 3600 else 60
    need = describe_duration(math.ceil(max(long.values()) / unit) * unit)
    return (f"--stop-after {describe_duration(stop_after_s)}: a part starts only the runs it expects to finish, and "
            f"these take longer, so no part of this length starts them: {runs}; they need --stop-after {need} "
            f"or longer (by this estimate)")


@dataclass(frozen=True)
class Workers:
    """Where a table's runs go: `count` workers, each run on a worker taking `share` times its
    whole-device time (K CPU workers share one machine's cores; one GPU per worker has it whole)."""

    count: int
    share: int
    what: str  # '8 workers (GPUs 0,1,...,7 of each of 2 machines)'

    @classmethod
    def of(cls, workers: int | None, gpu_groups: list[str] | None, machines: int = 1) -> Workers:
        if gpu_groups:
            count = len(gpu_groups) * machines
            gpus = ", ".join(gpu_groups) if len(gpu_groups) <= 4 else f"{gpu_groups[0]}, ..., {gpu_groups[-1]}"
            where = f"GPUs {gpus}" if all("," not in g for g in gpu_groups) else f"GPU groups {' | '.join(gpu_groups)}"
            machine = f" of each of {machines} machines" if machines > 1 else ""
            return cls(count, 1, f"{count} worker{'s' * (count != 1)} ({where}{machine}, one worker each)")
        k = workers or 1
        if k == 1:
            return cls(machines, 1, f"{machines} worker{'s' * (machines != 1)}" + (" (one a machine)" if machines > 1 else ""))
        where = f"{k} on each of {machines} machines' CPUs" if machines > 1 else f"{k} on this machine's CPU"
        return cls(k * machines, k, f"{k * machines} workers ({where}, sharing its cores: each run takes "
                                    f"{k}x its device time)")


def schedule(plan: Table3Plan, table: pd.DataFrame, rows: dict[str, RunConfig],
             workers: Workers) -> tuple[float, float, str]:
    """(wall-clock seconds, longest run's seconds, its name) of the whole table on `workers`, in
    the order the launcher queues it (`tables.plan.start_order`; `rows`: each row's configuration,
    whose seeds cost the same)."""
    configs = {(row, seed): rows[row] for row, seed in plan.runs()}
    seconds = {run: float(table.loc[run[0], "hours/run"]) * 3600 * workers.share for run in configs}
    order = start_order(configs)
    longest = max(order, key=lambda run: seconds[run])
    return wall_clock([seconds[run] for run in order], workers.count), seconds[longest], \
        f"{longest[0]} seed {longest[1]}"


def describe(plan: Table3Plan, workers: Workers | None = None, device: str | None = None) -> str:
    """The dry-run's printout: the table, the total, what the estimate assumes and which figures are
    measured, the wall-clock on `workers` (default: one) of `device` (`DeviceRate.of_preset`),
    disk and memory."""
    workers = workers or Workers.of(1, None)
    rows = row_configs(plan)
    table, rate = estimate(plan, rows, device)
    unit = TimeUnit.of(table)
    shown = table.assign(**{col: table[col] * unit.per_hour for col in ("hours/run", "hours")}) \
        .rename(columns={"hours/run": f"{unit.short}/run", "hours": unit.short})
    text = shown.to_string(formatters={"params": "{:,}".format, "steps": "{:,}".format,
                                       "tokens/step": "{:,}".format, "PFLOP": "{:.3g}".format,
                                       f"{unit.short}/run": "{:.2f}".format, unit.short: "{:.2f}".format,
                                       "memory GB": "{:.1f}".format})
    source = (f"measured: {rate.measured}" if not rate.derived
              else f"{rate.derived}; measured: {rate.measured}")
    total = shown[unit.short].sum()
    run_total = (shown[f"{unit.short}/run"] * shown["seeds"]).sum()  # device time over the devices a run takes
    wall, longest, which = schedule(plan, table, rows, workers)
    per = unit.per_hour / 3600
    base = plan.base
    checkpoints = sum(checkpoint_bytes(rows[row]) for row, _ in plan.runs()) / GB
    corpus = CORPORA[base.data.corpus].disk_gb
    data = (f"about {corpus:g} GB for the {base.data.corpus} corpus in data.cache_dir on each machine"
            if corpus is not None else f"the {base.data.corpus} corpus's own files")
    peak = table["memory GB"].idxmax()
    trained_on = f" The rate's run trained on {rate.corpus}." if rate.corpus else ""
    caveat = f" Known to miss: {rate.caveat}." if rate.caveat else ""
    return (f"{text}\n\n{len(table)} rows x {plan.describe_seeds()}, {int(table['seeds'].sum())} runs: "
            f"about {total:.1f} device-{unit.name} on "
            f"{rate.device} (base row at {rate.base_tokens_per_s:,.0f} target tokens/s, "
            f"{rate.overhead_s:.0f} s per run for start-up and decoding; {source}). "
            f"FLOPs = 6 x parameters x target tokens; narrower rows run below base's rate.{trained_on}{caveat}\n"
            f"On {workers.what}, longest first as the launcher queues them: about {wall * per:.1f} "
            f"{unit.name} wall-clock (the runs' time / {workers.count} = {run_total * workers.share / workers.count:.1f}; "
            f"the longest run, {which}, {longest * per:.1f}).\n"
            f"Disk: {data}; checkpoints up to {checkpoints:.1f} GB if every run's are kept "
            f"(3 x weights and Adam states a run). Memory: up to {table['memory GB'].max():.1f} GB per "
            f"device for training ({peak}; a float32 estimate, lower in bf16){fits(table, rate)}."
            + (f"\n{RECIPE_RULE}." if "recipe" in table else ""))


def describe_tuning(plan: Table3Plan, device: str | None = None) -> str:
    """The dry run's tuning plan (`--tune`, `tables.tune`), beside the untuned table's: each row's
    value now, its candidates and their first rung, what a candidate costs trained through and
    stopped there (its training up to the rung, and the whole per-run overhead); then the tuned
    table (every candidate, then the row's other seeds at the chosen value) as planned and at most,
    and both tables together, which the report compares."""
    assert plan.tuning is not None
    rows = row_configs(plan)
    table, rate = estimate(plan, rows, device)
    unit = TimeUnit.of(table)
    overhead = rate.overhead_s / 3600
    lines = []
    for row, cfg in rows.items():
        settings, full, rung = plan.tuning.candidates(plan.own(row)), float(table.loc[row, "hours/run"]), \
            plan.tuning.first_rung(cfg)
        lines.append({"row": row, "own": setting_label(settings[0]),
                      "candidates": " | ".join(", ".join(map(value_text, s.values())) for s in settings),
                      "first rung": f"{rung:,} of {cfg.train.max_steps:,}", "seeds": len(plan.seeds_of(row)),
                      "full": full, "stopped": (full - overhead) * min(1.0, rung / cfg.train.max_steps) + overhead,
                      "others": len(settings) - 1, "devices": parallel_devices(cfg)})
    t = pd.DataFrame(lines).set_index("row")
    shown = t.drop(columns=["others", "devices"]).rename(columns={"full": f"{unit.short}/run",
                                                                  "stopped": f"{unit.short} stopped"})
    t[["full", "stopped"]] = t[["full", "stopped"]].mul(t["devices"], axis=0)  # device time, as the table's total
    untuned = (t["seeds"] * t["full"]).sum()
    planned = (t["full"] + t["others"] * t["stopped"] + (t["seeds"] - 1) * t["full"]).sum()
    most = ((t["others"] + t["seeds"]) * t["full"]).sum()
    least_both, most_both = untuned + (t["others"] * t["stopped"]).sum(), untuned + most - t["full"].sum()
    shown[[f"{unit.short}/run", f"{unit.short} stopped"]] *= unit.per_hour
    text = shown.rename_axis(None).to_string(formatters={f"{unit.short}/run": "{:.2f}".format, f"{unit.short} stopped": "{:.2f}".format})
    per, first, name = unit.per_hour, plan.seeds[0], unit.name
    return (f"Tuning {', '.join(plan.tuning.values)} on seed {first}: each row tries its own value and the listed "
            f"ones ('candidates'); Optuna's successive halving (reduction factor {HALVING}) compares each with the "
            f"row's others at its first rung and at 3, 9, ... times that step, and stops it unless it is among the "
            f"best third there (the row's own run, the untuned table's, is never stopped). The complete candidate "
            f"of lowest final dev PPL is chosen: its run is the tuned table's seed {first}, and the row's other seeds "
            f"train at its value. '{unit.short} stopped': a candidate stopped at its first rung (its training so far "
            f"and the whole per-run overhead).\n{text}\n\n"
            f"Untuned table: {int(t['seeds'].sum())} runs, about {untuned * per:.1f} device-{name}. Tuned table: "
            f"{int((t['others'] + 1).sum())} candidates ({len(t)} of them the untuned table's runs on seed {first}) "
            f"and up to {int((t['seeds'] - 1).sum())} runs of other seeds: about {planned * per:.1f} device-{name} "
            f"as planned (one candidate a row trains through, the others stop at their first rung), "
            f"{planned / untuned:.2f} x the untuned table's; at most {most * per:.1f} (nothing pruned), "
            f"{most / untuned:.2f} x. Both tables, which the report compares, take from {least_both * per:.1f} "
            f"(every row keeps its own value) to {most_both * per:.1f} device-{name} (nothing pruned and every row "
            f"changes its value): {least_both / untuned:.2f} to {most_both / untuned:.2f} x the untuned table's.")
