"""`ablate table3 --redo ROWS`: finished runs train again, once, and nothing they replace is lost.

Real tiny runs on the Ding corpus, a real SQLite study and archive.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from optuna.trial import TrialState

from lightning_modules.run.results import read_results
from here import ablate_here
from test_table3 import ablate, table3_args, trials


def sitting_args(tmp: Path, *extra: str) -> list[str]:
    return table3_args(tmp, "--rows", "base", "--seeds", "1,2", "--archive", str(tmp / "archive"),
                       "--report-dir", str(tmp / "report"), *extra)


def sitting(tmp: Path, *extra: str, env: dict[str, str] | None = None):
    return ablate(*sitting_args(tmp, *extra), env=env)


@pytest.mark.slow
def test_a_redo_trains_each_run_once_keeps_what_it_replaces_and_the_report_says_so(tmp_path: Path):
    first = sitting(tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    runs, archive = tmp_path / "runs" / "table3-tiny", tmp_path / "archive"
    old = {t.user_attrs["seed"]: t for t in trials(tmp_path)
           if t.state == TrialState.COMPLETE and t.user_attrs["row"] == "base"}
    old_results = {seed: read_results(runs / f"base-s{seed}") for seed in (1, 2)}

    # the redo of seed 2 is killed inside its training (SIGKILL at step 7, after its step-5 checkpoint)
    killed = sitting(tmp_path, "--redo", "base", env={"ABLATE_FAULT": "train_step@7"})
    assert killed.returncode == 1 and "not complete:" in killed.stderr
    for seed, trial in old.items():
        assert f"base seed {seed} trains again (replacing trial {trial.number}" in killed.stdout
        for place in (runs, archive):  # set aside where it was, whole
            kept = place / f"base-s{seed}.superseded-t{trial.number}"
            assert read_results(kept) == old_results[seed], kept
            assert (kept / "dev.hyp.txt").is_file()
    again = sitting(tmp_path, "--redo", "base")  # the same command resumes the redo, not a new one
    assert again.returncode == 0, again.stderr[-2000:]
    assert "trains again" not in again.stdout
    assert sorted(p.name for p in runs.glob("base-s*")) == sorted(p.name for p in archive.glob("base-s*")) == [
        "base-s1", f"base-s1.superseded-t{old[1].number}", "base-s2", f"base-s2.superseded-t{old[2].number}"]

    every = trials(tmp_path)
    complete = [t for t in every if t.state == TrialState.COMPLETE and t.user_attrs["row"] == "base"]
    assert {t.number for t in complete} >= {t.number for t in old.values()}  # still in the study
    new = {t.user_attrs["seed"]: t for t in complete if t.number not in {o.number for o in old.values()}}
    assert sorted(new) == [1, 2] and all(new[s].number > old[s].number for s in new)
    assert "Restoring states from the checkpoint" in (runs / "base-s2" / "trial.log").read_text()
    assert min(new[2].intermediate_values) > 5  # the killed redo resumed, it did not start over
    assert read_results(runs / "base-s1").ppl == new[1].user_attrs["ppl"]
    assert read_results(archive / "base-s2").ppl == new[2].user_attrs["ppl"]

    frame = pd.read_csv(tmp_path / "report" / "table3.csv", index_col="row")
    mean_of_new = sum(new[s].user_attrs["ppl"] for s in (1, 2)) / 2
    assert frame.loc["base", "ppl"] == pytest.approx(mean_of_new, abs=5e-4)  # the new runs (3 decimals in the csv)
    md = (tmp_path / "report" / "table3.md").read_text()
    for seed in (1, 2):
        assert (f"base seed {seed}: dev PPL {old[seed].user_attrs['ppl']} → {new[seed].user_attrs['ppl']}"
                in md and f"replaces {old[seed].number}, kept as base-s{seed}.superseded-t{old[seed].number})" in md)
    assert "Redo not complete" not in md

    # the same command again queues nothing: on the new machine below (its second sitting)

    # a new machine: the archive alone, a study made afresh. The study comes back from the archive
    # (its journal), the runs the redos replaced with it under their numbers, the redos are
    # adopted as they are, nothing trains, and the report names the redos as the first machine's
    # did; a second sitting adds nothing.
    shutil.rmtree(runs)
    (tmp_path / "t3.db").unlink()
    entries = sorted(p.name for p in archive.iterdir())
    counted = []
    for k in range(2):
        fresh = sitting(tmp_path, "--redo", "base")
        assert fresh.returncode == 0, fresh.stderr[-2000:]
        assert "trains again" not in fresh.stdout
        assert ("the study is back from" in fresh.stdout) == (k == 0), fresh.stdout
        counted.append(len(trials(tmp_path)))
    assert counted == [len(every)] * 2  # the study as the first machine left it; a second sitting adds nothing
    assert "0 queued now" in fresh.stdout and sorted(p.name for p in archive.iterdir()) == entries
    assert [(t.number, t.state, t.user_attrs) for t in trials(tmp_path)] == \
        [(t.number, t.state, t.user_attrs) for t in every]
    back = {t.user_attrs["seed"]: t for t in trials(tmp_path) if t.state == TrialState.COMPLETE}
    assert len([t for t in trials(tmp_path) if t.state == TrialState.COMPLETE]) == 4  # two old runs, two redos
    assert {s: (t.number, t.user_attrs["ppl"]) for s, t in back.items()} == \
        {s: (new[s].number, new[s].user_attrs["ppl"]) for s in (1, 2)}  # the newest of each seed: its redo
    for seed, trial in old.items():  # the replaced runs' files where the report says
        assert read_results(archive / f"base-s{seed}.superseded-t{trial.number}") == old_results[seed]
    redos = {t.user_attrs["seed"]: t.user_attrs["redo_of"] for t in trials(tmp_path) if t.user_attrs.get("redo_of") is not None}
    assert redos == {s: old[s].number for s in (1, 2)}
    frame = pd.read_csv(tmp_path / "report" / "table3.csv", index_col="row")
    assert frame.loc["base", "ppl"] == pytest.approx(mean_of_new, abs=5e-4)
    md = (tmp_path / "report" / "table3.md").read_text()
    for seed in (1, 2):
        assert (f"base seed {seed}: dev PPL {old[seed].user_attrs['ppl']} → {new[seed].user_attrs['ppl']}, "
                f"BLEU {old[seed].user_attrs['bleu']} → {new[seed].user_attrs['bleu']} (trial "
                f"{new[seed].number} replaces {old[seed].number}, kept as base-s{seed}.superseded-t{old[seed].number})"
                in md), md
    assert "Redo not complete" not in md


def test_redo_of_a_row_outside_the_table_is_one_line_and_queues_nothing(tmp_path: Path, capfd):
    for rows, expected in (("D1", "--redo names rows the table does not run (D1)"), (" ,", "--redo is empty"),
                           ("X9", "unknown Table 3 row or group 'X9'")):
        result = ablate_here(capfd, *sitting_args(tmp_path, "--redo", rows))  # the sitting's command, in this process
        assert result.returncode != 0 and expected in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "t3.db").exists() and not (tmp_path / "runs").exists()


def test_a_folder_is_never_set_aside_over_another(tmp_path: Path):
    """`aside` moves a run to its trial's name once; a name taken already is refused in one line
    and both folders stay as they are."""
    from foundation.errors import UserError
    from tables.redo import aside

    run = tmp_path / "base-s1"
    assert aside(run, 7) is None  # nothing there: nothing moved
    for text in ("first", "second"):
        run.mkdir()
        (run / "results.json").write_text(text)
        if text == "first":
            assert aside(run, 7) == tmp_path / "base-s1.superseded-t7"
    with pytest.raises(UserError, match="base-s1.superseded-t7 exists already"):
        aside(run, 7)
    assert (tmp_path / "base-s1.superseded-t7" / "results.json").read_text() == "first"
    assert (run / "results.json").read_text() == "second"


def test_a_sitting_stopped_between_a_redos_moves_sets_nothing_aside_twice(tmp_path: Path):
    """A redo moves the archive entry first, then the run directory, then queues its trial. Stopped
    after the first move, the next sitting restores nothing over the run directory (it holds the
    old run), moves the run directory to its own name beside the archive's copy and queues the
    redo once: every copy kept, none written over."""
    from dataclasses import replace

    from tables.archive import restore
    from tables.plan import Table3Plan, identity, queue, run_dir, table_record
    from foundation.io import atomic_write_json

    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base"],
                      seeds=[1], runs_dir=str(tmp_path / "runs"), overrides=["train.max_steps=10"])
    study, _ = queue(plan)
    trial = study.ask()  # the queued base seed 1, finished
    study.tell(trial, 20.0)
    runs, archive = {("base", 1): Path(run_dir(plan, "base", 1))}, tmp_path / "archive"
    for folder in (runs["base", 1], archive / "base-s1"):
        folder.mkdir(parents=True)
        (folder / "results.json").write_text('{"status": "complete", "ppl": 20.0}')
    atomic_write_json(archive / "table3.json", table_record(plan, identity(plan)))  # an archive of ours
    (archive / "base-s1").rename(archive / f"base-s1.superseded-t{trial.number}")  # then stopped

    assert restore(runs, archive) == []
    study, queued = queue(replace(plan, redo=["base"]), archive)
    assert queued == 1
    assert sorted(p.name for p in runs["base", 1].parent.iterdir()) == [f"base-s1.superseded-t{trial.number}"]
    assert sorted(p.name for p in archive.iterdir()) == [f"base-s1.superseded-t{trial.number}", "table3.json"]
    assert [t.user_attrs.get("redo_of") for t in study.trials] == [None, trial.number]
    assert queue(replace(plan, redo=["base"]), archive)[1] == 0  # asked once
