"""Benchmark 8 (opt-in: `--only workers`): how to split a CPU among sweep workers.

`ablate table3 --workers K` (and `ablate sweep`) on a CPU gives each of its K workers
`cores // K` threads (`sweeps.launch.worker_envs`). More workers run more trials at once but each
on fewer threads; which layout finishes a table sooner depends on how well one training step
uses several threads at the preset's sizes, and on how K processes share memory bandwidth and
caches. Nothing but a measurement settles it, so this benchmark runs every layout the cores
divide into, side by side in one invocation:

- one layout = K concurrent `ablate train --preset cpu --row base` processes (seeds 1..K) with
  exactly the environment the sweep launcher gives its workers, each for `steps` steps;
- layouts alternate (A B, B A, ...) for `reps` repetitions; per layout the median of the summed
  steady-state target tokens/s (after the first log window: no start-up, no decoding), and the
  wall time of the slowest process (start-up and a greedy dev decode included);
- all runs share one BPE model, so only the arithmetic differs.

It needs the whole machine: anything else running measures the other job, not the layout.

    python -m benchmarks --only workers --out benchmarks/results/workers-cpu-DATE
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, Section, Settings, median, share_bpe, spread, stopwatch
from sweeps.launch import worker_envs

PRESET, ROW = "cpu", "base"


def layouts(cores: int) -> list[int]:
    """Worker counts to compare: 1, 2, 4, ... and the core count, each dividing the cores."""
    return sorted({k for k in (1, 2, 4, 8, 16, 32, 64, cores) if k <= cores and cores % k == 0})


def train_args(out: Path, seed: int, steps: int, quick: bool) -> list[str]:
    preset = ["--preset", "demo", "model.d_model=32", "model.d_ff=64", "data.valid_size=100"] if quick \
        else ["--preset", PRESET]
    return [sys.executable, "-m", "ablate", "train", *preset, "--row", ROW, "--out", str(out),
            "--max-steps", str(steps), "--seed", str(seed), "--no-wandb",
            f"train.log_every_n_steps={5 if quick else 20}",
            "train.val_check_interval=100000", "train.checkpoint_every=100000", "train.progress_bar=false",
            "eval.beam_size=1", "eval.decode_test=false"]


def run_layout(workers: int, work: Path, steps: int, quick: bool, bpe: Path | None) -> dict[str, Any]:
    """K concurrent runs under the launcher's environments: their speeds and the layout's wall time."""
    outs, procs = [], []
    start = time.perf_counter()
    for seed, env in enumerate(worker_envs(workers, None), start=1):
        out = Path(tempfile.mkdtemp(prefix=f"k{workers}-s{seed}-", dir=work))
        if bpe is not None:
            share_bpe(bpe, out)
        outs.append(out)
        procs.append(subprocess.Popen(train_args(out, seed, steps, quick), cwd=REPO, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - start
    for p, err in zip(procs, errors):
        if p.returncode != 0:
            raise RuntimeError(f"{workers} worker(s): ablate train failed:\n{err[-2000:]}")
    results = [json.loads((out / "results.json").read_text()) for out in outs]
    return {"tokens_per_s": [r["steady_tokens_per_s"] for r in results],
            "threads": results[0]["environment"]["torch_threads"], "wall_s": wall, "bpe": outs[0] / "spm.model"}


def run(settings: Settings) -> Section:
    cores = os.cpu_count() or 1
    steps, reps = (30, 1) if settings.quick else (400, settings.reps_or(2))
    counts = layouts(cores)
    section = Section("workers", f"8. Sweep workers on {cores} cores: `ablate train --preset "
                      f"{'demo (tiny)' if settings.quick else PRESET} --row {ROW}`, {steps} steps per run",
                      ["layout", "workers", "threads each", "tokens/s per worker", "tokens/s together",
                       "vs best", "spread", "wall s"],
                      formats={"vs best": "{:.0%}", "spread": "{:.0%}"})
    measured: dict[int, list[dict[str, Any]]] = {k: [] for k in counts}
    with stopwatch(section), tempfile.TemporaryDirectory(prefix="ablate-workers-") as tmp:
        work, bpe = Path(tmp), None
        for rep in range(reps):
            for k in counts if rep % 2 == 0 else counts[::-1]:
                result = run_layout(k, work, steps, settings.quick, bpe)
                bpe = bpe or result["bpe"]  # the first run's BPE model, shared by all later runs
                measured[k].append({key: v for key, v in result.items() if key != "bpe"})
                print(f"  {k} worker(s): {sum(result['tokens_per_s']):,.0f} tokens/s together", flush=True)
    rows = []
    for k, results in measured.items():
        together = [sum(r["tokens_per_s"]) for r in results]
        rows.append({"layout": f"{k} × {results[0]['threads']} thread(s)", "workers": k,
                     "threads each": results[0]["threads"],
                     "tokens/s per worker": median([t for r in results for t in r["tokens_per_s"]]),
                     "tokens/s together": median(together), "spread": spread(together),
                     "wall s": median([r["wall_s"] for r in results])})
    best = max(row["tokens/s together"] for row in rows)
    for row in rows:
        row["vs best"] = row["tokens/s together"] / best
    section.rows = rows
    section.data = {"runs": {str(k): rs for k, rs in measured.items()}, "steps": steps, "reps": reps}
    section.notes.append("tokens/s: steady-state target tokens/s from each run's results.json (after the first "
                         "log window), summed over the layout's concurrent workers; median over repetitions")
    section.notes.append("wall s: the slowest worker of the layout, start-up (BPE shared) and a greedy dev "
                         "decode included; a table's time is its tokens over 'tokens/s together'")
    section.notes.append("threads each: what `sweeps.launch.worker_envs` gives a worker (cores // workers, capped "
                         "by an OMP_NUM_THREADS already set: unset it to measure the split); "
                         "nothing else may run during the measurement")
    return section
