"""Sweeps: search-space parsing, Optuna studies with real worker processes on SQLite, W&B YAML.

No mocks: real SQLite storages, real worker and trial processes, tiny real training runs. The
`ablate sweep` command itself runs in this process (`ablate_here`) except where a test signals
its processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from foundation.errors import UserError
from ablations.resolve import resolve
from sweeps.space import load_space
from sweeps.storage import make_storage
from sweeps.study import enqueue, open_study
from sweeps.wandb_sweep import agent_args
from here import ablate_here
from test_slurm import descendants, state

# The trials' settings: what is tested is the sweep machinery, not decoding, so a trial decodes
# the dev set greedily (its BLEU is still scored) and not the test set.
TINY = ["--max-steps", "10", "--no-wandb", "data.vocab_size=500", "data.ding_dictionary=false",
        "data.valid_size=100", "data.test_size=100", "data.max_tokens=2000", "eval.max_len_offset=10",
        "eval.beam_size=1", "eval.decode_test=false",
        "train.progress_bar=false", "train.val_check_interval=5", "train.checkpoint_every=5"]
SPACE = """
params:
  n_layers: {type: int, low: 1, high: 2}
  dropout: {type: float, low: 0.0, high: 0.3}
  train.lr_scale: {type: float, low: 0.1, high: 1.0, log: true}
  d_model: {type: categorical, choices: [32]}
fixed: {d_ff: 64, n_heads: 4}
"""
ATTRS = {"bleu", "ppl", "test_bleu", "params", "train_time_s", "tokens_per_s", "run_dir", "overrides",
         "sacrebleu_signature"}


def ablate(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def sweep_args(tmp: Path, study: str, n: int, *extra: str) -> list[str]:
    return ["sweep", "optuna", "--study", study, "--storage", f"sqlite:///{tmp}/db/sweeps.db",
            "--space", str(write(tmp / "space.yaml", SPACE)), "--n-trials", str(n),
            "--runs-dir", str(tmp / "runs"), "--heartbeat", "1", *TINY, *extra]


def load(tmp: Path, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{tmp}/db/sweeps.db")


def watch(open_study: Callable[[], optuna.Study]) -> Callable[[], list[optuna.trial.FrozenTrial]]:
    """The study's trials as they are now, each call, through the study `open_study()` opens once
    it exists (opened afresh for each poll, it cost 0.1 s of CPU a poll)."""
    opened: list[optuna.Study] = []

    def trials() -> list[optuna.trial.FrozenTrial]:
        if not opened:
            opened.append(open_study())
        return opened[0].get_trials()

    return trials


# --- search space -------------------------------------------------------------------------

def test_example_space_parses_and_samples_within_ranges():
    space = load_space(Path(__file__).parents[1] / "sweeps" / "example.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = dict(o.split("=", 1) for o in space.sample(trial))
        assert int(values["n_layers"]) in (1, 2) and values["n_layers"].isdigit()
        assert values["d_model"] in ("32", "64")
        assert 0.0 <= float(values["dropout"]) <= 0.3
        assert 0.1 <= float(values["train.lr_scale"]) <= 1.0
        resolve("tiny", "base", None, space.fixed_overrides() + [f"{k}={v}" for k, v in values.items()])
        study.tell(trial, 1.0)
    assert space.grid()["n_layers"] == [1, 2] and space.grid()["dropout"] == [0.0, 0.1, 0.3]


@pytest.mark.parametrize("text, message", [
    ("params: {d_model: {type: normal, low: 1, high: 2}}", "unknown type 'normal'"),
    ("params: {d_model: {type: categorical, choices: []}}", "'choices' must be a non-empty list"),
    ("params: {dropout: {type: float, low: 0.3, high: 0.1}}", "empty range"),
    ("params: {dropout: {type: float, low: 0.1, high: 0.1}}", "empty range"),
    ("params: {train.lr_scale: {type: float, low: 0.0, high: 1.0, log: true}}", "log range needs low > 0"),
    ("params: {d_modle: {type: int, low: 1, high: 2}}", "did you mean 'model.d_model'"),
    ("params: {n_layers: {type: int, low: 1, high: 2}}\nfixed: {dff: 64}", "fixed.dff"),
    ("params: {n_layers: {type: int, low: 1.5, high: 2}}", "integer"),
    ("params: {}", "non-empty"),
    ("params: {n_layers: {type: int, low: 1, high: 3, colour: red}}", "unknown field"),
])
def test_space_errors_name_file_and_key(tmp_path, text, message):
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(UserError) as err:
        load_space(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_grid_needs_values_for_float_ranges(tmp_path):
    space = load_space(write(tmp_path / "s.yaml", "params: {dropout: {type: float, low: 0.0, high: 0.3}}"))
    with pytest.raises(UserError, match="grid"):
        space.grid()


def test_bad_space_file_exits_2_with_one_line(tmp_path, capfd):
    path = write(tmp_path / "bad.yaml", "params: {d_model: {type: int, low: 4, high: 2}}")
    result = ablate_here(capfd, "sweep", "optuna", "--study", "x", "--storage", f"sqlite:///{tmp_path}/s.db",
                    "--space", str(path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ablate: error:")
    assert "params.d_model" in result.stderr and str(path) in result.stderr


# --- studies --------------------------------------------------------------------------------

def test_enqueue_skips_configurations_already_queued_or_done(tmp_path):
    study = open_study("q", make_storage(f"sqlite:///{tmp_path}/q.db", None))
    assert enqueue(study, ["d_model=64", "n_layers=2"], {"row": "A1"})
    assert not enqueue(study, ["model.n_layers=2", "model.d_model=64"], {"row": "A1"})  # the same config
    assert enqueue(study, ["d_model=64", "n_layers=2"], {"row": "A2"})  # same overrides, another row
    assert enqueue(study, ["d_model=64", "n_layers=3"])
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 3 and waiting[0].user_attrs["row"] == "A1"
    with pytest.raises(UserError, match="maximize"):
        open_study("q", f"sqlite:///{tmp_path}/q.db", "bleu")


TAKER = """
import sys, optuna
from optuna.trial import TrialState
from sweeps.storage import make_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="race", storage=make_storage(sys.argv[1], None))
for i in range(int(sys.argv[3])):  # each worker queues its share, while the others already take
    study.enqueue_trial({}, user_attrs={"k": int(sys.argv[2]) * 1000 + i})
while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
    trial = study.ask()
    if "k" not in trial.user_attrs:  # the queue emptied between the check and the ask
        study.tell(trial, state=TrialState.FAIL)
        break
    print(trial.user_attrs["k"], flush=True)
    study.tell(trial, 0.0)
"""


def take_queued_trials_concurrently(url: str, workers: int = 4, each: int = 10) -> list[int]:
    """`workers` processes each queue `each` trials into one study and take queued trials until
    none is left; returns the keys of the trials run (worker * 1000 + i)."""
    optuna.create_study(study_name="race", storage=make_storage(url, None))
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, url, str(w), str(each)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(workers)]
    taken = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]  # no "database is locked" either
        assert "locked" not in err, err[-2000:]
        taken += [int(k) for k in out.split()]
    return taken


EXPECTED_KEYS = sorted(w * 1000 + i for w in range(4) for i in range(10))


def test_four_workers_queueing_and_taking_never_run_a_trial_twice_on_sqlite(tmp_path):
    """Optuna claims a WAITING trial by read-then-write; on SQLite that raced until make_storage
    made transactions BEGIN IMMEDIATE (without it this test fails: trials run twice)."""
    taken = take_queued_trials_concurrently(f"sqlite:///{tmp_path}/race.db")
    assert sorted(taken) == EXPECTED_KEYS


def test_two_workers_finish_the_study_with_step_keyed_reports(tmp_path, capfd):
    """Two workers, two sampled trials (one each): every trial finishes with its results as user
    attributes and its reports keyed by global step; the same command again trains nothing."""
    # Beats every 15 s, not 1: on a loaded machine (a table beside the suite) a 2 s silence made
    # the heartbeat retry a live trial (7 trials); retries have tests of their own.
    args = sweep_args(tmp_path, "tpe", 2, "--workers", "2", "--heartbeat", "15")
    result = ablate_here(capfd, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    trials = load(tmp_path, "tpe").get_trials()
    assert len(trials) == 2
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete
    for t in complete:
        assert ATTRS <= set(t.user_attrs), t.user_attrs
        assert set(t.intermediate_values) == {5, 10}  # global steps, not epochs
        assert t.value == t.user_attrs["ppl"]
        assert t.user_attrs["run_dir"] == f"tpe/trial-{t.number}"  # relative to --runs-dir
    assert len({t.user_attrs["run_dir"] for t in trials}) == 2
    assert len({t.user_attrs["worker"].rsplit(":", 2)[1] for t in trials}) == 2  # both workers (host:pid:trial)
    # Re-running the same command: the study is already complete, nothing more is trained.
    again = ablate_here(capfd, *args)
    assert again.returncode == 0 and len(load(tmp_path, "tpe").trials) == 2


def wait_for_running_trial(trials: Callable[[], list[optuna.trial.FrozenTrial]],
                           accept: Callable[[optuna.trial.FrozenTrial], bool],
                           timeout: float = 120) -> optuna.trial.FrozenTrial | None:
    """Poll `trials()` until a RUNNING trial satisfies `accept`; None after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.5)
        try:
            running = [t for t in trials() if t.state == TrialState.RUNNING]
        except Exception:  # noqa: BLE001 (the database or study is not created yet)
            continue
        found = next((t for t in running if accept(t)), None)
        if found is not None:
            return found
    return None


@pytest.mark.slow  # ~65 s in `make test`, which keeps a SIGKILLed trial process and a SIGKILLed `ablate table3`
# (its workers included) finished by a re-run (test_table3.py) and heartbeat retries on every storage (test_storages.py)
def test_killed_worker_trial_is_retried_in_its_run_directory(tmp_path):
    args = sweep_args(tmp_path, "kill", 2)
    err = tmp_path / "stderr.txt"
    with err.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ablate", *args], stdout=subprocess.DEVNULL, stderr=sink)
    try:
        def resumable(t: optuna.trial.FrozenTrial) -> bool:
            ckpt = tmp_path / "runs" / t.user_attrs.get("run_dir", "/nonexistent") / "checkpoints" / "last.ckpt"
            return 5 in t.intermediate_values and ckpt.is_file()

        victim = wait_for_running_trial(watch(lambda: load(tmp_path, "kill")), resumable)
        assert victim is not None, f"no trial reached step 5; sweep stderr: {err.read_text()[-3000:]}"
        os.kill(int(victim.user_attrs["worker"].rsplit(":", 2)[1]), signal.SIGKILL)  # host:pid:number
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(2.5)  # past the heartbeat's grace period
    result = ablate(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    trials = load(tmp_path, "kill").get_trials()
    by_number = {t.number: t for t in trials}
    assert by_number[victim.number].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].user_attrs["run_dir"] == victim.user_attrs["run_dir"]
    assert retries[0].user_attrs["overrides"] == victim.user_attrs["overrides"]
    # Resumed from the step-5 checkpoint (reports step 10 only), or, when the killed trial's
    # training had already finished, reused its results (reports nothing): never restarted at 0.
    assert set(retries[0].intermediate_values) <= {10}
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 2 and len(trials) == 3
    assert len({t.user_attrs["run_dir"] for t in finished}) == 2


@pytest.mark.parametrize("devices_per_run", [1, pytest.param(2, marks=pytest.mark.slow)])  # DDP: make test-slow
def test_bad_trial_is_pruned_on_one_process_and_under_ddp(tmp_path, capfd, devices_per_run):
    """Queued good then hopeless configs: the second is pruned at its first report; with D = 2
    both trials train on 2 gloo ranks, rank 0 alone reports, and every rank stops together."""
    study = open_study("prune", make_storage(f"sqlite:///{tmp_path}/db/sweeps.db", None))
    enqueue(study, ["train.lr_scale=0.5"])
    enqueue(study, ["train.lr_scale=1e-6"])
    result = ablate_here(capfd, *sweep_args(tmp_path, "prune", 2, "--prune-startup-trials", "1",
                                "--devices-per-run", str(devices_per_run), "train.warmup_steps=5"))
    assert result.returncode == 0, result.stderr[-3000:]
    good, bad = sorted(load(tmp_path, "prune").get_trials(), key=lambda t: t.number)
    assert good.state == TrialState.COMPLETE and bad.state == TrialState.PRUNED
    assert set(bad.intermediate_values) == {5} and bad.intermediate_values[5] > good.intermediate_values[5]
    assert good.user_attrs["world_size"] == devices_per_run
    for trial, lr in ((good, 0.5), (bad, 1e-6)):
        run_dir = tmp_path / "runs" / trial.user_attrs["run_dir"]
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr_scale"] == lr
        log = (run_dir / "trial.log").read_text()
        assert ("Starting with 2 processes" in log) == (devices_per_run == 2)
    assert not (tmp_path / "runs" / bad.user_attrs["run_dir"] / "results.json").exists()


@pytest.mark.parametrize("set_to, cap", [(None, None), ("1", 1), ("999", None), ("x", None)])  # cap: what binds
def test_cpu_workers_share_the_cores_within_a_thread_count_already_set(monkeypatch, set_to, cap):
    """The cores shared are the task's: here a SLURM task's 8 (--cpus-per-task), whatever the node has."""
    from sweeps.launch import worker_envs

    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "table3", "SLURM_CPUS_PER_TASK": "8"}.items():
        monkeypatch.setenv(key, value)
    if set_to is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", set_to)
    for workers, per_trial, share in ((1, 1, 8), (2, 1, 4), (2, 2, 2), (16, 1, 1)):
        envs = worker_envs(workers, None, per_trial)
        assert len(envs) == workers
        assert {(e["OMP_NUM_THREADS"], e["MKL_NUM_THREADS"]) for e in envs} == {(str(cap or share),) * 2}
    assert [e.get("OMP_NUM_THREADS") for e in worker_envs(2, ["0", "1"])] == [set_to] * 2  # GPU workers: as set


def test_gpus_must_split_into_groups_of_devices_per_run(tmp_path, capfd):
    result = ablate_here(capfd, *sweep_args(tmp_path, "split", 2, "--gpus", "0,1,2", "--devices-per-run", "2"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "not a multiple of --devices-per-run 2" in lines[0]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def pending(pid: int, sig: signal.Signals) -> bool:
    """Whether `sig` was sent to process `pid` and waits there (a stopped process's signals wait)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:  # the process ended
        return False
    return any(int(fields[key], 16) >> (sig - 1) & 1 for key in ("ShdPnd", "SigPnd"))


def wait_until_pending(pid: int, sig: signal.Signals, deadline: float, root: subprocess.Popen) -> bool:
    """Wait, until `deadline` (time.monotonic) and while `root` runs, for `sig` to be sent to the
    stopped process `pid`; whether it was."""
    while not pending(pid, sig) and time.monotonic() < deadline and root.poll() is None:
        time.sleep(0.1)
    return pending(pid, sig)


@pytest.mark.parametrize("launched", ["foreground", pytest.param("sigint-ignored", marks=pytest.mark.slow)])
def test_sigterm_stops_the_sweep_and_rerun_resumes_the_interrupted_trial(tmp_path, capfd, launched):
    """The sweep signalled is a real `ablate` process (the re-run needs none: it runs in this one).
    Its trial's process holds itself after step 7 (`ABLATE_FAULT=train_step@7:SIGSTOP`, inherited
    through the worker) until the worker has passed the stop on to it as SIGINT: so the signal
    comes mid-training at a known step, however loaded the machine, and 10 steps are enough.
    `sigint-ignored`: started as `nohup ablate ... &` from a script starts it (SIGINT ignored,
    inherited by every process below unless reset), yet the worker stops its trial with SIGINT."""
    steps, held = 10, 7
    args = sweep_args(tmp_path, "term", 1, "--max-steps", str(steps), "--no-prune")
    err = tmp_path / "stderr.txt"  # a file, not a pipe: a full pipe would block the sweep
    with err.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ablate", *args], stdout=subprocess.DEVNULL, stderr=sink,
                                env={**os.environ, "ABLATE_FAULT": f"train_step@{held}:SIGSTOP"},
                                preexec_fn=_ignore_sigint if launched == "sigint-ignored" else None)
    try:
        deadline, trainer = time.monotonic() + 300, None
        while trainer is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            trainer = next((p for p in descendants(proc.pid) if state(p) == "T"), None)
        assert trainer is not None, f"no trial process held itself at step {held}; sweep stderr: {err.read_text()[-3000:]}"
        (running,) = [t for t in load(tmp_path, "term").get_trials() if t.state == TrialState.RUNNING]
        proc.send_signal(signal.SIGTERM)
        # the sweep passes SIGTERM on to its worker, the worker SIGINT to the trial
        assert wait_until_pending(trainer, signal.SIGINT, deadline, proc), \
            f"the trial was not asked to stop; sweep stderr: {err.read_text()[-3000:]}"
        os.kill(trainer, signal.SIGCONT)
        assert proc.wait(timeout=120) == 130
        stderr = err.read_text()
        assert "Traceback" not in stderr, stderr[-2000:]  # one line per worker, not Optuna's traceback
        assert "interrupted; trial" in stderr and "resumes from its checkpoint" in stderr, stderr[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    trials = {t.number: t for t in load(tmp_path, "term").get_trials()}
    assert not [t for t in trials.values() if t.state == TrialState.RUNNING]
    assert trials[running.number].state == TrialState.FAIL
    (retry,) = [t for t in trials.values() if t.state == TrialState.WAITING]
    assert retry.user_attrs["run_dir"] == running.user_attrs["run_dir"]
    interrupted = tmp_path / "runs" / running.user_attrs["run_dir"] / "checkpoints" / "interrupted.ckpt"
    stopped_at = torch.load(interrupted, weights_only=True)["global_step"]
    assert stopped_at == held  # saved where the stop came, mid-training

    again = ablate_here(capfd, *args)
    assert again.returncode == 0, again.stderr[-2000:]
    retry = load(tmp_path, "term").get_trials()[retry.number]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["steps"] == steps
    assert set(retry.intermediate_values) == {10}  # resumed after step 7, not restarted at step 0


# --- Weights & Biases -----------------------------------------------------------------------

def test_wandb_sweep_yaml_and_agent_arguments_train(tmp_path, capfd):
    out = tmp_path / "sweep.yaml"
    result = ablate_here(capfd, "sweep", "wandb", "--space", str(write(tmp_path / "space.yaml", SPACE)),
                    "--out", str(out), "--runs-dir", str(tmp_path / "runs"), *TINY)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(out.read_text())
    assert config["method"] == "bayes" and config["metric"] == {"name": "val/ppl", "goal": "minimize"}
    params = config["parameters"]
    assert params["n_layers"] == {"distribution": "int_uniform", "min": 1, "max": 2}
    assert params["dropout"] == {"distribution": "uniform", "min": 0.0, "max": 0.3}
    assert params["train.lr_scale"] == {"distribution": "log_uniform_values", "min": 0.1, "max": 1.0}
    assert params["d_model"] == {"values": [32]}
    assert config["command"][:4] == ["${env}", "${interpreter}", "-m", "sweeps.wandb_entry"]
    assert config["command"][-1] == "${args_no_hyphens}"

    values = {"n_layers": 1, "dropout": 0.1, "train.lr_scale": 1e-1 * 5, "d_model": 32}
    argv = agent_args(config, values)
    assert argv[:2] == ["--out-root", str(tmp_path / "runs" / "wandb")]
    keys = [a for a in argv[2:] if "=" in a and not a.startswith("-")]
    cfg = resolve("tiny", "base", None, keys)
    assert (cfg.model.n_layers, cfg.model.dropout, cfg.train.lr_scale, cfg.model.d_ff) == (1, 0.1, 0.5, 64)
    # what the agent runs (`python -m sweeps.wandb_entry ARGV`), here in this process with the
    # variables an agent sets: what is checked is where the run it trains lands
    from sweeps.wandb_entry import main as agent_entry

    with pytest.MonkeyPatch.context() as patch:
        for key, value in {"WANDB_MODE": "disabled", "WANDB_SWEEP_ID": "sw", "WANDB_RUN_ID": "r1"}.items():
            patch.setenv(key, value)
        assert agent_entry(argv) == 0, capfd.readouterr().err[-2000:]
    assert (tmp_path / "runs" / "wandb" / "sw" / "r1" / "results.json").is_file()


def stopped_at(run: Path, *steps: int) -> None:
    """A run directory of 24,000 steps whose training logged `steps` before it was stopped."""
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  max_steps: 24000\n")
    (run / "logs" / "metrics.csv").write_text("epoch,step,train/loss\n" + "".join(f"0,{s},5.0\n" for s in steps))


def test_a_part_expects_a_resumed_run_to_take_only_the_steps_ahead_of_it(tmp_path: Path):
    """`--stop-after`: a run stopped at step 18,000 of 24,000 resumes from its checkpoint, so a part
    with room for a quarter of a run starts it, and still not a run that has not started."""
    import time

    import optuna

    from sweeps.optuna_api import queue_retry
    from tables.policy import TablePolicy

    study = optuna.create_study()
    for seed in (1, 2):
        study.enqueue_trial({}, user_attrs={"row": "base", "run_dir": f"t/base-s{seed}"})
    stopped = study.ask()
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)
    queue_retry(study, study.trials[stopped.number])
    fresh, copy = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    stopped_at(tmp_path / "t" / "base-s1", 100, 18000)

    part = TablePolicy(str(tmp_path), time.time() + 1500, {"base": 4000.0})
    assert part.ahead(copy) == 0.25 and part.expected_s(copy) == 1000.0
    assert part.ahead(fresh) == 1.0 and part.expected_s(fresh) == 4000.0
    assert part.takes(copy) and not part.takes(fresh)
    elsewhere = TablePolicy(str(tmp_path / "elsewhere"), time.time() + 1500, {"base": 4000.0})
    assert elsewhere.ahead(copy) == 1.0  # not on this machine
