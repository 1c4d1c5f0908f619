"""`ablate table3 --dry-run`: what a table will cost, from the preset's measured throughput, with
nothing run or written (the `gpu` preset itself: tests/test_config.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from ablate.cli import main
from ablations.resolve import resolve
from ablations.spec import load_preset, load_spec, one_seed_rows
from lightning_modules.config import count_parameters
from foundation.io import atomic_write_json
from lightning_modules.run.results import RunResult
from tables.plan import Table3Plan, make_plan, queue


def dry_run(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """`ablate table3 --dry-run` as a process (what a user runs; the first test's)."""
    return subprocess.run([sys.executable, "-m", "ablate", *dry_run_args(tmp, *args)],
                          capture_output=True, text=True, cwd=tmp, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def dry_run_here(tmp: Path, capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """The same command through `ablate.cli.main` in this process: the same code without a new
    interpreter importing torch (about half of a dry run's 10-15 s in the suite)."""
    capsys.readouterr()
    with contextlib.chdir(tmp):
        code = main(dry_run_args(tmp, *args))
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, printed.out, printed.err)


def dry_run_args(tmp: Path, *args: str) -> list[str]:
    return ["table3", "--dry-run", "--storage", f"sqlite:///{tmp}/t.db", "--runs-dir", str(tmp / "runs"), *args]


def parameters(cfg) -> int:
    return count_parameters(cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id))


def expected_seconds(preset: str, row: str) -> float:
    """One run of `row` at base's FLOP rate: its hours scale with parameters x steps x tokens per
    step, at the preset's measured base-row rate, plus the per-run overhead."""
    cost = load_preset(preset)["table3"]["cost"]
    cfg = resolve(preset, row)
    return (parameters(cfg) / parameters(resolve(preset, "base"))) * cfg.train.max_steps \
        * cfg.data.max_tokens / cost["base_tokens_per_s"] + cost["overhead_s"]


def row_line(stdout: str, row: str) -> list[str]:
    return next(line.split() for line in stdout.splitlines() if line.split()[:1] == [row])


@pytest.mark.parametrize("preset", ["gpu", "cpu"])
def test_dry_run_prints_every_row_and_total_from_the_measured_rate_and_writes_nothing(preset, tmp_path, capsys):
    """The gpu preset's plan as a process (`python -m ablate`, what a user runs), the cpu preset's
    through the same `main` in this process."""
    result = dry_run(tmp_path, "--preset", preset) if preset == "gpu" else dry_run_here(tmp_path, capsys, "--preset", preset)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []  # no database, no run directory
    assert "where the table stands" not in result.stdout  # nothing has run
    cost = load_preset(preset)["table3"]["cost"]
    seeds = load_preset(preset)["table3"]["seeds"]
    single = one_seed_rows(preset, load_spec())
    assert single == ["C1", "C4", "D1", "D4", "big"]  # paper PPL >= 10% off base's 4.92
    for row in ("base", "A1", "B1", "C5", "D1", "E", "big"):
        cfg = resolve(preset, row)
        line = row_line(result.stdout, row)
        assert int(line[1].replace(",", "")) == parameters(cfg)
        assert int(line[2].replace(",", "")) == cfg.train.max_steps
        seconds = expected_seconds(preset, row)
        assert float(line[5]) == pytest.approx(seconds / 3600, abs=0.006)
        n_seeds = 1 if row in single else len(seeds)
        assert int(line[6]) == n_seeds
        assert float(line[7]) == pytest.approx(n_seeds * seconds / 3600, abs=0.006)
    assert "20 rows x 3 seeds (1 for C1, C4, D1, D4, big), 50 runs" in result.stdout
    assert cost["device"] in result.stdout
    big = resolve(preset, "big")
    assert big.train.max_steps == 3 * resolve(preset, "base").train.max_steps  # 300K vs 100K


def test_every_preset_is_costed_and_says_which_rates_are_measured_and_which_derived(tmp_path, capsys):
    """The paper's own preset (and tiny) have no measurement of their own: their rate is the
    measured preset's FLOP rate carried over, said so, and the hours follow from it."""
    from ablations.spec import preset_names
    from tables.schedule import parameters

    for preset in preset_names():
        result = dry_run_here(tmp_path, capsys, "--preset", preset, "--rows", "base,big")
        assert result.returncode == 0, (preset, result.stderr)
        cost = load_preset(preset)["table3"]["cost"]
        source = cost.get("derived_from")
        assert (f"derived from the {source} preset's measured rate" in result.stdout) == bool(source)
        if source:
            measured = load_preset(source)["table3"]["cost"]
            flop_rate = 6 * parameters(resolve(source, "base")) * measured["base_tokens_per_s"]
            rate = float(result.stdout.split("base row at ")[1].split(" target tokens/s")[0].replace(",", ""))
            assert 6 * parameters(resolve(preset, "base")) * rate == pytest.approx(flop_rate, rel=1e-3)
            assert measured["device"] in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_an_eight_gpu_plan_needs_no_gpu_and_replays_the_launchers_order(tmp_path, capsys):
    """`--gpus 0,...,7 --dry-run` on this CPU machine: the wall-clock of the queue's own order on 8
    workers, between the bounds max(total / 8, longest run) and 4/3 of it; `--machines 2` is 16
    workers; a real run still needs the GPUs. (In this process: what the commands print and
    refuse is the point, not a process of their own.)"""
    result = dry_run_here(tmp_path, capsys, "--preset", "gpu", "--gpus", "0,1,2,3,4,5,6,7")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    total = float(text.split("runs: about ")[1].split(" device-hours")[0])
    wall = float(text.split("longest first as the launcher queues them: about ")[1].split(" hours")[0])
    longest = float(text.split("the longest run, big seed 1, ")[1].split(")")[0])
    assert "On 8 workers (GPUs 0, ..., 7, one worker each)" in text
    bound = max(total / 8, longest)
    assert bound - 0.1 <= wall <= 4 / 3 * bound + 0.1
    assert "checkpoints up to" in text and "GB per device for training (big" in text
    two = dry_run_here(tmp_path, capsys, "--preset", "gpu", "--gpus", "0,1,2,3,4,5,6,7", "--machines", "2")
    assert two.returncode == 0 and "On 16 workers" in two.stdout, two.stderr
    capsys.readouterr()
    with contextlib.chdir(tmp_path):
        code = main(["table3", *dry_run_args(tmp_path)[2:], "--gpus", "0,1"])
    assert code == 2 and "no CUDA GPU is visible" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_longest_first_and_its_wall_clock():
    from tables.schedule import longest_first, wall_clock

    costs = {"a": 1.0, "b": 5.0, "c": 3.0, "d": 3.0, "e": 9.0}
    assert longest_first(costs) == ["e", "b", "c", "d", "a"]  # ties keep their order
    assert longest_first(costs, first=["a"]) == ["a", "e", "b", "c", "d"]
    assert wall_clock([9, 5, 3, 3, 1], workers=2) == 11  # 9+1 | 5+3+3
    assert wall_clock([9, 5, 3, 3, 1], workers=8) == 9  # the longest run
    assert wall_clock([1, 3, 3, 5, 9], workers=2) == 13  # shortest first: 1+3+9 | 3+5


def test_the_queue_holds_the_runs_in_the_plans_order(tmp_path):
    """One scheduling function: the launcher's queue is the order the dry run replays."""
    from tables.plan import start_order

    plan = make_plan("gpu", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), [], rows="base,C,big")
    study, queued = queue(plan)
    waiting = [(t.user_attrs["row"], t.user_attrs["seed"]) for t in sorted(study.get_trials(), key=lambda t: t.number)]
    assert queued == len(plan.runs())
    assert waiting == start_order({run: plan.config_of(*run) for run in plan.runs()})
    assert waiting[0] == ("big", 1) and waiting[1][0] == "C5"


def test_a_step_keeps_its_tokens_on_any_number_of_devices_and_device_hours_count_them(tmp_path, capsys):
    """`data.max_tokens` is one optimizer step's tokens, shared by the devices a run trains on and
    its accumulated batches (#70: `--devices-per-run 2` had doubled the paper's 25,000 to 50,000).
    The plan prints that step and the device-hours of what trains: a run's hours times its devices."""
    from tables.schedule import tokens_per_step
    from lightning_modules.config import step_batches
    from lightning_modules.run.preflight import estimate_memory_gb

    def config(*overrides: str):
        return resolve("gpu", "base", None, list(overrides))

    assert tokens_per_step(config()) == 25_000 and step_batches(config().train) == 1  # devices auto: one
    split = config("train.devices=0,1,3", "train.accumulate_grad_batches=4")
    assert tokens_per_step(split) == 25_000 and step_batches(split.train) == 12
    assert tokens_per_step(config("train.devices=2", "train.num_nodes=2")) == 25_000
    states, activations = estimate_memory_gb(config())  # a device holds its share of the step
    assert estimate_memory_gb(config("train.devices=2")) == pytest.approx((states, activations / 2))

    one = dry_run_here(tmp_path, capsys, "--preset", "paper", "--rows", "base", "--seeds", "1", "--gpus", "0,1")
    two = dry_run_here(tmp_path, capsys, "--preset", "paper", "--rows", "base", "--seeds", "1", "--gpus", "0,1",
                       "--devices-per-run", "2")
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    head = two.stdout.splitlines()[0].split()
    assert "devices/run" in head and "devices/run" not in one.stdout.splitlines()[0]
    line = dict(zip(head, row_line(two.stdout, "base")[1:]))
    alone = dict(zip(one.stdout.splitlines()[0].split(), row_line(one.stdout, "base")[1:]))
    assert line["tokens/step"] == alone["tokens/step"] == "25,000"
    hours_one = float(alone["hours"])
    assert float(line["hours"]) == pytest.approx(2 * float(line["hours/run"]), abs=0.02)
    assert float(line["hours/run"]) < hours_one < float(line["hours"])  # faster a run, more device time


def _finished(run: Path, tokens_per_s: float) -> None:
    run.mkdir(parents=True)
    atomic_write_json(run / "results.json", RunResult(status="complete", tokens_per_s=tokens_per_s).to_json())


def _logged(log_dir: Path, name: str, steps: range, rates: list[float] | None = None) -> None:
    """Training rows at `steps`; with `rates`, each row's window rate (target tokens per second)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    if rates is None:
        lines = ["epoch,step,train/loss"] + [f"0,{step},4.0" for step in steps]
    else:
        lines = ["epoch,step,train/loss,train/tokens_per_s"]
        lines += [f"0,{step},4.0,{rate}" for step, rate in zip(steps, rates, strict=True)]
    (log_dir / name).write_text("\n".join(lines) + "\n")


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_dry_run_of_a_table_under_way_counts_what_is_finished_and_the_hours_left(tmp_path, capsys):
    """Finished runs in the run directories, the archive and the study (another machine's);
    unfinished ones by their last logged step, every attempt joined; the finished runs' own
    rate beside the preset's; and still nothing written."""
    runs, archive = tmp_path / "runs" / "table3-cpu", tmp_path / "archive"
    plan = make_plan("cpu", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), [])
    study, _ = queue(plan)  # the table's study: its identity and every run queued
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=27.0,
                                              user_attrs={"row": "C3", "seed": 1}))
    rate = load_preset("cpu")["table3"]["cost"]["base_tokens_per_s"]
    _finished(runs / "base-s1", tokens_per_s=rate / 2 / 2)  # half the rate of one worker of two
    _finished(archive / "base-s2", tokens_per_s=rate / 2)  # the whole rate
    # big: resumed once from step 10,000; its first attempt's rows after that were redone
    _logged(runs / "big-s1" / "logs", "metrics.part-1.until-10000.csv", range(20, 12_001, 20))
    _logged(runs / "big-s1" / "logs", "metrics.csv", range(10_020, 36_001, 20))
    _logged(archive / "E-s1" / "logs", "metrics.csv", range(20, 6_001, 20))
    (archive / "D1-s1").mkdir()  # a NaN loss: it stays failed, so nothing of it is left to run
    atomic_write_json(archive / "D1-s1" / "results.json",
                      RunResult(status="failed", reason="loss is NaN at step 700").to_json())
    _logged(archive / "D1-s1" / "logs", "metrics.csv", range(20, 701, 20))
    before = _tree(tmp_path)

    result = dry_run_here(tmp_path, capsys, "--preset", "cpu", "--workers", "2", "--archive", str(archive))
    assert result.returncode == 0, result.stderr
    assert _tree(tmp_path) == before
    estimate_hours = {row: float(row_line(result.stdout, row)[5]) for row in ("base", "C3", "E", "big")}
    standing = result.stdout.split("where the table stands:")[1]
    left = {}
    for row, planned, done, fraction_left in (("base", 3, 2, 1.0), ("C3", 3, 1, 2.0), ("E", 3, 0, 2.75),
                                              ("big", 1, 0, 0.5), ("A1", 3, 0, 3.0), ("D1", 1, 0, 0.0)):
        line = row_line(standing, row)
        assert (int(line[1]), int(line[2])) == (planned, done), line
        left[row] = float(line[3])
        if row in estimate_hours:
            assert left[row] == pytest.approx(fraction_left * estimate_hours[row], abs=0.02)
    assert left["D1"] == 0.0
    assert ("3 of 50 runs finished, 2 under way (E seed 1 at step 6,000 of 24,000; "
            "big seed 1 at step 36,000 of 72,000), 1 failed and left failed (D1 seed 1)") in standing
    total = float(standing.split("about ")[1].split(" device-hours")[0])
    assert "the longest run left, big seed 1," in standing
    # base seeds 1 and 2 trained at 50% and 100% of the rate per worker; C3 (the study's) has no rate
    assert "trained at 75% of that rate" in standing
    at_theirs = float(standing.split("at their rate, about ")[1].split(" device-hours")[0])
    assert at_theirs == pytest.approx(total / 0.75, abs=0.15)  # both printed to 0.1
    at_own = float(standing.split("at each row's own rate (the median elsewhere), about ")[1].split(".\n")[0]
                   .rstrip("."))
    assert at_own == pytest.approx(at_theirs, abs=0.1)  # only base measured: its own share is the median


def test_runs_under_way_show_the_tables_rate_before_any_run_has_finished(tmp_path, capsys):
    """Nothing finished yet: a run under way counts with the median of its logged window rates
    (its first window held start-up and compilation); one with fewer than 3 windows, or with logs
    written before the rate was logged, counts with none."""
    runs = tmp_path / "runs" / "table3-cpu"
    per_worker = load_preset("cpu")["table3"]["cost"]["base_tokens_per_s"] / 2
    _logged(runs / "base-s1" / "logs", "metrics.csv", range(20, 101, 20),
            rates=[0.05 * per_worker, 0.5 * per_worker, 0.6 * per_worker, 0.5 * per_worker,
                   0.4 * per_worker])  # median: half
    _logged(runs / "base-s2" / "logs", "metrics.csv", range(20, 41, 20),
            rates=[2.0 * per_worker, 2.0 * per_worker])  # too few windows
    _logged(runs / "C3-s1" / "logs", "metrics.csv", range(20, 201, 20))  # no rate column
    result = dry_run_here(tmp_path, capsys, "--preset", "cpu", "--workers", "2")
    assert result.returncode == 0, result.stderr
    standing = result.stdout.split("where the table stands:")[1]
    assert "0 of 50 runs finished, 3 under way" in standing
    assert "This table's runs trained at 50% of that rate (median over 1 run, finished or under way" in standing
    total = float(standing.split("about ")[1].split(" device-hours")[0])
    at_theirs = float(standing.split("at their rate, about ")[1].split(" device-hours")[0])
    assert at_theirs == pytest.approx(total / 0.5, abs=0.15)


def test_a_table_of_under_an_hour_is_estimated_and_followed_in_minutes(tmp_path, capsys):
    """The demo's ten runs: each row's minutes from its parameters and the preset's measured rate,
    the total in device-minutes; once base has finished and A1 is half way, the minutes left."""
    cost = load_preset("demo")["table3"]["cost"]
    result = dry_run_here(tmp_path, capsys, "--preset", "demo")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split()[-5:] == ["min/run", "seeds", "min", "memory", "GB"]
    minutes = {}
    for row in load_preset("demo")["table3"]["rows"]:
        minutes[row] = float(row_line(result.stdout, row)[5])
        assert minutes[row] == pytest.approx(expected_seconds("demo", row) / 60, abs=0.006)
    total = float(result.stdout.split("10 runs: about ")[1].split(" device-minutes on")[0])
    assert total == pytest.approx(sum(minutes.values()), abs=0.06) and total < 60

    runs = tmp_path / "runs" / "table3-demo"
    _finished(runs / "base-s1", tokens_per_s=cost["base_tokens_per_s"] / 2)
    _logged(runs / "A1-s1" / "logs", "metrics.csv", range(20, 251, 20))  # to step 240 of 500
    standing = dry_run_here(tmp_path, capsys, "--preset", "demo").stdout.split("where the table stands:")[1]
    assert standing.splitlines()[1].split() == ["planned", "finished", "min", "left"]
    assert float(row_line(standing, "base")[3]) == 0.0
    assert float(row_line(standing, "A1")[3]) == pytest.approx(minutes["A1"] * (1 - 240 / 500), abs=0.006)
    left = float(standing.split("1 under way (A1 seed 1 at step 240 of 500); about ")[1]
                 .split(" device-minutes left")[0])
    assert left == pytest.approx(total - minutes["base"] - minutes["A1"] * 240 / 500, abs=0.06)


def test_dry_run_with_redo_counts_the_runs_it_would_train_again_from_the_start(tmp_path, capsys):
    """`--redo C3` on a table whose C3 seeds are complete in the study: they count as not started
    (3 runs' hours left), until the redo is asked for; a dry run asks for nothing."""
    plan = make_plan("cpu", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), [])
    study, _ = queue(plan)
    for row, seed in (("C3", 1), ("C3", 2), ("C3", 3), ("E", 1)):
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=27.0,
                                                  user_attrs={"row": row, "seed": seed}))
    asked = {extra: dry_run_here(tmp_path, capsys, "--preset", "cpu", *extra)
             for extra in ((), ("--redo", "C3"), ("--redo", "C"))}
    hours = float(row_line(asked[()].stdout, "C3")[7])  # its estimate, 3 seeds
    for extra, done, left in (((), 3, 0.0), (("--redo", "C3"), 0, hours), (("--redo", "C"), 0, hours)):
        result = asked[extra]
        assert result.returncode == 0, result.stderr
        line = row_line(result.stdout.split("where the table stands:")[1], "C3")
        assert (int(line[1]), int(line[2])) == (3, done) and float(line[3]) == pytest.approx(left, abs=0.02)
    assert len(study.get_trials()) == len(plan.runs()) + 4  # nothing queued by the dry runs


def test_time_left_takes_each_rows_own_measured_rate_and_the_median_for_the_rest():
    """A row slower than its FLOPs say (many narrow heads) is counted at the rate its own
    finished seeds trained at; a row with none at the median over all finished runs."""
    from tables.cost import DeviceRate
    from tables.progress import RunProgress, describe

    rate = DeviceRate("2 cores", base_tokens_per_s=1000.0, overhead_s=0.0, measured="test")
    table = pd.DataFrame({"params": [100, 100, 50], "hours/run": [1.0, 1.0, 2.0], "hours": [2.0, 2.0, 2.0]},
                         index=["base", "A4", "C1"])  # as `estimate` makes it: 2 seeds of base and A4, 1 of C1
    # per worker of 2 the preset's rate is 500 tokens/s on base's 100 parameters
    runs = [RunProgress("base", 1, True, 10, 10, tokens_per_s=500.0),  # share 1.0
            RunProgress("base", 2, True, 10, 10, tokens_per_s=400.0),  # 0.8
            RunProgress("A4", 1, True, 10, 10, tokens_per_s=200.0),  # 0.4
            RunProgress("A4", 2, False, 5, 10),  # half left: 0.5 h at the preset's rate
            RunProgress("C1", 1, False, 0, 10)]  # 2 h at the preset's rate
    text = describe(runs, table, rate, workers=2)
    assert "trained at 80% of that rate" in text  # median of 1.0, 0.8, 0.4
    assert "about 2.5 device-hours left by the rate above" in text
    assert "at their rate, about 3.1 device-hours left" in text  # 2.5 / 0.8
    # A4 at its own 0.4: 0.5 / 0.4 = 1.25; C1 at the median 0.8: 2 / 0.8 = 2.5
    assert "at each row's own rate (the median elsewhere), about 3.8." in text


def test_dry_run_refuses_a_study_of_another_table_in_one_line(tmp_path, capsys):
    gpu = Table3Plan(study="table3-cpu", storage=f"sqlite:///{tmp_path}/t.db", preset="gpu", rows=["base"],
                     seeds=[1], runs_dir=str(tmp_path / "runs"), overrides=[])
    queue(gpu)  # a study of the gpu preset's table named as the cpu table's would be
    result = dry_run_here(tmp_path, capsys, "--preset", "cpu")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "differs in its preset ('gpu' -> 'cpu'" in result.stderr
    assert "where the table stands" not in result.stdout


def test_a_plan_for_a_device_uses_its_measured_rate_or_says_it_extrapolates(tmp_path, capsys):
    """`--plan-for`: the gpu preset has its rate measured on an H100 only; planning for an H100 cites
    it as measured, for an H200 it says it extrapolates and from which device (paper too, through
    the gpu preset it derives from)."""
    measured = load_preset("gpu")["table3"]["cost"]
    h100 = dry_run_here(tmp_path, capsys, "--preset", "gpu", "--plan-for", "H100", "--rows", "base")
    assert h100.returncode == 0 and "extrapolated" not in h100.stdout and measured["device"] in h100.stdout
    for preset in ("gpu", "paper"):
        h200 = dry_run_here(tmp_path, capsys, "--preset", preset, "--plan-for", "H200", "--rows", "base")
        assert h200.returncode == 0, h200.stderr
        assert f"no rate of this preset is measured on H200: extrapolated, at the rate measured on " \
               f"{measured['device']}" in h200.stdout
    assert list(tmp_path.iterdir()) == []
