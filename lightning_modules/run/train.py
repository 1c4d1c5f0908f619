"""One training run, end to end: data, Trainer, resume, evaluation, `results.json`.

Everything lands in the run directory: `config.yaml`, `spm.model`, `checkpoints/` (resumable:
the same command continues from `last.ckpt`), `logs/` (CSV), `wandb/` (offline unless an API key
is configured), the dev/test sources, references and translations, `attention.npz` (every head's
weights on one fixed dev sentence) and `results.json`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lightning_modules.callbacks import (FaultPoints, NonFiniteLoss, PromptInterruptWhileCompiling, StopAtStepEnd,
                                         TrainingClock)
from lightning_modules.compiling import compiled_graphs, recompile_reasons
from lightning_modules.config import RunConfig, parse_devices
from lightning_modules.convergence import classify_run
from lightning_modules.data.datamodule import TranslationDataModule
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID
from foundation.errors import DiskFull, RunFailed, UserError
from lightning_modules.evaluate import corpus_bleu, translate
from lightning_modules.metrics_log import set_aside
from lightning_modules.resume import CountBatches, RandomState, StepCountsAfterResume
from lightning_modules.run.attention import save_run_attention
from lightning_modules.run.attention_figures import ATTENTION_FILE, run_attention_png
from lightning_modules.run.checkpoint_io import AtomicCheckpointIO
from lightning_modules.run.environment import cpu_model, environment
from foundation.faults import inject
from foundation.io import (atomic_write_json, atomic_write_text, disk_full_ends_the_run, first_missing,
                                     write_lines)
from lightning_modules.run.results import RESULTS, RunResult, read_results
from foundation.rundir import CONFIG, check_apart, claim, global_rank_zero, training_lock, wait_until_ours
from lightning_modules.run.slurm import on_slurm, task_cores
from foundation.stop import REQUEUE_SIGNAL, STOP
from lightning_modules.run.preflight import (check_decoding_memory, check_disk_space, check_cores, check_hardware, check_memory, check_output_dir,
                                        check_same_result, check_same_run, remove_stale_temporaries,
                                        resume_checkpoint, uses_gpu, wandb_mode)
from lightning_modules.config import to_yaml
from lightning_modules.stopwatch import StartUp
from lightning_modules.translation import TranslationModule

# train.compile=auto compiles CUDA runs of at least this many steps: where the time the compiled
# step saves pays back its compilation with a warm cache (the GPU pages of benchmarks/README.md).
COMPILE_MIN_STEPS = 2000

# A first run has nothing to resume from: Lightning says so twice; that is expected.
warnings.filterwarnings("ignore", message=r".*\.fit\(ckpt_path=None\)` was called without a model")
warnings.filterwarnings("ignore", message=r".*ckpt_path=\"last\"\) is set, but there is no last checkpoint")
warnings.filterwarnings("ignore", message=r"`weights_only` was not set, defaulting to `False`")  # OnExceptionCheckpoint


def resolve_hardware(cfg: RunConfig) -> dict[str, Any]:
    """Trainer device settings; 'auto' precision is bf16-mixed on a GPU that has it, else fp32."""
    check_hardware(cfg)
    check_cores(cfg)
    t = cfg.train
    precision = t.precision
    if precision == "auto":
        precision = "bf16-mixed" if uses_gpu(cfg) and torch.cuda.is_bf16_supported() else "32-true"
    return {"accelerator": t.accelerator, "devices": parse_devices(t.devices), "strategy": t.strategy,
            "precision": precision, "num_nodes": t.num_nodes}


def slurm_requeue(cfg: RunConfig) -> tuple[list[SLURMEnvironment], bool]:
    """Under SLURM: Lightning's SLURMEnvironment (auto-requeue as train.slurm_requeue says), and
    whether a pre-emption notice requeues the job; with auto-requeue, `STOP` records SIGUSR1 from
    now on (it may hold a notice from start-up; run/slurm.py)."""
    requeue = on_slurm() and cfg.train.slurm_requeue
    if requeue:
        STOP.install(REQUEUE_SIGNAL)
    return ([SLURMEnvironment(auto_requeue=cfg.train.slurm_requeue)] if on_slurm() else []), requeue


def keep_newest(k: int) -> dict[str, Any]:
    """ModelCheckpoint settings that keep the K newest step checkpoints (Lightning keeps one without
    a monitor; ranking by "step", highest first, keeps the newest K)."""
    return {"save_top_k": 1} if k == 1 else {"save_top_k": k, "monitor": "step", "mode": "max"}


def compile_enabled(cfg: RunConfig) -> bool:
    """train.compile, with auto (None) = on for CUDA runs of >= COMPILE_MIN_STEPS steps."""
    if cfg.train.compile is not None:
        return cfg.train.compile
    return uses_gpu(cfg) and cfg.train.max_steps >= COMPILE_MIN_STEPS


def deterministic(cfg: RunConfig) -> bool:
    """train.deterministic, with auto (None) = on for CPU runs."""
    if cfg.train.deterministic is not None:
        return cfg.train.deterministic
    return not uses_gpu(cfg)


def make_loggers(cfg: RunConfig, out: Path, mode: str | None) -> list[Logger]:
    """CSV always; W&B in `mode` ('online' or 'offline'; None: off), started here, before training.
    W&B is an extra: one that cannot start (its folder not writable, not a folder) is one warning
    line and the run trains without it, its curves in logs/metrics.csv."""
    loggers: list[Logger] = [CSVLogger(out, name="logs", version="")]
    if mode:
        try:
            loggers.append(_started_wandb(cfg, out, mode))
        except Exception as err:  # noqa: BLE001 (whatever W&B raises: a run never fails for it)
            wandb_warning(f"could not start ({_first_words(err)}); this run logs to logs/metrics.csv without W&B")
    return loggers


WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _started_wandb(cfg: RunConfig, out: Path, mode: str) -> WandbLogger:
    """The run's W&B logger, its run started (`wandb.init`); the run id it resumes is kept in
    wandb_id.txt (one that is no W&B id, `../../outside` say, is replaced by a new run's)."""
    id_file = out / "wandb_id.txt"
    run_id = id_file.read_text(errors="replace").strip() if id_file.is_file() else None
    if run_id is not None and not WANDB_ID.fullmatch(run_id):
        wandb_warning(f"{id_file} holds no W&B run id ({run_id[:40]!r}); a new W&B run is started")
        run_id = None
    logger = _wandb_logger(cfg, out, mode, run_id)
    if mode == "online":
        logger = _online_or_offline(logger, cfg, out, run_id)
    logger.experiment  # noqa: B018 (starts the run now, not at the first log inside training)
    if run_id is None:
        atomic_write_text(id_file, logger.experiment.id)
    return logger


def wandb_warning(text: str) -> None:
    print(f"ablate: warning: W&B {text}", file=sys.stderr, flush=True)


def _first_words(err: BaseException) -> str:
    return " ".join(str(err).split())[:160] or type(err).__name__


WANDB_INIT_TIMEOUT_S = 30.0  # W&B's own init_timeout (90 s by default) unless $WANDB_INIT_TIMEOUT says


def _wandb_logger(cfg: RunConfig, out: Path, mode: str, run_id: str | None) -> WandbLogger:
    import wandb

    if mode == "offline":  # said to wandb.init itself too: after an online start that failed, the flag alone went online
        settings: dict[str, Any] = {"mode": "offline"}
    else:
        settings = {} if os.environ.get("WANDB_INIT_TIMEOUT") else {"settings": wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S)}
    return WandbLogger(project=cfg.train.wandb_project, save_dir=str(out), offline=mode == "offline",
                       group=cfg.train.wandb_group or cfg.row, name=out.name, id=run_id,
                       tags=[cfg.row, cfg.preset, cfg.data.corpus], config=asdict(cfg),
                       resume="allow", **settings)


def _online_or_offline(logger: WandbLogger, cfg: RunConfig, out: Path, run_id: str | None) -> WandbLogger:
    """The online W&B run, started now (within W&B's init_timeout), or, when W&B cannot be reached
    (no network, a host that does not answer), an offline run in its place with one warning line:
    `wandb sync` uploads it later. Training never waits on W&B for longer than the timeout."""
    import wandb

    try:
        logger.experiment  # noqa: B018 (starts the run: wandb.init)
        return logger
    except (wandb.errors.Error, TimeoutError, OSError) as err:
        wandb_warning(f"online could not start ({_first_words(err)}); logging offline instead, in "
                      f"{out / 'wandb'} (upload it later with `wandb sync`)")
    return _wandb_logger(cfg, out, "offline", run_id)


def log_attention(loggers: list[Logger], path: Path, row: str, step: int) -> None:
    """The run's attention figure, drawn from its `attention.npz` as the report draws a row of
    group A (`run_attention_png`), into its W&B record as the image `attention` at `step`; nothing
    without a W&B logger."""
    wandb_loggers = [logger for logger in loggers if isinstance(logger, WandbLogger)]
    if not wandb_loggers:
        return
    from PIL import Image

    image = Image.open(io.BytesIO(run_attention_png(path, row)))
    caption = "last encoder layer, every head, on the fixed dev sentence (attention.npz)"
    for logger in wandb_loggers:
        logger.log_image(key="attention", images=[image], step=step, caption=[caption])


def evaluate_split(module: TranslationModule, dm: TranslationDataModule, cfg: RunConfig,
                   split: str, out: Path) -> tuple[float, str]:
    """Translate one split with beam search, save source/reference/hypothesis files, score BLEU."""
    text = dm.corpus.valid if split == "valid" else dm.corpus.test
    name = "dev" if split == "valid" else "test"
    hyps = [dm.decode(ids) for ids in translate(module.model, dm.encode(text.src), BOS_ID, EOS_ID, cfg.eval)]
    write_lines(out / f"{name}.src.txt", text.src)
    write_lines(out / f"{name}.ref.txt", text.tgt)
    write_lines(out / f"{name}.hyp.txt", hyps)
    return corpus_bleu(hyps, text.tgt, cfg.eval.bleu_tokenize)


def train(cfg: RunConfig, out: str | Path, group: str | None = None,
          callbacks: list[pl.Callback] | None = None, wait: bool = False) -> RunResult | None:
    """Train (or resume, or reuse) the run in `out` and return its results (None on DDP ranks
    other than 0, which do not evaluate): the checks, then build -> fit -> evaluate -> record.

    `callbacks` are added to the Trainer's (a sweep passes its pruning callback here). `out` must
    be new, empty or one of our run directories (`foundation/rundir.py`); while it trains it is locked,
    and another command on it stops in one line, or with `wait` waits for the lock.
    """
    startup = StartUp()
    startup.mark("imports")  # Python, the imports, the command line
    inject("startup")
    out = Path(out)
    check_apart([("--out", out)])  # not inside another run's folder, which a rerun of that one may empty
    hardware = resolve_hardware(cfg)  # bad or missing hardware fails before any work
    check_memory(cfg)
    wandb = wandb_mode(cfg.train.wandb, cfg.train.wandb_on_error)  # a missing W&B key fails here, not later
    # a full disk anywhere, the checks' writes too: one line, exit 1
    with nothing_left_if_it_fails(out, first_missing(out)) as started, disk_full_ends_the_run(out):
        check_output_dir(out)
        rank_zero = global_rank_zero()
        if rank_zero:
            claim(out)
        else:  # another node's process, or rank 0's child: rank 0 makes the folder ours first
            wait_until_ours(out)
        with training_lock(out, wait) if rank_zero else contextlib.nullcontext():
            if done := reusable_result(cfg, out):
                return done
            startup.mark("checks")  # hardware, memory, W&B, the run directory and its lock
            run = build(cfg, out, hardware, wandb, callbacks, startup)
            started()
            fit(run)
            produced = evaluate(run)
            if produced is None:
                return None
            results = record(run, "complete", group=group or cfg.row, **produced)  # results first, then W&B
            if (run.out / ATTENTION_FILE).is_file():
                try:
                    log_attention(run.trainer.loggers, run.out / ATTENTION_FILE, cfg.row, run.trainer.global_step)
                except Exception as err:  # noqa: BLE001 (the run is complete and recorded: W&B is an extra)
                    wandb_warning(f"did not take the attention figure ({_first_words(err)}); the run is complete")
            return results


def reusable_result(cfg: RunConfig, out: Path) -> RunResult | None:
    """Under the run directory's lock: what a killed run left removed, the checks against what the
    directory holds, and its finished run of this configuration, to reuse (None: train)."""
    remove_stale_temporaries(out)
    check_same_run(out, cfg)
    check_disk_space(out, cfg)
    done = read_results(out)
    if done and done.status == "failed":
        raise RunFailed(f"{out} holds a failed run ({done.reason}); use another --out (or delete {out}) to try again")
    if done and done.complete:
        check_same_result(out, done, cfg)
        return done
    return None


@contextlib.contextmanager
def nothing_left_if_it_fails(out: Path, created: Path | None) -> Iterator[Callable[[], None]]:
    """The one clean-up of a failed run: the outermost directory it made (`created`; None: it made
    none) is removed when the run is refused before it starts training (a UserError: a check, the
    corpus, a decoding that cannot fit), or when the disk fills before its first checkpoint (nothing
    to resume from). Yields what to call when training starts: a run that fails after that keeps what
    it wrote (a failed results.json, its checkpoints). Another command's lock is no refusal (RunFailed)."""
    training = []
    try:
        yield lambda: training.append(True)
    except UserError as err:
        refused = not training and not isinstance(err, RunFailed)
        resumable = any(out.glob("checkpoints/*.ckpt"))
        if created and (refused or isinstance(err, DiskFull) and not resumable):
            shutil.rmtree(created, ignore_errors=True)
        raise


@dataclass
class Run:
    """What `build` makes of a configuration: the configuration with the model as built (the
    tokenizer's vocabulary), its data, model, Trainer and clock, and how it trains."""

    cfg: RunConfig
    out: Path
    precision: str
    dm: TranslationDataModule
    module: TranslationModule
    trainer: pl.Trainer
    clock: TrainingClock
    compiled: bool
    requeue: bool
    resume_from: Path | None


def build(cfg: RunConfig, out: Path, hardware: dict[str, Any], wandb: str | None,
          callbacks: list[pl.Callback] | None, startup: StartUp) -> Run:
    """The data (config.yaml written once it is usable), the model and the Trainer, each part of
    the start-up marked (`startup`; its last part ends at the first step, by the clock)."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    elif on_slurm() and "OMP_NUM_THREADS" not in os.environ:  # the task's cores, not the node's
        torch.set_num_threads(task_cores())
    slurm, requeue = slurm_requeue(cfg)
    pl.seed_everything(cfg.train.seed, workers=True, verbose=False)
    dm = TranslationDataModule(cfg.data, out, seed=cfg.train.seed, max_len=cfg.model.max_len,
                               pad_multiple=cfg.data.pad_multiple)
    dm.setup("fit")
    # the final beam search's memory, from the dev sources' real lengths: before training
    check_decoding_memory(cfg.model.with_vocabulary(dm.vocab_size, dm.pad_id), cfg, dm.valid_set.src_lengths)
    startup.mark("data")
    atomic_write_text(out / CONFIG, to_yaml(cfg))  # as asked for: no derived value
    # The model as built: the tokenizer decides the vocabulary (the config holds data.vocab_size).
    cfg = replace(cfg, model=cfg.model.with_vocabulary(dm.vocab_size, dm.pad_id))
    module = TranslationModule.from_configs(cfg.model, cfg.train)
    rank_zero_info(describe(cfg, dm.stats, module.n_parameters, out))
    compiled = compile_enabled(cfg)
    if compiled:
        module.compile_step()
    startup.mark("model")
    resume = resume_checkpoint(out / "checkpoints", cfg.model)
    if resume and rank_zero_only.rank == 0:  # Lightning's CSVLogger would delete the curve so far
        set_aside(out / "logs", resume[1])
    clock = TrainingClock(cfg.train.log_every_n_steps, startup)
    extra = [*([PromptInterruptWhileCompiling(STOP)] if compiled else []), *(callbacks or [])]
    trainer = make_trainer(cfg, out, hardware, make_loggers(cfg, out, wandb), slurm, clock, requeue, extra)
    dm.split_steps(trainer.world_size * trainer.accumulate_grad_batches)  # a step's tokens, whatever the devices
    startup.mark("trainer")  # the Trainer, its loggers and callbacks
    return Run(cfg, out, hardware["precision"], dm, module, trainer, clock, compiled, requeue,
               resume[0] if resume else None)


def make_trainer(cfg: RunConfig, out: Path, hardware: dict[str, Any], loggers: list[Logger],
                 plugins: list[Any], clock: TrainingClock, requeue: bool, extra: list[pl.Callback]) -> pl.Trainer:
    """The Trainer, its callbacks (resume bookkeeping, the clock, fault points, stop requests and
    a NaN loss, checkpoints) and then `extra`."""
    ckpt_dir = out / "checkpoints"
    t = cfg.train
    return pl.Trainer(
        **hardware,
        max_steps=t.max_steps, max_epochs=-1,
        val_check_interval=t.val_check_interval, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, accumulate_grad_batches=t.accumulate_grad_batches,
        deterministic="warn" if deterministic(cfg) else False,  # warn: an op without such a kernel
        gradient_clip_val=t.gradient_clip_val or None,
        log_every_n_steps=t.log_every_n_steps, use_distributed_sampler=False,
        enable_progress_bar=t.progress_bar, enable_model_summary=False, logger=loggers,
        default_root_dir=ckpt_dir,  # where Lightning's SLURM requeue saves hpc_ckpt_N.ckpt
        plugins=[AtomicCheckpointIO(), *plugins],
        callbacks=[CountBatches(), RandomState(), StepCountsAfterResume(), clock, FaultPoints(),
                   StopAtStepEnd(STOP, t.log_every_n_steps, requeue),  # a NaN loss, a stop request
                   ModelCheckpoint(dirpath=ckpt_dir, filename="step{step}", save_last=True,
                                   every_n_train_steps=t.checkpoint_every,
                                   auto_insert_metric_name=False, **keep_newest(t.keep_checkpoints)),
                   # Saved on Ctrl-C or an exception; Lightning deletes it after a clean finish.
                   OnExceptionCheckpoint(dirpath=ckpt_dir, filename="interrupted"), *extra],
    )


def fit(run: Run) -> None:
    """Train to max_steps (from the newest checkpoint, if any). A NaN or infinite loss records a
    failed results.json and ends in one line; Ctrl-C or SIGTERM stops with the checkpoint saved."""
    trainer = run.trainer
    try:
        trainer.fit(run.module, datamodule=run.dm, ckpt_path=run.resume_from, weights_only=True)
    except NonFiniteLoss as err:
        if trainer.global_rank == 0:
            record(run, "failed", reason=str(err))
        raise RunFailed(f"{err}; recorded in {run.out / RESULTS}. Lower train.lr_scale or raise "
                        f"train.warmup_steps, and train in another --out") from None
    except SystemExit:  # Lightning's ending for Ctrl-C (exit 1) and SIGTERM (SIGTERMException)
        raise KeyboardInterrupt(f"stopped at step {trainer.global_step}; the checkpoint is saved") from None
    if trainer.interrupted:
        raise UserError("training was interrupted; run the same command again to resume")
    if run.requeue:
        STOP.install(REQUEUE_SIGNAL)  # (Lightning put its own back) a notice during the evaluation lets it finish


def evaluate(run: Run) -> dict[str, Any] | None:
    """Validation (every rank), then on rank 0: the convergence class from the curves, beam search
    on dev (and test) with the translations saved, and attention.npz (logged to W&B as a figure).
    What it measured, for `record`; None on the other ranks."""
    cfg, dm, module, trainer = run.cfg, run.dm, run.module, run.trainer
    metrics = trainer.validate(module, datamodule=dm, verbose=False)[0]
    if trainer.global_rank != 0:
        return None
    for logger in trainer.loggers:
        logger.save()  # the curves below are read back from logs/metrics.csv
    convergence = classify_run(run.out / "logs", dm.stats["unigram_ppl"], cfg.train.warmup_steps)
    device = trainer.strategy.root_device
    module.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.precision.startswith("bf16")):
        bleu, signature = evaluate_split(module, dm, cfg, "valid", run.out)
        test_bleu = None
        if cfg.eval.decode_test and dm.corpus.test.src:
            test_bleu, _ = evaluate_split(module, dm, cfg, "test", run.out)
        save_run_attention(module.model, dm, cfg.eval, run.out)  # one dev sentence's heads (W&B takes it after record)
    return {"ppl": round(metrics["val/ppl"], 3), "bleu": bleu, "sacrebleu_signature": signature,
            "test_bleu": test_bleu, "device": device, **convergence}


def record(run: Run, status: str, device: torch.device | None = None, **produced: Any) -> RunResult:
    """results.json, and the `RunResult` it holds, built here only: a failed run's names the run,
    its step and why (`produced`: the reason); a complete one's adds what `build` made and what the
    clock and `evaluate` measured (`produced`), written last (a run is complete once it is there)."""
    cfg, trainer, clock, compiled = run.cfg, run.trainer, run.clock, run.compiled
    named = {"row": cfg.row, "preset": cfg.preset, "steps": trainer.global_step, "seed": cfg.train.seed}
    results = RunResult(status=status, **named, **produced) if status == "failed" else RunResult(
        status=status, **named, corpus=cfg.data.corpus, params=run.module.n_parameters,
        train_time_s=round(clock.train_time_s, 1), tokens_per_s=round(clock.tokens_per_s, 1),
        steady_tokens_per_s=_round(clock.steady_tokens_per_s, 1),
        startup_s=_round(clock.startup_s, 2), startup=clock.startup.parts or None,
        first_step_s=_round(clock.first_step_s, 2),
        compiled=compiled, compiled_graphs=compiled_graphs() if compiled else 0,
        recompiled_because=recompile_reasons() if compiled else None,
        target_tokens=clock.target_tokens, beam_size=cfg.eval.beam_size, length_penalty=cfg.eval.length_penalty,
        padding_share=round(run.dm.stats["train_padding_share"], 4), data=run.dm.stats,
        model=asdict(cfg.model), precision=run.precision,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        environment=environment(run.precision, device),
        world_size=trainer.world_size, host=socket.gethostname(), **produced)
    atomic_write_json(run.out / RESULTS, results.to_json(), fault="results_write" if results.complete else None)
    return results


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def describe(cfg: RunConfig, stats: dict[str, Any], n_parameters: int, out: Path) -> str:
    """What is about to be trained, in four lines (the last: what preparing the data took)."""
    m = cfg.model
    extra = f" (+{stats['extra_train_pairs']:,} dictionary)" if stats.get("extra_train_pairs") else ""
    return (f"run {cfg.row} @ {cfg.preset} -> {out}\n"
            f"model: N={m.n_layers} d_model={m.d_model} d_ff={m.d_ff} h={m.n_heads} d_k={m.d_k} "
            f"d_v={m.d_v} P_drop={m.dropout} eps_ls={m.label_smoothing} {m.positional}, "
            f"{n_parameters:,} parameters\n"
            f"data: {stats['corpus']}, {stats['train_pairs']:,} train pairs{extra}, "
            f"{stats['valid_pairs']:,} dev, {stats['test_pairs']:,} test; BPE vocabulary "
            f"{stats['vocab_size']:,}; {stats['train_batches']:,} steps an epoch of <= {cfg.data.max_tokens:,} "
            f"tokens a side, {stats['train_padding_share']:.1%} padding; {cfg.train.max_steps:,} steps\n"
            f"data preparation: {describe_stages(stats.get('stages', []))}{describe_cached(stats.get('prepared'))}")


def describe_stages(stages: list[dict[str, Any]]) -> str:
    """`read 0.4 s (CPU 0.4 s, peak RSS 310 MB), bpe ...`: each data stage's wall, CPU, memory."""
    return ", ".join(f"{s['stage']} {s['wall_s']:.1f} s (CPU {s['cpu_s']:.1f} s, peak RSS "
                     f"{'?' if s['peak_rss_mb'] is None else format(s['peak_rss_mb'], ',')} MB)"
                     for s in stages) or "nothing"


def describe_cached(prepared: dict[str, Any] | None) -> str:
    """`; from data.cache_dir: the BPE model, train and valid encoded`, or nothing where none was."""
    prepared = prepared or {}
    taken = ["the BPE model"] if prepared.get("bpe") == "cache" else []
    if prepared.get("encoded_from_cache"):
        taken.append(" and ".join(prepared["encoded_from_cache"]) + " encoded")
    return f"; from data.cache_dir: {', '.join(taken)}" if taken else ""


SUMMARY_KEYS = [("row", "row"), ("params", "params"), ("ppl", "dev PPL"), ("bleu", "dev BLEU"),
                ("test_bleu", "test BLEU"), ("steps", "steps"), ("train_time_s", "train time (s)"),
                ("tokens_per_s", "target tokens/s")]


def summary_table(results: RunResult, out: str | Path) -> str:
    """A short two-column table of the headline numbers, and the run directory `out`."""
    rows = [(label, getattr(results, key)) for key, label in SUMMARY_KEYS]
    if results.startup_s is not None:  # None: not measured
        parts = ", ".join(f"{p['part']} {p['s']:.1f}" for p in results.startup or [])
        rows.append(("start-up (s)", f"{results.startup_s:.1f}" + (f" ({parts})" if parts else "")))
    rows.append(("sacreBLEU", results.sacrebleu_signature))
    rows.append(("run directory", str(out)))
    width = max(len(label) for label, _ in rows)
    fmt = lambda v: f"{v:,}" if isinstance(v, int) else str(v)  # noqa: E731
    return "\n".join(f"{label.ljust(width)}  {fmt(value)}" for label, value in rows)
