"""Issue 12, "done when": `ablate table3` with 8 workers, killed 5 times at random moments
(SIGKILL to its process group, or SIGTERM as `timeout` sends it) and run again each time, on
SQLite and on PostgreSQL. After the final run every row is complete exactly once, no run printed
a traceback, and the final run exits 0.

The moments come from a seeded RNG (`ABLATE_KILL_SEED`, printed with each moment and written to
`kills.log` in the test's directory), so a failure is reproducible. Tiny settings on a 3,000-pair
corpus keep each row at a few seconds of training: what is tested is the machinery.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps.worker import counted_failures

KILL_SEED = int(os.environ.get("ABLATE_KILL_SEED", "12"))
CYCLES, WORKERS, MAX_STEPS = 5, 8, 30
ROWS, SEEDS = ["base", "D1", "E"], [1, 2, 3]  # 9 runs: one waits for a free worker
KILL_WINDOW_S = (2.0, 50.0)  # a moment after the start of each run: start-up, claims, training, evaluation
TERM_GRACE_S = 90  # `timeout -k`: SIGKILL when SIGTERM has not stopped the run by then
SETTINGS = ["--preset", "tiny", "--rows", ",".join(ROWS), "--seeds", ",".join(map(str, SEEDS)),
            "--workers", str(WORKERS), "--no-report", "--no-wandb",
            "--max-steps", str(MAX_STEPS), "d_model=32", "d_ff=64", "n_heads=4", "n_layers=1",
            "data.vocab_size=500", "data.max_tokens=1000", "eval.max_len_offset=10",
            "eval.decode_test=false", "train.progress_bar=false", "train.val_check_interval=10",
            "train.checkpoint_every=5", "train.log_every_n_steps=5"]


def start(args: list[str], log: Path) -> subprocess.Popen:
    """`ablate table3 ...` as the leader of its own process group; stdout and stderr to files."""
    with open(log.with_suffix(".out"), "wb") as out, open(log.with_suffix(".err"), "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "ablate", *args], stdout=out, stderr=err,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop_at(proc: subprocess.Popen, delay: float, sig: signal.Signals) -> tuple[int, str]:
    """Send `sig` to the run's process group `delay` seconds after its start; its exit status and
    what happened."""
    try:
        return proc.wait(timeout=delay), "finished before its moment"
    except subprocess.TimeoutExpired:
        pass
    os.killpg(proc.pid, sig)
    try:
        return proc.wait(timeout=TERM_GRACE_S), f"{sig.name} sent"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), f"{sig.name} sent; still running after {TERM_GRACE_S} s, SIGKILL"


def completed_results(runs: Path) -> dict[Path, tuple[int, bytes]]:
    """Every complete results.json: its mtime and bytes."""
    done = {}
    for path in runs.rglob("results.json"):
        if json.loads(path.read_bytes()).get("status") == "complete":
            done[path] = (path.stat().st_mtime_ns, path.read_bytes())
    return done


def tracebacks(log_dir: Path, runs: Path) -> list[str]:
    """Files holding a traceback: the runs' stderr and every trial's log."""
    files = [*log_dir.glob("*.err"), *runs.rglob("trial.log")]
    return [str(f) for f in files if "Traceback" in f.read_text(errors="replace")]


def storage_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/t3.db"
    return request.getfixturevalue("postgres_url")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_eight_workers_killed_five_times_leave_every_row_complete_once(backend, small_corpus, tmp_path, request):
    storage, runs = storage_url(backend, tmp_path, request), tmp_path / "runs"
    study = f"kill-{backend}"
    args = ["table3", "--storage", storage, "--study", study, "--runs-dir", str(runs), *small_corpus, *SETTINGS]
    rng = random.Random(KILL_SEED)
    signals = rng.sample([signal.SIGKILL, signal.SIGTERM] * 3, CYCLES)  # both kinds, in random order
    kill_log = tmp_path / "kills.log"
    seen: dict[Path, tuple[int, bytes]] = {}
    for cycle, sig in enumerate(signals):
        delay = round(rng.uniform(*KILL_WINDOW_S), 2)
        started = time.monotonic()
        code, what = stop_at(start(args, tmp_path / f"run{cycle}"), delay, sig)
        now = completed_results(runs)
        line = (f"seed {KILL_SEED} cycle {cycle}: {sig.name} at {delay} s: {what}, exit {code} "
                f"after {time.monotonic() - started:.1f} s; {len(now)} of {len(ROWS) * len(SEEDS)} runs complete")
        print(line)
        with kill_log.open("a") as f:
            f.write(line + "\n")
        assert {p: now.get(p) for p in seen} == seen, f"a complete run was written again ({line})"
        seen = now
    final = start(args, tmp_path / "final")
    assert final.wait(timeout=600) == 0, (tmp_path / "final.err").read_text()[-3000:]
    assert not tracebacks(tmp_path, runs), tracebacks(tmp_path, runs)

    trials = optuna.load_study(study_name=study, storage=storage).get_trials()
    complete = sorted((t.user_attrs["row"], t.user_attrs["seed"]) for t in trials if t.state == TrialState.COMPLETE)
    assert complete == sorted((r, s) for r in ROWS for s in SEEDS), complete  # each exactly once
    assert not [t.number for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]
    assert counted_failures(trials) == [], "killed trials were counted as failed runs"
    errors = "".join(p.read_text() for p in tmp_path.glob("*.err"))
    assert "too many failed trials" not in errors
    done = completed_results(runs)
    assert {p: done.get(p) for p in seen} == seen, "a complete run was written again by the final run"
    assert len(done) == len(ROWS) * len(SEEDS)
    for path in done:
        results = json.loads(path.read_text())
        assert results["status"] == "complete" and results["steps"] == MAX_STEPS, path
