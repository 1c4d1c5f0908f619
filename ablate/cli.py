"""`ablate`: the command line. Thin: it parses arguments and calls the library (nearly all of it
is the option declarations of its commands; each handler is a few library calls).

    ablate train [--preset tiny] [--row base] [--config FILE] [--devices auto|N|0,1] [key=value ...]
    ablate params [--vocab-size 37000] [--json]
    ablate sweep optuna --study NAME --space FILE [--n-trials N] [--workers K | --gpus 0,1] ...
    ablate sweep wandb --space FILE [--out sweep.yaml] [--launch] ...
    ablate table3 [--preset tiny] [--rows base,A,D3] [--seeds 1,2] [--workers K | --gpus 0,1] [--dry-run] ...
    ablate report [--storage URL] [--study NAME] --out DIR [--wandb-report auto|online|offline|off]
    ablate dashboard [--storage URL] [--host 127.0.0.1] [--port 8080]
    ablate storage-proxy --storage RDB-URL [--host 127.0.0.1] [--port 13000]
    ablate translate RUN [--input FILE] [--checkpoint last|best|average:K] [--beam 4] ...
    ablate evaluate RUN [--split valid|test | --src F --ref F] [--checkpoint ...] ...
    ablate attention RUN --sentence "..." | --line N [--layer L] [--head H] [--out DIR]

One word, one meaning: `--devices` is what one run trains on (Lightning's devices: auto, a count,
GPU ids), `--gpus` the GPU ids a launcher (`table3`, `sweep optuna`) spreads its workers over, one
each, `--devices-per-run` how many of them each run takes, and `--device` the one device a trained
run is used on (`translate`, `evaluate`, `attention`). `--wandb` is the training runs' W&B mode,
`--wandb-report` the report's.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from pathlib import Path

from lightning_modules.config import CORPORA
from foundation.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UserError, did_you_mean, exit_status
from lightning_modules.run.slurm import keep_notices
from foundation.stop import hangup_as_sigterm
from sweeps import PRUNERS, SAMPLERS

if TYPE_CHECKING:  # the annotations only: `ablate --help` imports no configuration stack
    from ablations.resolve import Recipe
    from lightning_modules.config import RunConfig
    from sweeps.space import SearchSpace

def default_storage() -> str:
    """$ABLATE_STORAGE (it keeps a database password off the command line, and out of `ps`), else
    a SQLite file under runs/; read when the command line is parsed."""
    return os.environ.get("ABLATE_STORAGE", "sqlite:///runs/sweeps.db")
STORAGE_HELP = ("Optuna storage (default $ABLATE_STORAGE, else sqlite:///runs/sweeps.db): an RDB URL "
                "(postgresql+psycopg2://user:pass@host/db for several machines), a journal file on a "
                "shared file system (journal:///runs/sweeps.journal, or a path ending .journal), or "
                "grpc://HOST:PORT (an ablate storage-proxy)")


class _HelpWithDefaults(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it says it already or has none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = bool(action.option_strings) and action.default not in (None, False, argparse.SUPPRESS)
        if shown and "default" not in text and not isinstance(action, argparse._HelpAction):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line: `ablate: error: ...`, and every default in --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpWithDefaults)
        # No prefixes: `--devices 8` on a launcher would otherwise be `--devices-per-run 8`.
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:
        self.has_commands = True
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        """An option this command does not have is one line naming its closest real option, before
        anything else is said about the command line (each subcommand checks its own); left-over
        key=value overrides come back to `parse_args`."""
        if not getattr(self, "has_commands", False):
            known = set(self.option_strings())
            for item in list(args if args is not None else sys.argv[1:]):
                if item == "--":
                    break
                flag = item.split("=", 1)[0]
                if flag.startswith("--") and flag not in known:
                    self.error(f"unknown option {flag}{did_you_mean(flag, sorted(known))}")
        return super().parse_known_args(args, namespace)

    def option_strings(self) -> list[str]:
        """This command's options, as its --help lists them."""
        return sorted(set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", self.format_help())))

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"ablate: error: {message} (see {self.prog} --help)\n")


DURATION_UNITS = {"h": 3600, "m": 60, "s": 1}
LIST_ROWS = "\0list"  # `--row` given without a name


def duration(text: str) -> float:
    """An argparse type: `2h30m`, `90m`, `1.5h`, `5400s` or `5400` (seconds), more than zero."""
    compact = text.strip().lower().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms]?)", compact)
    if not compact or "".join(number + unit for number, unit in parts) != compact \
            or len(parts) > 1 and not all(unit for _, unit in parts):
        raise argparse.ArgumentTypeError(f"must be a duration like 2h30m, 90m or 5400s, got {text!r}")
    seconds = sum(float(number) * DURATION_UNITS[unit or "s"] for number, unit in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero, got {text!r}")
    return seconds


MAX_COUNT = 10 ** 12  # no count an option takes is larger (`lightning_modules.config.MAX_NUMBER`)
MAX_WORKERS = 1024  # worker processes a launcher starts on one machine (each holds torch: ~0.5 GB)


def at_least(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: a whole number in [`minimum`, `maximum`], else a one-line error naming the
    option. Only ASCII digits: `str.isdigit` takes a superscript two for a digit."""

    def whole_number(text: str) -> int:
        digits = text.strip().removeprefix("-")
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum:,} to {maximum:,}, got {text[:40]!r}")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got {value:,}")
        return value

    return whole_number


def finite_at_least(minimum: float) -> Callable[[str], float]:
    """An argparse type: a finite number >= `minimum` (not nan, not inf), else one line."""

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not minimum <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum:g}, got {text!r}")
        return value

    return number


def storage_url(text: str) -> str:
    """An argparse type: a storage URL (`sweeps.storage.check_url`), checked before anything opens
    it; $ABLATE_STORAGE, the default, is checked the same way."""
    from sweeps.storage import check_url

    try:
        return check_url(text)
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err) + (" ($ABLATE_STORAGE)" if text == os.environ.get("ABLATE_STORAGE") else "")) from None


def study_name(text: str) -> str:
    """An argparse type: a study name, which names its runs' folder (`foundation.names`)."""
    from foundation.names import name_problem

    problem = name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text[:80]!r} {problem}")
    return text


def _command(sub: argparse._SubParsersAction, name: str, summary: str, details: str) -> argparse.ArgumentParser:
    """A subcommand: `summary` is its line in the parent's --help, `details` follow it in its own."""
    return sub.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. {details}")


def _add_run_options(p: argparse.ArgumentParser, table: bool = False, workers: bool = False) -> None:
    """Options shared by every command that trains: preset, row, corpus, overrides (`workers`: the
    command launches workers, one per GPU id of --gpus)."""
    from ablations.spec import preset_names

    p.add_argument("--preset", default="tiny",
                   help=f"scale preset: {', '.join(preset_names())} (ablations/presets/NAME.yaml; default: tiny)")
    if not table:
        p.add_argument("--row", default="base", nargs="?", const=LIST_ROWS,
                       help="a row of the spec (Table 3's: base, A1..A4, B1, B2, C1..C7, D1..D4, E, big); "
                            "--row without a name lists the rows of --spec and exits")
    p.add_argument("--spec", help="ablation spec YAML with the rows (default: ablations/table3.yaml)")
    p.add_argument("--config", help="YAML file with config overrides ({model: {...}, train: {...}})")
    p.add_argument("--data", choices=CORPORA, help="corpus (default: the preset's)")
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            p.add_argument(f"--{split}-{side}", metavar="FILE",
                           help=f"{split} {side} text file for --data files (plain or .gz)")
    p.add_argument("--data-dir", help="local directory with the corpus files (multi30k, wmt14)")
    p.add_argument("--base-url", help="mirror URL to download the corpus from (multi30k, wmt14)")
    p.add_argument("--max-steps", type=at_least(1, 10 ** 9),
                   help="base's training steps; every row keeps its ratio to base's (the paper's big trains 3x as "
                        "long)" if table else "training steps (shortcut for train.max_steps)")
    if not table:
        p.add_argument("--seed", type=at_least(0, 2 ** 32 - 1), help="random seed (shortcut for train.seed)")
    if workers:
        p.add_argument("--gpus", metavar="IDS",
                       help="GPU ids to spread the workers over, one worker per id (or per --devices-per-run "
                            "ids), e.g. 0,1,2,3,4,5,6,7 (default: --workers K on this machine's CPU)")
        p.add_argument("--devices-per-run", type=at_least(1, 1024), default=1, metavar="D",
                       help="devices each run trains on with Lightning DDP (GPUs from --gpus, else CPU processes)")
        p.add_argument("--stop-after", type=duration, metavar="DURATION",
                       help="stop the workers this long after they start, e.g. 2h30m, 90m, 5400s: each "
                            "running trial saves a checkpoint as on Ctrl-C; the same command resumes (a table "
                            "starts only the runs its estimate says can finish by then)")
    else:
        p.add_argument("--devices", help="devices the run trains on (Lightning's): auto, a count, or GPU ids "
                                         "like 0,1 (default: the preset's train.devices, auto)")
    p.add_argument("--accelerator", help="Lightning accelerator: auto, cpu, gpu (default: the preset's, auto)")
    p.add_argument("--precision", help="Lightning precision: auto, 32-true, bf16-mixed, 16-mixed "
                                       "(default: the preset's, auto: bf16-mixed on a GPU that has it; "
                                       "bf16-mixed on a CPU needs avx512_bf16 or AMX)")
    p.add_argument("--wandb", choices=["auto", "online", "offline", "off"],
                   help="the training runs' Weights & Biases: auto (online with an API key, else offline), "
                        "or off (default: the preset's train.wandb, auto)")
    p.add_argument("--no-wandb", action="store_true", help="disable Weights & Biases (same as --wandb off)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="override any config key, e.g. d_model=256 train.warmup_steps=800")


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The command-line shortcuts as key=value overrides (they win over positional ones)."""
    extra = list(args.overrides)
    shortcuts = {"data.corpus": args.data, "data.data_dir": args.data_dir, "data.base_url": args.base_url,
                 "train.max_steps": args.max_steps, "train.seed": getattr(args, "seed", None),
                 "train.devices": getattr(args, "devices", None), "train.accelerator": args.accelerator,
                 "train.precision": args.precision, "train.wandb": "off" if args.no_wandb else args.wandb,
                 **{f"data.{split}_{side}": getattr(args, f"{split}_{side}") for split in ("train", "valid", "test")
                    for side in ("src", "tgt")}}
    extra += [f"{key}={value}" for key, value in shortcuts.items() if value is not None]
    if any(getattr(args, f"{s}_src") for s in ("train", "valid", "test")) and args.data is None:
        extra.append("data.corpus=files")
    return extra


def list_rows(args: argparse.Namespace) -> bool:
    """`--row` without a name: print the spec's rows (each with its group) and say so."""
    if getattr(args, "row", None) != LIST_ROWS:
        return False
    from ablations.spec import default_spec_path, load_spec

    spec = load_spec(args.spec)
    print(f"rows of {args.spec or default_spec_path()}:")
    for name, entry in spec.items():
        print(f"  {name:<16} {entry.get('group', name)}")
    return True


def recipe_of(args: argparse.Namespace, overrides: list[str]) -> tuple[Recipe, RunConfig]:
    """What the command's runs are made from (its preset, row, --config and --spec, and
    `overrides`: the command's, then a sweep's fixed settings), and the configuration it makes:
    each command's runs are checked before anything starts."""
    from ablations.resolve import Recipe

    recipe = Recipe(args.preset, getattr(args, "row", "base"), args.config, args.spec, tuple(overrides))
    return recipe, recipe.resolve()


def sweep_recipe(args: argparse.Namespace, overrides: list[str]) -> tuple[Recipe, SearchSpace, RunConfig]:
    """A sweep's recipe (`overrides`: the command's), its search space, and the configuration its
    fixed settings make, checked before any trial samples the rest."""
    from sweeps.space import load_space

    space = load_space(args.space)
    recipe, fixed = recipe_of(args, [*overrides, *space.fixed_overrides()])
    return replace(recipe, overrides=tuple(overrides)), space, fixed


def cmd_train(args: argparse.Namespace) -> int:
    if list_rows(args):
        return 0
    _, cfg = recipe_of(args, run_overrides(args))
    from lightning_modules.run.train import summary_table, train  # heavy (Lightning): after validation

    out = args.out or f"runs/{cfg.row}-{cfg.preset}-s{cfg.train.seed}"
    results = train(cfg, out, wait=args.wait)
    if results:
        print("\n" + summary_table(results, out))
    return 0


def _sweep_run_args(args: argparse.Namespace, here: bool = True) -> tuple[list[str], list[str] | None]:
    """The launcher's fixed `ablate train` overrides, and each worker's GPUs (None on CPU; `here`:
    they must be visible on this machine)."""
    from sweeps.launch import device_groups

    extra, groups = device_groups(args.gpus, args.workers, args.devices_per_run, args.accelerator, here=here)
    return run_overrides(args) + extra, groups


def cmd_sweep_optuna(args: argparse.Namespace) -> int:
    if list_rows(args):
        return 0
    from foundation.io import check_writable_dir
    from lightning_modules.run.preflight import check_hardware, prepare_data
    from sweeps.storage import make_storage
    from sweeps.study import open_study

    overrides, devices = _sweep_run_args(args)
    recipe, space, fixed = sweep_recipe(args, overrides)
    check_hardware(fixed)
    pruner = "none" if args.no_prune else args.pruner
    if args.sampler == "grid":
        space.grid()
    from sweeps.launch import run_workers
    from sweeps.worker import WorkerSettings

    check_writable_dir(args.runs_dir, "the trials' run directories (--runs-dir)")
    prepare_data(fixed)  # the fixed settings' data; a sampled data key is checked by each trial
    open_study(args.study, make_storage(args.storage, None), args.objective)
    settings = WorkerSettings(study=args.study, storage=args.storage, space=str(args.space),
                              n_trials=args.n_trials, runs_dir=args.runs_dir, recipe=recipe,
                              sampler=args.sampler, objective=args.objective, pruner=pruner,
                              prune_startup_trials=args.prune_startup_trials,
                              prune_warmup_steps=args.prune_warmup_steps,
                              heartbeat_s=args.heartbeat)
    return run_workers(settings, args.workers or 1, devices, args.devices_per_run,
                       stop_after_s=args.stop_after)


def cmd_table3(args: argparse.Namespace) -> int:
    from tables.plan import base_steps_overrides, make_plan

    if args.machines != 1 and not args.dry_run:
        raise UserError("--machines plans for several machines (--dry-run); to run on them, start the same "
                        "command on each against one shared --storage (docs/gpus.md)")
    if args.plan_for is not None and not args.dry_run:
        raise UserError("--plan-for plans for a GPU (--dry-run); a table runs on the GPUs it finds (--gpus)")
    steps, args.max_steps = args.max_steps, None  # base's steps, each row keeping its ratio to them
    overrides, devices = _sweep_run_args(args, here=not args.dry_run)
    overrides += base_steps_overrides(steps, args.spec) if steps is not None else []
    plan = make_plan(args.preset, args.storage, args.runs_dir, overrides, rows=args.rows, seeds=args.seeds,
                     study=args.study, spec_path=args.spec, config=args.config, every_seed=args.every_seed,
                     redo=args.redo, tune_values=args.tune, tune_budget=args.tune_budget)
    if args.dry_run:
        from tables.cost import Workers, describe, describe_tuning, parts_note, run_seconds
        from tables.progress import standing

        print(describe(plan, Workers.of(args.workers, devices, args.machines), args.plan_for))
        if plan.tuning is not None:
            print(f"\n{describe_tuning(plan, args.plan_for)}")
        if args.stop_after is not None and (note := parts_note(run_seconds(plan, args.workers or 1, devices),
                                                               args.stop_after)):
            print(f"\n{note}")
        where = standing(plan, args.archive, args.workers or 1)
        if where:
            print(f"\n{where}")
        return 0
    from tables.make import make_table3

    outcome = make_table3(plan, args.workers or 1, devices, args.devices_per_run, args.heartbeat,
                          archive=args.archive, stop_after_s=args.stop_after, report=not args.no_report,
                          report_dir=args.report_dir, wandb_report=args.wandb_report)
    if outcome.report:
        print(f"report: {', '.join(str(p) for p in outcome.report)}", flush=True)
    return outcome.exit_status


def cmd_report(args: argparse.Namespace) -> int:
    from reports.build import build_report

    written = build_report(args.storage, args.study, args.out, wandb=args.wandb_report, bootstrap=args.bootstrap,
                           runs_dir=args.runs_dir)
    print(f"report: {', '.join(str(p) for p in written)}")
    return 0


def cmd_sweep_wandb(args: argparse.Namespace) -> int:
    from sweeps.wandb_sweep import launch, sweep_config, write_config

    overrides = run_overrides(args)
    _, space, _ = sweep_recipe(args, overrides)
    run_args = ["--out-root", str(Path(args.runs_dir) / "wandb"), "--preset", args.preset, "--row", args.row]
    for flag, value in (("--config", args.config), ("--spec", args.spec)):
        if value:
            run_args += [flag, str(Path(value).resolve())]
    config = sweep_config(space, run_args + overrides, args.name or Path(args.space).stem,
                          args.sampler, args.objective)
    write_config(config, args.out)
    print(f"wrote {args.out} (W&B sweep, method {config['method']}, {len(config['parameters'])} parameters)")
    if args.launch:
        launch(config, args.project, args.count)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from sweeps.dashboard import serve

    return serve(args.storage, args.host, args.port)


def cmd_storage_proxy(args: argparse.Namespace) -> int:
    from sweeps.proxy import serve

    return serve(args.storage, args.host, args.port, create=args.create)


def cmd_params(args: argparse.Namespace) -> int:
    from ablations.params import format_params, params_table

    table = params_table(args.vocab_size, args.spec)
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print(format_params(table, args.vocab_size))
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    from lightning_modules.run.use import checkpoint_choice, decoding, load_run, open_input, translate_stream

    checkpoint_choice(args.checkpoint)
    stream, interactive = open_input(args.input)
    run = load_run(args.run, args.checkpoint, args.device)
    cfg = decoding(run, args.beam, args.alpha, args.max_len_offset, args.batch_tokens, args.cuda_graphs)
    translate_stream(run, stream, sys.stdout, cfg, interactive)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lightning_modules.run.use import (checkpoint_choice, decoding, evaluate, evaluation_texts, load_run,
                                           read_run_config)

    checkpoint_choice(args.checkpoint)
    name, sources, references, label = evaluation_texts(
        read_run_config(Path(args.run)), args.split, args.src, args.ref, args.data, args.data_dir, args.base_url)
    run = load_run(args.run, args.checkpoint, args.device)
    cfg = decoding(run, args.beam, args.alpha, args.max_len_offset, args.batch_tokens, args.cuda_graphs)
    numbers, path = evaluate(run, name, sources, references, cfg, args.checkpoint, label)
    print(f"{label}: BLEU {numbers['bleu']} ({numbers['sacrebleu_signature']}), PPL {numbers['ppl']}, "
          f"{numbers['sentences']} sentences, {run.weights}\nwrote {path}")
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    import shutil

    from foundation.io import check_writable_dir, disk_full_ends_the_run, first_missing
    from lightning_modules.run.use import attention_dir, checkpoint_choice, load_run
    from reports.attention import dev_line, write_attention

    checkpoint_choice(args.checkpoint)
    out = args.out or attention_dir(Path(args.run), args.sentence, args.line, args.checkpoint)
    check_writable_dir(out, "the attention maps")
    run = load_run(args.run, args.checkpoint, args.device)
    sentence = args.sentence if args.sentence is not None else dev_line(run, args.line)
    created = first_missing(out)
    try:
        with disk_full_ends_the_run(out):
            written = write_attention(run, sentence, out, args.layer, args.head)
    except UserError:  # a full disk: no folder of maps left half written
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    for path in written:
        print(f"wrote {path}")
    return 0


def _add_use_options(p: argparse.ArgumentParser) -> None:
    """Options of the commands that load a run's model: which weights, where, how to decode."""
    p.add_argument("run", metavar="RUN", help="run directory (with config.yaml, spm.model, checkpoints/)")
    p.add_argument("--checkpoint", default="last", metavar="last|best|average:K",
                   help="the weights: the newest checkpoint (default), the one with the lowest logged dev "
                        "PPL, or the parameter mean of the K newest (train.keep_checkpoints=K keeps them)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the first GPU, else cpu)")
    p.add_argument("--beam", type=at_least(1, 1024), help="beam size (default: the run's eval.beam_size)")
    p.add_argument("--alpha", type=finite_at_least(0.0),
                   help="length penalty alpha (default: the run's eval.length_penalty)")
    p.add_argument("--max-len-offset", type=at_least(0),
                   help="output length limit = source length + this (default: the run's eval.max_len_offset)")
    p.add_argument("--batch-tokens", type=at_least(1),
                   help="source tokens per decoding batch (default: the run's eval.batch_tokens)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="decode through fixed-size caches, each batch's step replayed as one CUDA graph "
                        "(docs/gpu-performance.md; on a CPU the same search without a graph; default: the run's eval.cuda_graphs)")


def _version() -> str:
    """The installed distribution's version (the source tree's pyproject.toml when installed -e)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformer-ablations")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ablate", description="Transformer ablations (Vaswani et al. 2017, Table 3)")
    parser.add_argument("--version", action="version", version=f"ablate {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = _command(sub, "train", "train and evaluate one configuration",
                 "A Table 3 row at a preset's scale, changed by --config and key=value overrides, trains "
                 "in its own run directory, then its dev (and test) set is translated with beam search and "
                 "scored; the numbers go to results.json. The same command resumes an interrupted run.")
    _add_run_options(p)
    p.add_argument("--out", help="run directory (default: runs/ROW-PRESET-sSEED); a new or empty folder, "
                                 "or one of our run directories")
    p.add_argument("--wait", action="store_true",
                   help="when another command is training this run directory, wait for it instead of "
                        "stopping (then resume or reuse what it left)")
    p.set_defaults(func=cmd_train)

    p = _command(sub, "sweep", "hyperparameter sweeps (Optuna, Weights & Biases)",
                 "Both read one search-space YAML (see sweeps/example.yaml): `sweep optuna` runs a study "
                 "with parallel workers here, `sweep wandb` writes a W&B sweep (and can run an agent).")
    kinds = p.add_subparsers(dest="sweeper", required=True, parser_class=_Parser)
    o = _command(kinds, "optuna", "run an Optuna study with parallel workers",
                 "Each trial trains one sampled configuration of --space in its own process, reports dev "
                 "perplexity by step (for pruning) and stores its results on the trial. The study lives in "
                 "--storage: re-running the same command resumes it, and workers on other machines can "
                 "join it through PostgreSQL.")
    o.add_argument("--study", required=True, type=study_name, help="study name (re-running the same command resumes it)")
    o.add_argument("--storage", default=default_storage(), type=storage_url, help=STORAGE_HELP)
    o.add_argument("--n-trials", type=at_least(1, 10 ** 6), default=20, help="finished trials the study should reach (default 20)")
    o.add_argument("--workers", type=at_least(1, MAX_WORKERS), help="worker processes on this machine (default 1)")
    o.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="Optuna sampler")
    o.add_argument("--objective", choices=["ppl", "bleu"], default="ppl",
                   help="minimise dev perplexity or maximise dev BLEU (default ppl)")
    o.add_argument("--pruner", choices=PRUNERS, default="median",
                   help="prune on dev perplexity by step (objective ppl only; default median)")
    o.add_argument("--no-prune", action="store_true", help="same as --pruner none")
    o.add_argument("--prune-startup-trials", type=at_least(0), default=5, metavar="N",
                   help="trials that finish before any is pruned (default 5)")
    o.add_argument("--prune-warmup-steps", type=at_least(0), default=0, metavar="S",
                   help="training steps before a trial can be pruned (default 0)")
    o.add_argument("--heartbeat", type=at_least(1, 86400), default=60,
                   help="seconds between trial heartbeats; a trial silent for twice that is retried")
    w = _command(kinds, "wandb", "write (and optionally launch) a W&B sweep",
                 "The same search space as a W&B sweep YAML whose runs are `ablate train` with the sampled "
                 "key=value overrides; --launch registers it and runs an agent here.")
    for q in (o, w):
        q.add_argument("--space", required=True, help="search space YAML (see sweeps/example.yaml)")
        q.add_argument("--runs-dir", default="runs/sweeps", help="parent of the trial run directories")
        _add_run_options(q, workers=q is o)
    o.set_defaults(func=cmd_sweep_optuna)
    w.add_argument("--out", default="sweep.yaml", help="where to write the W&B sweep YAML")
    w.add_argument("--name", help="sweep name (default: the space file's name)")
    w.add_argument("--sampler", choices=SAMPLERS, default="tpe",
                   help="tpe -> bayes, random, grid")
    w.add_argument("--objective", choices=["ppl", "bleu"], default="ppl",
                   help="minimise dev perplexity or maximise dev BLEU")
    w.add_argument("--launch", action="store_true", help="register the sweep and run an agent here")
    w.add_argument("--project", default="transformer-ablations", help="W&B project for --launch")
    w.add_argument("--count", type=at_least(1), help="runs for this agent (--launch; default: until the sweep ends)")
    w.set_defaults(func=cmd_sweep_wandb)

    p = _command(sub, "table3", "run Table 3 (every row x seed not yet complete), then write its report",
                 "The preset is tiny unless --preset says otherwise (demo, cpu, gpu, paper: see --dry-run for "
                 "what each costs). Every (row, seed) becomes a queued trial of one Optuna study, trained by the sweep "
                 "workers (--workers K on the CPU, one per GPU id with --gpus) in "
                 "RUNS_DIR/STUDY/ROW-sSEED; re-running the same command trains only what is not complete.")
    p.add_argument("--rows", help="rows or groups, e.g. base,A,D3 (default: the preset's, else all)")
    p.add_argument("--seeds", help="seeds, e.g. 1,2,3 (default: the preset's table3.seeds, e.g. 1,2,3 for cpu and gpu; else train.seed)")
    p.add_argument("--every-seed", action="store_true",
                   help="run every row with every seed (by default the cpu and gpu presets run rows "
                        "whose paper dev PPL differs from base's by >= 10%% with the first seed only)")
    p.add_argument("--study", type=study_name, help="study name (default table3-PRESET; SPEC-PRESET for another --spec, e.g. "
                                                     "modifications-demo); re-running resumes it")
    p.add_argument("--redo", metavar="ROWS",
                   help="train these rows' finished runs again, e.g. base,C5 (runs trained before runs kept "
                        "dev translations, or under older code): each run once, the same command resumes; "
                        "the runs they replace stay in the study (trial N) and as ROW-sSEED.superseded-tN "
                        "beside the new ones (run directory and archive), and the report names them")
    p.add_argument("--tune", action="append", metavar="KEY=V1,V2,...",
                   help="also run every row, base included, at its own best value of a training setting, e.g. "
                        "train.lr_scale=0.25,0.5,1 (again for a grid with another key): each row tries its own value "
                        "and these on the first seed, pruned by Optuna's successive halving among the row's "
                        "candidates; the best trains the row's other seeds, and the report sets each row's verdict "
                        "at its own value beside the one at its best (docs/table3.md)")
    p.add_argument("--tune-budget", type=finite_at_least(0.0), metavar="SHARE",
                   help="with --tune: the share of a row's steps a candidate trains before it is first compared "
                        "(the halving's first rung, a dev evaluation), more than 0 and at most 1 (default: the "
                        "row's first dev evaluation)")
    p.add_argument("--storage", default=default_storage(), type=storage_url, help=STORAGE_HELP)
    p.add_argument("--workers", type=at_least(1, MAX_WORKERS), help="worker processes on this machine (default 1)")
    p.add_argument("--runs-dir", default="runs/table3", help="parent of the run directories (default runs/table3)")
    p.add_argument("--heartbeat", type=at_least(1, 86400), default=60,
                   help="seconds between trial heartbeats; a run silent for twice that is retried")
    p.add_argument("--archive", metavar="DIR",
                   help="keep what a fresh machine needs to go on in DIR (commit or sync it): each "
                        "finished run's results, curve and dev translations, each unfinished run's newest "
                        "checkpoint, and the study (study.journal.xz); restored from at the start, saved "
                        "every 10 minutes and at the end")
    p.add_argument("--report-dir", help="where the report goes (default RUNS_DIR/STUDY/report)")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--machines", type=at_least(1, 10_000), default=1, metavar="M",
                   help="with --dry-run: plan for M machines like this one (each running the same command "
                        "against one shared --storage), --gpus on each")
    p.add_argument("--plan-for", metavar="GPU",
                   help="with --dry-run: the GPU to plan for, by name (H100 or H200; another is refused): its "
                        "measured rate, or the printout says it extrapolates and from what, and which rows "
                        "exceed its memory (default: this machine's GPU, else the preset's first measured device)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each row's parameters, steps, FLOPs and estimated device time (minutes for a "
                        "table of under an hour) and, for a table that has run, what is finished and "
                        "the time left; run nothing")
    p.add_argument("--wandb-report", choices=["auto", "online", "offline", "off"], default="off",
                   help="also log the report's table and figures to W&B (default off)")
    _add_run_options(p, table=True, workers=True)
    p.set_defaults(func=cmd_table3)

    p = _command(sub, "report", "write the Table 3 report (md, csv, tex, html, figures) from a study",
                 "Reads the Optuna database only (never writes to it): every complete run of the study, "
                 "the paper's numbers beside ours, seed intervals, changes against base and verdicts.")
    p.add_argument("--storage", default=default_storage(), type=storage_url, help=STORAGE_HELP)
    p.add_argument("--study", help="the Table 3 study (default: the only one in the storage)")
    p.add_argument("--out", required=True, help="directory for table3.md/.csv/.tex, report.html and figures")
    p.add_argument("--runs-dir", default="runs/table3",
                   help="where the table's run directories are (default runs/table3): only the A group's "
                        "attention figure reads them; everything else comes from the database")
    p.add_argument("--bootstrap", type=at_least(0, 100_000), default=1000,
                   help="paired-bootstrap resamples for BLEU against base (default 1000; 0 = none)")
    p.add_argument("--wandb-report", choices=["auto", "online", "offline", "off"], default="off",
                   help="also log the report's table and figures to W&B")
    p.set_defaults(func=cmd_report)

    p = _command(sub, "dashboard", "serve optuna-dashboard for a sweep storage (until Ctrl-C)",
                 "The studies, trials, their learning curves and user attributes in a browser. It has no "
                 "authentication and can edit studies: it listens on this machine only unless --host says "
                 "otherwise.")
    p.add_argument("--storage", default=default_storage(), type=storage_url, help=STORAGE_HELP)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=at_least(1, 65535), default=8080, help="port to listen on (default 8080)")
    p.set_defaults(func=cmd_dashboard)

    p = _command(sub, "storage-proxy", "serve an RDB storage to workers as grpc://HOST:PORT "
                                       "(Optuna's gRPC storage proxy, until Ctrl-C)",
                 "Hundreds of workers then hold one proxy connection each instead of one database "
                 "connection each. It has no authentication: it listens on this machine only unless "
                 "--host says otherwise.")
    p.add_argument("--storage", default=default_storage(), type=storage_url,
                   help="the RDB it serves (default $ABLATE_STORAGE, else sqlite:///runs/sweeps.db)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; no authentication: trusted networks only)")
    p.add_argument("--port", type=at_least(1, 65535), default=13000, help="port to listen on (default 13000)")
    p.add_argument("--create", action="store_true",
                   help="create the database when it does not exist yet (by default it must exist and "
                        "hold Optuna's tables, as for ablate dashboard: a mistyped path is an error)")
    p.set_defaults(func=cmd_storage_proxy)

    p = _command(sub, "params", "parameter count of every Table 3 row",
                 "The closed-form count of each row's model at the paper's scale, beside the paper's "
                 "printed value (no model is built).")
    p.add_argument("--vocab-size", type=at_least(1), default=37000, help="shared vocabulary size (default 37000)")
    p.add_argument("--spec", help="ablation spec YAML (default: ablations/table3.yaml)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_params)

    p = _command(sub, "translate", "translate sentences with a trained run",
                 "Reads one sentence a line from stdin (or --input FILE) and writes its detokenized "
                 "translation to stdout, in order, as each batch is done; an empty line gives an empty "
                 "line, a line longer than the model's max_len is cut (with a warning naming it).")
    _add_use_options(p)
    p.add_argument("--input", metavar="FILE", help="read sentences from FILE instead of stdin")
    p.set_defaults(func=cmd_translate)

    p = _command(sub, "evaluate", "score a trained run on a split or on your files",
                 "Translates with beam search and scores with sacreBLEU (with its signature) and "
                 "per-wordpiece perplexity; prints the numbers and saves them, with the hypotheses, as "
                 "RUN/evaluate-NAME-SETTINGS.json (results.json is left as it is).")
    _add_use_options(p)
    p.add_argument("--split", choices=["valid", "test"], help="a split of the run's corpus (default valid)")
    p.add_argument("--data", choices=CORPORA, help="score that corpus's --split instead of the run's")
    p.add_argument("--data-dir", help="local directory with the corpus files (multi30k, wmt14)")
    p.add_argument("--base-url", help="mirror URL to download the corpus from (multi30k, wmt14)")
    p.add_argument("--src", metavar="FILE", help="your source sentences, one a line (plain or .gz)")
    p.add_argument("--ref", metavar="FILE", help="their reference translations, one a line")
    p.set_defaults(func=cmd_evaluate)

    p = _command(sub, "attention", "draw a run's attention maps for one sentence",
                 "Translates the sentence, then writes one PNG per kind of attention (encoder self, "
                 "decoder self, encoder-decoder) into --out: a grid of layers x heads with the "
                 "wordpieces on the axes. The weights are softmax(QK^T/sqrt(d_k) + mask) computed from "
                 "the model's own projections.")
    p.add_argument("run", metavar="RUN", help="run directory (with config.yaml, spm.model, checkpoints/)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sentence", help="the source sentence")
    which.add_argument("--line", type=at_least(1), help="line N (from 1) of the run's dev set")
    p.add_argument("--layer", type=at_least(1), help="only this layer (from 1)")
    p.add_argument("--head", type=at_least(1), help="only this head (from 1)")
    p.add_argument("--out", help="directory for the PNGs (default: a folder inside the run, "
                                 "RUN/attention-line-N-CHECKPOINT or RUN/attention-sentence-HASH-CHECKPOINT)")
    p.add_argument("--checkpoint", default="last", metavar="last|best|average:K",
                   help="the weights (as for translate; default last)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the first GPU, else cpu)")
    p.set_defaults(func=cmd_attention)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args, rest = parser.parse_known_args(argv)
    # key=value overrides may come before or after options: collect the ones argparse left over.
    if hasattr(args, "overrides"):
        args.overrides += [r for r in rest if "=" in r and not r.startswith("-")]
        rest = [r for r in rest if r not in args.overrides]
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


# A write that the world refuses (a full disk or device: `ablate params > /dev/full`), once the
# library's own writes have said so themselves (`foundation.errors.DiskFull`)
UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS)


def main(argv: Sequence[str] | None = None) -> int:
    keep_notices()  # under SLURM a pre-emption notice during start-up is kept, not fatal
    hangup_as_sigterm()  # a closed terminal stops a run as SIGTERM does, with its checkpoint
    try:
        args = parse_args(build_parser(), argv)
    except SystemExit as done:  # --help, --version, or a usage error (its one line is printed)
        return int(done.code or 0)
    handler: Callable[[argparse.Namespace], int] = args.func
    try:
        os.getcwd()
    except FileNotFoundError:  # torch's MKL then dies in one cryptic line, other paths in a traceback
        print("ablate: error: the working directory no longer exists (deleted after this shell entered it); "
              "cd to an existing folder and run the command again", file=sys.stderr)
        return EXIT_FAILED
    try:
        code = handler(args)
        sys.stdout.flush()  # a full or closed output: said here, not at the interpreter's exit
        return code
    except UserError as err:
        print(f"ablate: error: {err}", file=sys.stderr)
        return exit_status(err)
    except OSError as err:
        if err.errno not in UNWRITABLE:
            raise
        sys.stdout = open(os.devnull, "w")  # what is left unflushed goes nowhere, quietly
        where = f"{err.filename}" if err.filename else "the output (stdout)"
        print(f"ablate: error: cannot write to {str(where)[:200]}: {err.strerror}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as err:
        detail = f" ({err})" if str(err) else ""
        print(f"ablate: interrupted{detail}; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `ablate params --json | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
