"""Start a sweep's workers (one process each; `--gpus` gives each its GPUs, `--workers K` shares the CPU
cores), pass a stop on to them (also at `--stop-after`), wait, and summarise the study after."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import optuna

from foundation.errors import EXIT_INTERRUPTED, UserError
from lightning_modules.run.slurm import on_slurm, requeue_job, task_cores
from foundation.stop import INTERRUPTS, POLL_S, REQUEUE_SIGNAL, STOP, TO_WORKERS
from sweeps.processes import WORKER_ENV, spawn
from sweeps.storage import make_storage, safe_url
from sweeps.worker import WorkerSettings, resolve_run_dir


def describe_duration(seconds: float) -> str:
    """`2h 30m`, `90s`: a duration as a person writes it."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return " ".join(parts) or "0s"


def device_groups(gpus: str | None, workers: int | None, devices_per_run: int,
                  accelerator: str | None = None, here: bool = True) -> tuple[list[str], list[str] | None]:
    """The `ablate train` overrides every run needs, and each worker's GPUs (None on CPU)."""
    per = devices_per_run
    if per < 1:
        raise UserError(f"--devices-per-run must be at least 1, got {per}")
    if gpus is not None and workers:
        raise UserError("use --workers K (CPU) or --gpus 0,1,... (one worker per GPU), not both")
    listed = gpu_ids(gpus) if gpus is not None else None
    cores = task_cores()
    if here and listed is None and (workers or 1) * per > max(CPU_PROCESSES_PER_CORE * cores, 8):
        raise UserError(f"--workers {workers or 1} x --devices-per-run {per} training processes on this "
                        f"machine's {cores} cores: at most {max(CPU_PROCESSES_PER_CORE * cores, 8)} "
                        f"({CPU_PROCESSES_PER_CORE} a core; more only contend for them and for memory)")
    overrides: list[str] = []
    groups = None
    if listed:
        if len(listed) % per:
            raise UserError(f"--gpus lists {len(listed)} GPUs, not a multiple of --devices-per-run {per}")
        if here:
            from lightning_modules.run.preflight import check_gpu_ids  # loads torch: only when GPUs are named

            check_gpu_ids([int(d) for d in listed], f"--gpus {gpus}")
        groups = [",".join(listed[i:i + per]) for i in range(0, len(listed), per)]
    if per > 1:
        overrides.append(f"train.devices={per}")
        if not listed and accelerator is None:
            overrides.append("train.accelerator=cpu")
    return overrides, groups


def gpu_ids(gpus: str) -> list[str]:
    """The distinct ASCII-digit GPU ids of `--gpus 0,1` without leading zeros, at most `MAX_GPU_IDS`."""
    listed = [d.strip() for d in gpus.split(",")]
    if not listed or not all(d.isascii() and d.isdigit() and len(d) <= 6 for d in listed) \
            or len({int(d) for d in listed}) != len(listed) or len(listed) > MAX_GPU_IDS:
        raise UserError(f"--gpus takes distinct GPU ids like 0,1 (one worker per id, at most {MAX_GPU_IDS}; "
                        f"--workers K on the CPU); got {gpus[:40]!r}")
    return [str(int(d)) for d in listed]


MAX_GPU_IDS = 1024
CPU_PROCESSES_PER_CORE = 4  # training processes a launcher starts per core, at most (workers x devices a run)


def thread_cap(environ: dict[str, str] = os.environ) -> int:
    """The threads `$OMP_NUM_THREADS` allows (else no cap): more threads than cores slow every run."""
    text = environ.get("OMP_NUM_THREADS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else sys.maxsize


def worker_envs(workers: int, devices: list[str] | None, devices_per_run: int = 1) -> list[dict[str, str]]:
    """One environment per worker: its GPUs ("0" or "0,1"), or a share of the CPU cores."""
    base = dict(os.environ, PYTHONUNBUFFERED="1")
    if devices:
        return [{**base, "CUDA_VISIBLE_DEVICES": d} for d in devices]
    threads = str(min(max(1, task_cores() // (workers * devices_per_run)), thread_cap()))
    return [{**base, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads} for _ in range(workers)]


def run_workers(settings: WorkerSettings, workers: int = 1, devices: list[str] | None = None,
                devices_per_run: int = 1, quiet: bool = False, stop_after_s: float | None = None) -> int:
    """Run the workers to the end: 0, 130 if interrupted (or `stop_after_s` passed), else 1."""
    envs = worker_envs(workers, devices, devices_per_run)
    if STOP.preempted:  # pre-empted during start-up: no trial can save and requeue, so this does
        job = requeue_job()
        print(f"sweep {settings.study}: pre-empted (SLURM) before any worker started; requeued job "
              f"{job}, which runs the same command again", file=sys.stderr)
        return EXIT_INTERRUPTED
    # in the environment, not on the command line (`sweeps.processes`)
    procs = [spawn([sys.executable, "-m", "sweeps.worker"], env={**env, WORKER_ENV: settings.to_json()})
             for env in envs]
    print(f"sweep {settings.study}: {len(procs)} worker(s) (pids {', '.join(str(p.pid) for p in procs)}), "
          f"{'the queued trials' if settings.policy else f'{settings.n_trials} trials'}, "
          f"storage {safe_url(settings.storage)}", flush=True)
    deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
    stopped = False
    passed_on: set[int] = set()  # the signals sent to the workers

    def pass_on(signum: int) -> None:
        passed_on.add(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    with STOP.recording(*INTERRUPTS, *([REQUEUE_SIGNAL] if on_slurm() else [])):
        while any(p.poll() is None for p in procs):
            if deadline is not None and not stopped and time.monotonic() >= deadline:
                stopped = True
                print(f"sweep {settings.study}: --stop-after {describe_duration(stop_after_s or 0)} reached; "
                      f"stopping the workers (each running trial saves a checkpoint)", file=sys.stderr, flush=True)
                pass_on(TO_WORKERS)
            if STOP.interrupted and TO_WORKERS not in passed_on:
                pass_on(TO_WORKERS)
            if STOP.preempted and REQUEUE_SIGNAL not in passed_on:
                pass_on(REQUEUE_SIGNAL)
            time.sleep(POLL_S)
    interrupted, preempted = STOP.interrupted, STOP.preempted
    codes = [p.returncode for p in procs]
    bad = [f"worker {i} (pid {p.pid}) exited with status {c}" for i, (p, c) in enumerate(zip(procs, codes)) if c]
    if not quiet:
        print(summary(settings), flush=True)
    if interrupted or preempted or stopped:
        how = ("pre-empted (SLURM)" if preempted else "interrupted" if interrupted
               else f"stopped after {describe_duration(stop_after_s or 0)} (--stop-after)")
        print(f"sweep {settings.study}: {how}; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if bad:
        print(f"sweep {settings.study}: {'; '.join(bad)}; run the same command again to resume",
              file=sys.stderr)
        return 1
    return 0


def summary(settings: WorkerSettings) -> str:
    """Trial counts and the best trial so far."""
    study = optuna.load_study(study_name=settings.study, storage=make_storage(settings.storage, None))
    counts = Counter(t.state.name for t in study.get_trials(deepcopy=False))  # trials per state name
    states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no trials"
    lines = [f"study {settings.study}: {states}"]
    try:
        best = study.best_trial
    except ValueError:
        return lines[0]
    lines.append(f"best: trial {best.number}, {settings.objective} {best.value:g}, "
                 f"{' '.join(best.user_attrs.get('overrides', []))}, run dir {resolve_run_dir(settings.runs_dir, best.user_attrs.get('run_dir', ''))}")
    return "\n".join(lines)
