"""`ablate table3 --tune` (#74): every row at its own best value of a training setting, pruned by
Optuna's successive halving among the row's candidates, beside the table at the preset's value.

The plan and its cost (the dry run), the one-line refusals, the queue's decisions on a real SQLite
study, and one tiny tuned table trained for real: killed in the middle of its search, resumed by
the same command without training a finished candidate again, and reported with each row's
choice and both verdicts.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from ablations.record import TUNE, TUNED, TunedRow, setting_label
from foundation.errors import UserError
from here import ablate_here
from sweeps.study import PRUNING
from tables.plan import make_plan, queue, queue_tuned
from test_sweeps import stopped_at, watch
from test_table3 import SMALL

TUNE_ARGS = ["--rows", "base,E", "--tune", "train.lr_scale=0.5,1,2"]


# --- the plan and its cost ------------------------------------------------------------------

def test_the_dry_run_prints_the_tuning_plan_and_its_cost_beside_the_untuned_tables(capfd):
    """Issue #74's command: the untuned plan as before, then the tuning's: each row's own value and
    candidates, its first rung, a candidate's cost trained through and stopped there, and the sums
    beside the untuned table's, by the estimate's own numbers."""
    from tables.cost import describe, estimate

    result = ablate_here(capfd, "table3", "--preset", "demo", *TUNE_ARGS, "--dry-run")
    assert result.returncode == 0, result.stderr
    plan = make_plan("demo", "sqlite:///unused.db", "runs", [], rows="base,E", tune_values=["train.lr_scale=0.5,1,2"])
    untuned, tuning = result.stdout.split("\n\nTuning ")
    assert untuned.rstrip("\n") == describe(plan)  # the untuned plan is the same as without --tune
    assert tuning.startswith("train.lr_scale on seed 1: each row tries its own value and the listed ones")
    for row in ("base", "E"):
        assert any(line.split()[:8] == [row, "lr_scale", "0.5", "0.5", "|", "1", "|", "2"] and "250 of 500" in line
                   for line in tuning.splitlines()), tuning
    table, rate = estimate(plan)
    full, overhead = table["hours/run"] * 60, rate.overhead_s / 60  # minutes
    stopped = (full - overhead) * 250 / 500 + overhead
    untuned_min, planned, most = full.sum(), (full + 2 * stopped).sum(), 3 * full.sum()
    assert (f"Untuned table: 2 runs, about {untuned_min:.1f} device-minutes. Tuned table: 6 candidates (2 of them the "
            f"untuned table's runs on seed 1) and up to 0 runs of other seeds: about {planned:.1f} device-minutes as "
            f"planned") in tuning
    assert f"{planned / untuned_min:.2f} x the untuned table's; at most {most:.1f} (nothing pruned), 3.00 x." in tuning


def test_the_cpu_presets_tuned_table_fits_twice_the_untuned_ones_compute_even_unpruned(capfd):
    """The issue's target, at three candidates a row: the tuned table (its candidates, then the
    chosen values' other seeds) costs at most 2x the untuned one, pruned or not, on the cpu preset
    (three seeds, one for the rows far from base in the paper)."""
    from tables.cost import describe_tuning

    plan = make_plan("cpu", "sqlite:///unused.db", "runs", [], tune_values=["train.lr_scale=0.25,0.5,1"])
    text = describe_tuning(plan)
    planned, most = map(float, re.search(r"([\d.]+) x the untuned table's; at most [\d.]+ \(nothing pruned\), "
                                         r"([\d.]+) x\.", text).groups())
    assert 1 < planned < most < 2, text


def test_a_part_expects_a_candidate_to_end_at_its_first_rung_and_every_other_run_to_train_through(tmp_path):
    """`--stop-after` on a tuned table: a candidate not yet started is expected to take its row's run
    up to its first rung (a quarter here), where the plan expects it to stop, so parts shorter than
    a whole run still try candidates; the row's own run and its other seeds, whole runs."""
    from tables.cost import run_seconds
    from tables.policy import TablePolicy

    plan = make_plan("cpu", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), [], rows="base", seeds="1,2",
                     tune_values=["train.lr_scale=1"], tune_budget=0.25)
    seconds = run_seconds(plan, 2, None)
    assert seconds["base+lr_scale1"] == pytest.approx(seconds["base"] / 4) and len(seconds) == 2
    study, _ = queue(plan)
    policy = TablePolicy(plan.runs_dir, time.time() + seconds["base"] / 2, seconds)
    expected = {(t.user_attrs["seed"], TUNE in t.user_attrs): policy.expected_s(t)
                for t in study.get_trials(states=(TrialState.WAITING,))}
    assert expected == {(1, False): seconds["base"], (2, False): seconds["base"],
                        (1, True): pytest.approx(seconds["base"] / 4)}
    (candidate,) = [t for t in study.get_trials(states=(TrialState.WAITING,)) if TUNE in t.user_attrs]
    assert policy.takes(candidate)
    # stopped at step 1,200 of 24,000 and queued again (a retry copy): to its rung at 6,000, a fifth of the run
    from sweeps.optuna_api import queue_retry

    running = study.ask()  # the worker's claim takes the oldest waiting trial: the row's own first
    while TUNE not in running.user_attrs:
        study.tell(running, 30.0)
        running = study.ask()
    study.tell(running, state=TrialState.FAIL)
    queue_retry(study, study.trials[running.number])
    (copy,) = [t for t in study.get_trials(states=(TrialState.WAITING,)) if TUNE in t.user_attrs]
    stopped_at(tmp_path / "runs" / copy.user_attrs["run_dir"], 1200)
    assert policy.expected_s(copy) == pytest.approx(seconds["base"] * (0.25 - 0.05))
    # the chosen value's other seed (no pruning): a whole run, never a candidate's part
    study.enqueue_trial({}, user_attrs={"row": "base", "seed": 2, TUNE: {"train.lr_scale": 1.0}})
    (other,) = [t for t in study.get_trials(states=(TrialState.WAITING,)) if t.user_attrs.get("seed") == 2
                and TUNE in t.user_attrs]
    assert policy.expected_s(other) == seconds["base"]


@pytest.mark.parametrize("args, message", [
    (["--tune", "train.max_steps=1,2"], "--tune train.max_steps=1,2: train.max_steps cannot be tuned: a row sets its "
                                        "steps with train_steps"),
    (["--tune", "dropout=0,0.1"], "model.dropout cannot be tuned: a tuning tries training settings (train.*)"),
    (["--tune", "lr_scale=1,1"], "--tune lr_scale=1,1: a value is listed twice"),
    (["--tune", "lr_scale=0.5,-1"], "--tune train.lr_scale=-1: row 'base' (preset tiny): train.lr_scale must be positive"),
    (["--tune", "lr_scale"], "--tune takes KEY=V1,V2,... (e.g. train.lr_scale=0.5,1,2); got 'lr_scale'"),
    (["--tune", "lr_scale=1,2", "--tune", "train.lr_scale=3"], "train.lr_scale cannot be tuned: another --tune tunes it"),
    (["--tune-budget", "0.5"], "--tune-budget sets when a tuning's candidates first compete; give --tune too"),
    (["--tune", "lr_scale=1,2", "--tune-budget", "1.5"], "--tune-budget is a share of a row's steps, more than 0 and at"),
    (["--spec", "ablations/modifications.yaml", "--rows", "pre_ln_nowarm", "--tune", "warmup_steps=1,2"],
     "--tune train.warmup_steps: row pre_ln_nowarm sets it itself (it is what the row changes)"),
])
def test_a_tuning_that_cannot_be_run_is_one_line_before_anything_is_written(tmp_path, capfd, args, message):
    result = ablate_here(capfd, "table3", "--storage", f"sqlite:///{tmp_path}/t.db", "--runs-dir", str(tmp_path / "runs"),
                         *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
    assert not list(tmp_path.iterdir())


# --- the queue's decisions --------------------------------------------------------------------

def finish(study: optuna.Study, how: dict[str, tuple[str, float]]) -> None:
    """Every queued trial ended as a worker would end it (here by Optuna's own calls, not trained):
    `how` gives, by its run directory's name, "complete" with its final dev PPL or "pruned" at step
    5 with its dev PPL there."""
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = study.ask()
        state, ppl = how[trial.user_attrs["run_dir"].split("/")[-1]]
        trial.report(ppl + 1.0, 5)
        if state == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.report(ppl, 10)
            study.tell(trial, ppl)


def test_the_queue_tries_each_rows_candidates_decides_once_and_trains_the_chosen_values_other_seeds(tmp_path):
    """base and E with seeds 1 and 2, lr_scale 0.5 (their own), 1 and 2 tried on seed 1. The row's
    own run on seed 1 is its reference candidate; the others are tuned runs of their own, in their
    own run directories, each in its row's cohort. Once every candidate has ended, each row's choice
    is recorded (lowest final dev PPL among the complete ones), and a row that chose another value
    trains its seed 2 there; a pruned candidate is never queued again, and the record stays as it
    was decided. A later sitting tuning otherwise is refused."""
    plan = make_plan("tiny", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), ["train.max_steps=10"],
                     rows="base,E", seeds="1,2", tune_values=["train.lr_scale=0.5,1,2"])
    assert {name for name, _ in plan.run_dirs()} == {"base", "E", "base+lr_scale1", "base+lr_scale2", "E+lr_scale1",
                                                     "E+lr_scale2"}
    study, queued = queue(plan)
    assert queued == 8  # 4 untuned runs, 2 candidates a row
    attrs = {t.user_attrs["run_dir"].split("/")[-1]: t.user_attrs for t in study.trials}
    assert attrs["E-s1"][PRUNING] == {"pruner": "halving", "min_resource": 400, "cohort": "tune:E", "reference": True}
    assert PRUNING not in attrs["E-s2"] and TUNE not in attrs["E-s1"]
    assert attrs["E+lr_scale2-s1"][TUNE] == {"train.lr_scale": 2.0}
    assert attrs["E+lr_scale2-s1"][PRUNING] == {**attrs["E-s1"][PRUNING], "reference": False}
    assert study.user_attrs["tuning"] == {"values": {"train.lr_scale": [0.5, 1.0, 2.0]}, "seed": 1, "budget": None}

    finish(study, {"base-s1": ("complete", 30.0), "base-s2": ("complete", 31.0), "E-s1": ("complete", 29.0),
                   "E-s2": ("complete", 30.0), "base+lr_scale1-s1": ("complete", 25.0),
                   "base+lr_scale2-s1": ("pruned", 40.0), "E+lr_scale1-s1": ("pruned", 35.0),
                   "E+lr_scale2-s1": ("pruned", 36.0)})
    storage = optuna.storages.RDBStorage(plan.storage)
    assert queue_tuned(plan, study, storage, candidates=False) == 1  # base's seed 2 at lr_scale 1
    base, e = (TunedRow.model_validate(study.user_attrs[TUNED + row]) for row in ("base", "E"))
    assert base.chosen == {"train.lr_scale": 1.0} and e.chosen == e.own == {"train.lr_scale": 0.5}
    assert [(setting_label(c.setting), c.state, c.ppl, c.step) for c in e.candidates] == [
        ("lr_scale 0.5", "complete", 29.0, 10), ("lr_scale 1", "pruned", 36.0, 5), ("lr_scale 2", "pruned", 37.0, 5)]
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    assert waiting.user_attrs["run_dir"] == "table3-tiny/base+lr_scale1-s2" and PRUNING not in waiting.user_attrs
    assert waiting.user_attrs["enqueued_overrides"] == ["train.seed=2", "train.lr_scale=1.0"]

    finish(study, {"base+lr_scale1-s2": ("complete", 26.0)})
    before = study.user_attrs
    assert queue(plan)[1] == 0  # nothing again: complete, pruned, decided
    assert study.user_attrs == before
    with pytest.raises(UserError, match=r"is a Table 3 tuned otherwise .* Use another --study"):
        queue(replace(plan, tuning=replace(plan.tuning, budget=0.5)))


def test_a_row_finished_before_its_table_was_tuned_is_replayed_into_its_cohort(tmp_path):
    """A table tuned after its runs finished (the committed cpu table, say): each row's own run on
    the tuning seed never reported to a pruner, so it is replayed once into the row's cohort, its
    first-rung value recorded by the pruner itself; the candidates are then measured against it."""
    settings = ["train.max_steps=10", "train.val_check_interval=5"]
    plan = make_plan("tiny", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), settings, rows="base", seeds="1")
    study, _ = queue(plan)
    untuned = study.ask()  # ended as a run without a pruner ends: nothing reported, its curve in its results
    untuned.set_user_attr("dev_ppl_curve", [[4, 31.0], [9, 30.0]])  # steps as logged: the 5th and the 10th
    study.tell(untuned, 30.0)
    tuned = make_plan("tiny", plan.storage, plan.runs_dir, settings, rows="base", tune_values=["lr_scale=1"])
    for _ in range(2):  # once only
        queue(tuned)
    (stand_in,) = [t for t in study.get_trials() if "replays" in t.user_attrs]
    assert stand_in.user_attrs["replays"] == 0 and stand_in.user_attrs[PRUNING]["cohort"] == "tune:base"
    assert stand_in.system_attrs["completed_rung_0"] == 31.0 and stand_in.value == 30.0
    assert stand_in.intermediate_values == {5: 31.0, 10: 30.0}  # the steps a pruned run reports at


# --- a tuned table trained for real -----------------------------------------------------------

# Their own lr_scale, 0.02, is far too small for 10 steps: 0.5, tried first, goes on past the first
# rung (dev PPL about 250 at step 5, against about 600) and is chosen; 0.1 (about 340) is pruned there.
TINY = [*SMALL, "train.warmup_steps=2", "train.lr_scale=0.02", "eval.decode_test=false", "--rows", "base,E",
        "--tune", "train.lr_scale=0.5,0.1", "--workers", "1"]


def tuned_args(tmp: Path, *extra: str) -> list[str]:
    return ["table3", "--preset", "tiny", "--storage", f"sqlite:///{tmp}/t3.db", "--runs-dir", str(tmp / "runs"),
            "--archive", str(tmp / "archive"), *TINY, *extra]


def tuned_trials(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if TUNE in t.user_attrs]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    """base and E, lr_scale 0.02 (their own), 0.5 and 0.1 on seed 1, one worker. The first sitting
    is SIGKILLed (`ablate table3`, its worker and training with it) once a candidate has ended and
    another is training; the same command then resumes it to the end (in this process, its worker
    and trials in processes of their own), with a part's end far off (--stop-after) and the archive
    kept, and writes the report."""
    from ablate.cli import main

    tmp = tmp_path_factory.mktemp("tuned")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(tmp / "first.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ablate", *tuned_args(tmp, "--no-report")], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    try:
        polled = watch(lambda: optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{tmp}/t3.db"))
        deadline, ended = time.time() + 600, []
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
            try:
                trials = tuned_trials(polled())
            except Exception:  # noqa: BLE001 (the study is not there yet)
                continue
            ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
            if ended and any(t.state == TrialState.RUNNING for t in trials):
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, (tmp / "first.log").read_text()[-3000:]
    time.sleep(1.0)  # the worker and its training die with their parent
    # the report of the search as the kill left it: a candidate ended, no row decided yet
    partial = io.StringIO()
    with contextlib.redirect_stdout(partial), contextlib.redirect_stderr(partial):
        partial_code = main(["report", "--storage", f"sqlite:///{tmp}/t3.db", "--out", str(tmp / "partial")])
    logs = {t.number: tmp / "runs" / t.user_attrs["run_dir"] / "trial.log" for t in ended}
    before = {number: path.stat().st_mtime_ns for number, path in logs.items()}
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(tuned_args(tmp, "--stop-after", "2h"))
    assert code == 0, buffer.getvalue()[-3000:]
    return {"tmp": tmp, "ended": [t.number for t in ended], "before": before, "logs": logs, "output": buffer.getvalue(),
            "partial": (partial_code, partial.getvalue())}


def study_of(tmp: Path) -> optuna.Study:
    return optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{tmp}/t3.db")


def test_a_killed_tuning_search_resumes_and_trains_no_finished_candidate_again(tuned):
    study = study_of(tuned["tmp"])
    trials = study.get_trials()
    for number in tuned["ended"]:  # ended before the kill: the only trial of its run directory, never run again
        place = trials[number].user_attrs["run_dir"]
        assert [t.number for t in trials if t.user_attrs.get("run_dir") == place] == [number]
        assert tuned["logs"][number].stat().st_mtime_ns == tuned["before"][number]
    # the candidate killed while training was retried in its run directory, and ended
    retried = [t for t in tuned_trials(trials) if t.user_attrs.get("retry_of") is not None]
    assert len(retried) == 1 and retried[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert trials[retried[0].user_attrs["retry_of"]].user_attrs["run_dir"] == retried[0].user_attrs["run_dir"]
    # each row's every candidate ended once, and the row is decided
    ended = [(t.user_attrs["row"], setting_label(t.user_attrs[TUNE])) for t in tuned_trials(trials)
             if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert sorted(ended) == sorted((row, f"lr_scale {v}") for row in ("base", "E") for v in ("0.5", "0.1"))
    assert all(TUNED + row in study.user_attrs for row in ("base", "E"))
    # the archive keeps the tuned runs as it keeps the table's own
    archive = tuned["tmp"] / "archive"
    for t in tuned_trials(trials):
        name = t.user_attrs["run_dir"].split("/")[-1]
        assert (archive / name / "config.yaml").is_file(), name
        assert (archive / name / "results.json").is_file() == (t.state == TrialState.COMPLETE), name


def test_a_report_in_the_middle_of_a_search_says_the_tuning_is_in_progress(tuned):
    """`ablate report` on the study the kill left (no row decided): the untuned table and a line
    saying which rows' tuning has not finished (it had raised a KeyError in the tuning's cost)."""
    code, output = tuned["partial"]
    assert code == 0, output[-3000:]
    md = (tuned["tmp"] / "partial" / "table3.md").read_text()
    assert "Tuning in progress: the tuning of base, E has not finished" in md
    assert "## Each row at its own best value" not in md and not (tuned["tmp"] / "partial" / "tuning.csv").exists()


def test_the_tuned_report_shows_each_rows_choice_its_candidates_and_both_verdicts(tuned):
    study = study_of(tuned["tmp"])
    report = tuned["tmp"] / "runs" / "table3-tiny" / "report"
    table = pd.read_csv(report / "tuning.csv", dtype=str, keep_default_na=False).set_index("row")
    assert list(table.index) == ["base", "E"]
    for row in ("base", "E"):
        record = TunedRow.model_validate(study.user_attrs[TUNED + row])
        assert table.loc[row, "chosen"] == setting_label(record.chosen)
        assert [table.loc[row, setting_label(c.setting)] for c in record.candidates] == \
            [c.outcome() for c in record.candidates]
    assert list(table["chosen"]) == ["lr_scale 0.5", "lr_scale 0.5"] and list(table["lr_scale 0.1"].str[:16]) == \
        ["pruned at step 5"] * 2
    assert list(table["at the edge"]) == ["highest tried"] * 2  # 0.5 of 0.02 (their own), 0.1 and 0.5
    # each verdict from its own table's runs (one seed: the sign of the difference alone): the rows' own
    # runs on seed 1, then the candidates chosen
    final = {(t.user_attrs["row"], t.user_attrs.get(TUNE, {}).get("train.lr_scale", 0.02)): t.value
             for t in study.get_trials(states=(TrialState.COMPLETE,)) if "row" in t.user_attrs}
    own, best = table.loc["E", "verdict at its own value"], table.loc["E", "verdict at its best value"]
    for verdict, value in ((own, 0.02), (best, 0.5)):
        assert verdict == ("higher" if final["E", value] > final["base", value] else "lower") + " PPL, no interval"
    assert table.loc["E", "depends on tuning"] == ("yes" if own != best else "")
    moved = int(own != best)
    md = (report / "table3.md").read_text()
    headline = md.split("## What this table says\n\n- ")[1].splitlines()[0]
    assert headline.startswith("Beyond noise, ")
    assert headline.endswith(f"; tuned, each row at its own best lr_scale, the verdict of {moved} of the 1 rows "
                             f"depends on tuning{' (E)' if moved else ''}.")
    section = md.split("## Each row at its own best value\n\n")[1]
    assert section.startswith("Tuning (train.lr_scale over 0.5, 0.1; each row's own value too): every row, "
                              "base included, tried each value on seed 1;")
    assert "The choice used the dev set this table reports, not a held-out one." in section
    assert "The tuned table's seed-1 run is the winning candidate itself" in section
    assert "| E " in section.split("## Figures")[0]
    assert (report / "figures" / "tuning_E.png").read_bytes().startswith(b"\x89PNG")
    assert 'id="tuning-table"' in (report / "report.html").read_text()
    assert "Tuning cost, in training FLOPs" in md
