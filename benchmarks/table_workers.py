"""Benchmark (opt-in: `--only table_workers`): an 8-worker table against its plan.

The path that serves eight GPUs (`ablate table3 --gpus 0,...,7`: one queue, the longest-first
order of `tables/schedule.py`, one worker per device) is walked here on this CPU with eight
workers: the `demo` preset's ten rows at a few steps each, as `tests/test_runbook.py` runs the
runbook's launch (`TINY`). Two figures side by side from one invocation: the wall-clock the dry
run predicts for that command (`--dry-run`, the same arguments), and the wall-clock the command
took, with every row counted (each must finish exactly once). Eight workers share the cores, so
the plan counts each run at eight times its device time (`tables.cost.Workers`).

It needs the whole machine: anything else running measures the other job.

    python -m benchmarks --only table_workers --out benchmarks/results/table-workers-cpu-DATE
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from benchmarks.common import Section, Settings, stopwatch

WORKERS = 8
STEPS = 4
ARGS = ["table3", "--preset", "demo", "--workers", str(WORKERS), "--max-steps", str(STEPS), "--no-wandb",
        "data.valid_size=20", "eval.beam_size=1", "eval.max_len_offset=5", f"train.val_check_interval={STEPS}"]
UNIT_S = {"minutes": 60.0, "hours": 3600.0}


def ablate(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "ablate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"ablate {' '.join(args[:3])}... failed:\n{done.stderr[-2000:]}")
    return done


def planned_seconds(printout: str) -> tuple[float, float, float]:
    """(wall-clock, device time in all, longest run) in seconds, from a dry run's printout."""
    unit = re.search(r"runs: about ([\d.]+) device-(minutes|hours)", printout)
    wall = re.search(r"about ([\d.]+) (minutes|hours) wall-clock", printout)
    longest = re.search(r"the longest run, [^,]+, ([\d.]+)\)", printout)
    if not (unit and wall and longest):
        raise RuntimeError(f"the dry run's printout has no plan:\n{printout[-1500:]}")
    per = UNIT_S[unit.group(2)]
    return float(wall.group(1)) * per, float(unit.group(1)) * per, float(longest.group(1)) * per


def run(settings: Settings) -> Section:
    section = Section("table_workers", f"An {WORKERS}-worker table on this CPU against its plan: "
                      f"`ablate {' '.join(ARGS)}`",
                      ["workers", "runs", "each once", "planned wall s", "measured wall s", "measured / planned",
                       "device s planned", "longest run s planned"],
                      formats={"measured / planned": "{:.2f}"})
    with stopwatch(section), tempfile.TemporaryDirectory(prefix="ablate-table-workers-") as tmp:
        work = Path(tmp)
        plan = ablate([*ARGS, "--dry-run"], work)
        wall_planned, device, longest = planned_seconds(plan.stdout)
        start = time.perf_counter()
        ablate([*ARGS, "--no-report"], work)
        wall = time.perf_counter() - start
        study = optuna.load_study(study_name="table3-demo", storage=f"sqlite:///{work}/runs/sweeps.db")
        rows = [t.user_attrs.get("row") for t in study.get_trials()]
        complete = [t.user_attrs.get("row") for t in study.get_trials()
                    if t.state == optuna.trial.TrialState.COMPLETE]
    once = len(complete) == len(set(complete)) == len(rows)
    section.rows = [{"workers": WORKERS, "runs": len(complete), "each once": "yes" if once else "no",
                     "planned wall s": round(wall_planned), "measured wall s": round(wall),
                     "measured / planned": wall / wall_planned, "device s planned": round(device),
                     "longest run s planned": round(longest)}]
    section.data = {"args": ARGS, "rows": sorted(complete), "trials": len(rows), "plan": plan.stdout}
    section.target("every row finished exactly once", float(once), "yes", once)
    section.notes.append("planned: the dry run's wall-clock for the same command (the demo preset's measured rate "
                         "and per-run overhead, each run at 8x its device time, longest first); measured: the "
                         "command's own wall-clock, report left out, start-up of every run included")
    section.notes.append(f"the runs are {STEPS} steps long, so per-run start-up and the dev decode dominate: "
                         "the preset's per-run overhead (measured on 500-step runs) is what the plan stands on")
    return section
