"""`python -m benchmarks`: run the benchmark suite, write results.json and results.md.

    python -m benchmarks                       # everything, CPU, ~15 minutes on 2 cores
    python -m benchmarks --quick               # tiny sizes: a smoke check in about a minute
    python -m benchmarks --only train,padding  # a subset
    python -m benchmarks --device cuda         # on a GPU (bf16 autocast by default there, MFU)
    python -m benchmarks --precision fp32,bf16 --only train,end_to_end,generation  # side by side, one process
    python -m benchmarks --device cuda --only gpu_round --out DIR  # kernel variants, < 8 minutes (opt-in)
    python -m benchmarks --device cuda --only startup  # where start-up goes, a table's first and next run (opt-in)
    python -m benchmarks --device cuda --only attention_shapes  # what a new batch shape costs each attention kernel (opt-in)
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import sys
import time
import warnings
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_CACHE, REPO, Section, Settings, machine_info, render_section
from foundation.io import atomic_write_json, atomic_write_text

# name -> module of benchmarks/ whose run(settings) it is; imported when run, so that a GPU machine
# without the sweep packages (optuna, omegaconf) runs the benchmarks that do not need them
BENCHMARKS = {"train": "train_step", "overhead": "overhead", "padding": "padding", "generation": "generation",
              "scaling": "scaling", "end_to_end": "end_to_end", "gpu_round": "gpu_round", "startup": "startup",
              "attention_shapes": "attention_shapes"}
# Run only when named in --only: the GPU round (its CPU run is a smoke check), two whole runs'
# start-up, and what new shapes cost each attention kernel (a GPU's question).
OPT_IN = ("gpu_round", "startup", "attention_shapes")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(n for n in BENCHMARKS if n not in OPT_IN),
                        help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all but "
                             f"{', '.join(OPT_IN)})")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke checks")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results",
                        help="output directory for results.json and results.md")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="auto",
                        help="auto, fp32 or bf16 (autocast), or a comma list such as fp32,bf16: train, end_to_end "
                             "and generation measure each side by side in one process, the other benchmarks the "
                             "first (auto: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed repetitions per measurement (default: each benchmark's own)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                        help="where the benchmark BPE models are trained once and reused")
    parser.add_argument("--multi30k-dir", type=Path, default=REPO.parent / "shared" / "data" / "multi30k",
                        help="Multi30k raw files for the padding benchmark (skipped if absent)")
    parser.add_argument("--newstest-dir", type=Path, default=REPO.parent / "shared" / "data" / "newstest",
                        help="newstest2013/2014 .en/.de files for end_to_end's WMT-length cases")
    parser.add_argument("--cases", default="",
                        help="comma-separated end_to_end or gpu_round cases (default: all for the device)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="an `ablate train` checkpoint to decode with instead of training "
                             "the generation model (sinusoidal, d_k = d_model/h)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="gpu_round: seconds for its variants (default 390 on CUDA, so the command "
                             "ends within 8 minutes); what does not fit is a row saying so")
    parser.add_argument("--steps", default="",
                        help="gpu_round: ';'-separated CASE:VARIANT pairs to measure, in this order, instead "
                             "of its plan (variant names contain commas), e.g. "
                             "'wmt-base-37k:eager;wmt-big-37k:compiled'; with --cases, only the pairs of "
                             "those cases. end_to_end: CASE:RUN pairs (RUN eager, compiled or 'compiled, warm "
                             "cache'): only those `ablate train` runs, and the bare step at the case's first "
                             "batch size with their compile settings")
    parser.add_argument("--profile", action="store_true",
                        help="gpu_round: after timing each variant, profile one pass per batch size (where the "
                             "step's time goes: a second table, and each pass's top kernels under OUT/profiles/)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.only.split(",") if name and name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    args.steps = tuple(tuple(s.strip().split(":", 1)) for s in args.steps.split(";") if s.strip())
    if args.steps:  # gpu_round's (case, variant) pairs, or end_to_end's (case, run)
        stepped = [name for name in ("gpu_round", "end_to_end") if name in args.only.split(",")]
        if len(stepped) != 1:
            parser.error("--steps: name one of gpu_round and end_to_end in --only, whose steps they are")
        if stepped == ["gpu_round"]:
            from benchmarks.gpu_round import CASES, VARIANTS  # only when asked: it needs the model code
            cases, names, where = list(CASES), list(VARIANTS), "a variant named in benchmarks/gpu_round.py VARIANTS"
        else:
            from benchmarks.end_to_end import CASE_NAMES, RUNS
            cases, names, where = CASE_NAMES, list(RUNS), f"a run of {', '.join(RUNS)}"
        wrong = [":".join(s) for s in args.steps if len(s) != 2 or s[0] not in cases or s[1] not in names]
        if wrong:
            parser.error(f"--steps {'; '.join(wrong)}: expected CASE:VARIANT with a case of "
                         f"{', '.join(cases)} and {where}")
    auto = "bf16" if args.device.startswith("cuda") else "fp32"
    args.precision = tuple(dict.fromkeys(auto if p == "auto" else p for p in args.precision.split(",")))
    if not set(args.precision) <= {"fp32", "bf16"}:
        parser.error(f"--precision {','.join(args.precision)}: expected auto, fp32 or bf16, or a comma list of them")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: file not found")
    try:  # last: a command refused above leaves no folder behind
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {args.out}: cannot make this folder ({error.strerror or error})")
    return args


def render(info: dict, sections: list[Section]) -> str:
    lines = ["# Benchmarks", "",
             f"{info['date']} · {info['cpu']} ({info['cpu_count']} CPUs, {info['torch_threads']} "
             f"torch threads) · device {info['device']}" + (f" ({info['gpu']})" if info["gpu"] else "")
             + f" · {info['precision']} · torch {info['torch']} · transformers "
             f"{info['transformers'] or 'not installed'} · commit {info['git_commit'] or '?'}"
             + (" · **--quick (tiny sizes, not the real measurement)**" if info["quick"] else ""),
             ""]
    targets = [t for s in sections for t in s.targets]
    if targets:
        met = sum(bool(t["met"]) for t in targets)
        lines += [f"Targets met: {met} of {len(targets)}.", ""]
    return "\n".join(lines + [render_section(s) + "\n" for s in sections])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    settings = Settings(device=device, precision=args.precision[0], precisions=args.precision, reps=args.reps,
                        quick=args.quick, cache_dir=args.cache_dir, multi30k_dir=args.multi30k_dir,
                        checkpoint=args.checkpoint, seed=args.seed, newstest_dir=args.newstest_dir,
                        cases=tuple(c for c in args.cases.split(",") if c), out=args.out,
                        budget_s=args.budget_s, steps=args.steps, profile=args.profile)
    warnings.filterwarnings("ignore", category=UserWarning)
    info = machine_info(settings)
    out: Path = args.out  # made by parse_args
    sections: list[Section] = []
    start = time.perf_counter()
    for name in [n for n in BENCHMARKS if n in args.only.split(",")]:
        print(f"[{name}] running ...", flush=True)
        section = importlib.import_module(f"benchmarks.{BENCHMARKS[name]}").run(settings)
        sections.append(section)
        if device.type != "cuda" and "MFU" in section.columns:
            section.columns.remove("MFU")  # only defined against a GPU's peak
        print(f"[{name}] done in {section.seconds:.1f} s", flush=True)
        # Written after every benchmark, so an interrupted run keeps what it finished.
        atomic_write_json(out / "results.json", {
            "machine": info, "total_seconds": round(time.perf_counter() - start, 1),
            "targets": [t for s in sections for t in s.targets],
            "benchmarks": {s.name: s.to_json() for s in sections}})
        atomic_write_text(out / "results.md", render(info, sections))
    markdown = render(info, sections)
    print(markdown)
    print(f"Wrote {out / 'results.json'} and {out / 'results.md'} "
          f"in {time.perf_counter() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    # A crash below Python (a segfault or abort in a CUDA graph capture or a kernel) prints its Python
    # stack instead of ending the command without a word (a GPU round's CUDA-graph variant has).
    faulthandler.enable()
    sys.exit(main())
