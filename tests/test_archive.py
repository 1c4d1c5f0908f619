"""`ablate table3 --archive DIR`: a table that goes on after its machine is gone.

Real tiny runs on the Ding corpus, a real SQLite study; the "fresh machine" is the same one with
the run directories and the database deleted, so that only the archive is left.
"""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, replace
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import FrozenTrial, TrialState

from ablations.resolve import resolve
from foundation.errors import UserError
from lightning_modules.metrics_log import read_rows
from lightning_modules.run.preflight import check_same_result, resume_checkpoint
from lightning_modules.run.results import RunResult, read_results
from tables.plan import Table3Plan, queue
from tables.policy import pace
from here import ablate_here
from test_table3 import ablate, table3_args, trials


def sitting_args(tmp: Path, archive: Path, *extra: str) -> list[str]:
    return table3_args(tmp, "--rows", "base", "--seeds", "1,2", "--no-report", "--archive", str(archive), *extra)


def sitting(tmp: Path, archive: Path, *extra: str, env: dict[str, str] | None = None):
    return ablate(*sitting_args(tmp, archive, *extra), env=env)


def complete(tmp: Path) -> dict[int, optuna.trial.FrozenTrial]:
    return {t.user_attrs["seed"]: t for t in trials(tmp) if t.state == TrialState.COMPLETE}


@pytest.mark.slow
def test_a_table_goes_on_from_its_archive_on_a_fresh_machine(tmp_path: Path):
    """Seed 1 finishes and seed 2 is killed after its step-5 checkpoint; with the run directories
    and the database gone, the same command restores both from the archive: seed 1 is adopted as
    it was (translations too), seed 2 resumes from its checkpoint and ends as an uninterrupted
    run of the same seed does."""
    archive, runs = tmp_path / "archive", tmp_path / "runs" / "table3-tiny"
    first = sitting(tmp_path, archive, "--seeds", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    killed = sitting(tmp_path, archive, env={"ABLATE_FAULT": "train_step@7"})  # SIGKILL in seed 2
    assert killed.returncode == 1 and "not complete: base seed 2 (fail)" in killed.stderr
    journal_then = (archive / "study.journal.xz").read_bytes()  # the study: seed 1 complete, seed 2 failed
    seed1 = read_results(runs / "base-s1")
    assert (archive / "table3.json").is_file()
    assert read_results(archive / "base-s1") == seed1
    for name in ("config.yaml", "dev.src.txt", "dev.ref.txt", "dev.hyp.txt"):
        assert (archive / "base-s1" / name).read_bytes() == (runs / "base-s1" / name).read_bytes()
    assert read_rows(archive / "base-s1" / "logs") == read_rows(runs / "base-s1" / "logs")
    assert not (archive / "base-s1" / "checkpoints").exists()
    (kept,) = (archive / "base-s2" / "checkpoints").glob("*.ckpt")  # the newest only
    assert not (archive / "base-s2" / "results.json").exists()

    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "t3.db").unlink()
    again = sitting(tmp_path, archive)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "restored from" in again.stdout and "base seed 1 (complete), base seed 2 (checkpoint)" in again.stdout
    assert "the study is back from" in again.stdout and "(2 trials)" in again.stdout
    done = complete(tmp_path)
    assert set(done) == {1, 2}
    assert done[1].user_attrs["ppl"] == seed1.ppl and done[1].user_attrs["bleu"] == seed1.bleu
    assert "dev_hyp" in done[1].user_attrs  # the report's bootstrap has it
    assert done[1].number < done[2].number  # finished run directories are queued first
    assert "Restoring states from the checkpoint" in (runs / "base-s2" / "trial.log").read_text()
    assert min(done[2].intermediate_values) > 5  # resumed at step 5, not restarted
    assert read_results(archive / "base-s2").status == "complete"
    assert not (archive / "base-s2" / "checkpoints").exists()

    # a sitting stopped between its two saves: the journal older than the runs (seed 2 failed there,
    # complete in its archive entry). On the next fresh machine seed 2 is adopted from its entry,
    # as any finished run directory the study does not hold as complete: nothing trains again.
    (archive / "study.journal.xz").write_bytes(journal_then)
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "t3.db").unlink()
    later = sitting(tmp_path, archive)
    assert later.returncode == 0, later.stderr[-2000:]
    assert "base seed 1 (complete), base seed 2 (complete)" in later.stdout and "1 queued now" in later.stdout
    adopted = complete(tmp_path)
    assert {s: t.user_attrs["ppl"] for s, t in adopted.items()} == {s: t.user_attrs["ppl"] for s, t in done.items()}
    assert [adopted[s].number for s in (1, 2)] == [done[s].number for s in (1, 2)]  # the journal's two, then one
    assert "Restoring states" not in (runs / "base-s2" / "trial.log").read_text()

    whole = tmp_path / "uninterrupted"
    single = ablate(*table3_args(whole, "--rows", "base", "--seeds", "2", "--no-report"))
    assert single.returncode == 0, single.stderr[-2000:]
    assert done[2].user_attrs["ppl"] == complete(whole)[2].user_attrs["ppl"]
    assert done[2].user_attrs["dev_ppl_curve"] == complete(whole)[2].user_attrs["dev_ppl_curve"]


def test_the_archived_study_comes_back_whole_into_a_storage_that_lacks_it(tmp_path: Path):
    """`save_study`/`restore_study` on real SQLite databases: every trial comes back under its
    number with its state, user attributes and reports (beside another study, whose trials take
    other ids); a trial the journal holds as running fails and a copy of it is queued; a storage
    that has the study keeps its own; a save of an unchanged study leaves the journal's bytes."""
    from optuna.trial import create_trial

    from tables.archive import STUDY, restore_study, save_study

    here = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/here.db")
    optuna.create_study(study_name="other", storage=here).enqueue_trial({})
    study = optuna.create_study(study_name="t", storage=here)
    study.set_user_attr("kind", "table3")
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=20.0, user_attrs={"row": "base", "seed": 1}))
    study.enqueue_trial({}, user_attrs={"row": "base", "seed": 2})
    running = study.ask()  # base seed 2, trained on the machine that is gone
    running.report(30.0, 5)
    study.enqueue_trial({}, user_attrs={"row": "base", "seed": 1, "redo_of": 0})
    archive = tmp_path / "archive"
    save_study(here, "t", archive)
    saved = (archive / STUDY).read_bytes()
    save_study(here, "t", archive)
    assert (archive / STUDY).read_bytes() == saved

    there = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/there.db")
    optuna.create_study(study_name="first", storage=there).enqueue_trial({})
    assert restore_study(archive, there, "t") == 3
    back = optuna.load_study(study_name="t", storage=there)
    assert back.user_attrs == {"kind": "table3"}
    assert [(t.number, t.state, t.user_attrs, t.intermediate_values) for t in back.trials] == [
        (0, TrialState.COMPLETE, {"row": "base", "seed": 1}, {}),
        (1, TrialState.FAIL, {"row": "base", "seed": 2}, {5: 30.0}),
        (2, TrialState.WAITING, {"row": "base", "seed": 1, "redo_of": 0}, {}),
        (3, TrialState.WAITING, {"row": "base", "seed": 2}, {})]  # the failed one's retry copy
    back.set_user_attr("more", 1)
    assert restore_study(archive, there, "t") == 0 and len(back.trials) == 4  # it has the study: its own kept


@pytest.fixture(scope="module")
def failed_sitting(tmp_path_factory: pytest.TempPathFactory):
    """One sitting of base seed 1 whose loss turns NaN at step 7, with its archive; each test
    takes a copy of that archive to a machine of its own. `ablate table3` runs in this process
    (its worker and the run's trial in processes of their own): its exit status, and the lines it
    printed itself."""
    from ablate.cli import main

    tmp = tmp_path_factory.mktemp("failed")
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        env.setenv("ABLATE_FAULT", "nan_grad@7")  # the trial's, through its worker
        code = main(sitting_args(tmp, tmp / "archive", "--seeds", "1"))
    return subprocess.CompletedProcess(["ablate"], code, out.getvalue(), err.getvalue()), tmp / "archive"


def archive_copy(failed_sitting, tmp_path: Path) -> Path:
    return Path(shutil.copytree(failed_sitting[1], tmp_path / "archive"))


def test_an_archive_of_another_table_is_refused_in_one_line(tmp_path: Path, failed_sitting, capfd):
    archive = archive_copy(failed_sitting, tmp_path)
    other = ablate_here(capfd, *sitting_args(tmp_path, archive, "--study", "other", "--max-steps", "12"))
    lines = other.stderr.strip().splitlines()
    assert other.returncode == 2 and len(lines) == 1, other.stderr[-2000:]
    assert "holds another table (" in lines[0] and "overrides: train.max_steps: 10 -> 12" in lines[0]
    assert not (tmp_path / "runs" / "other").exists()


def test_the_committed_cpu_archive_is_the_table_its_results_page_runs(tmp_path: Path):
    """The committed cpu table's archive/table3.json is what its results page's command plans (so
    a sitting there is not refused), and each archived run's config.yaml, the configuration it
    trained with, has that identity too: an edit to the preset or a config default that would
    retrain its runs differently fails here first."""
    from lightning_modules.config import computed_config
    from tables.plan import check_archive, identity, make_plan

    archive = Path(__file__).parents[1] / "reports" / "results" / "cpu-converged-2026-11-22" / "archive"
    plan = make_plan("cpu", f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs"), ["train.wandb=off"],
                     study="table3-cpu-v2")
    wanted = identity(plan)
    assert check_archive(archive, plan, wanted) == json.loads((archive / "table3.json").read_text())
    for row, seed in plan.runs():
        trained = computed_config(resolve("cpu", row, archive / f"{row}-s{seed}" / "config.yaml", None))
        assert json.loads(json.dumps(trained)) == wanted[f"{row}-s{seed}"], (row, seed)
    assert len(wanted) == 50


def test_a_failed_run_stays_failed_on_the_next_machine(tmp_path: Path, failed_sitting, capfd):
    failed, _ = failed_sitting
    assert failed.returncode == 1 and "not complete: base seed 1 (fail)" in failed.stderr
    archive = archive_copy(failed_sitting, tmp_path)  # the next machine has the archive alone
    assert read_results(archive / "base-s1").status == "failed"
    assert not (archive / "base-s1" / "checkpoints").exists()  # nothing to resume
    again = ablate_here(capfd, *sitting_args(tmp_path, archive, "--seeds", "1"))  # its worker and trial: processes
    assert again.returncode == 1 and "base seed 1 (failed)" in again.stdout
    assert "holds a failed run" in (tmp_path / "runs" / "table3-tiny" / "base-s1" / "trial.log").read_text()
    assert not complete(tmp_path)


def test_an_archive_entry_whose_logs_is_a_link_is_refused_and_the_users_folder_kept(tmp_path: Path, failed_sitting,
                                                                                     capfd):
    """An entry whose `logs/` is a symbolic link to a folder of the user's: the table is refused
    in one line before anything is restored or saved, and no file of that folder is deleted or
    overwritten (it deleted two and overwrote metrics.csv)."""
    archive = archive_copy(failed_sitting, tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("metrics.csv", "notes.txt", "plan.md"):
        (mine / name).write_text(f"the user's {name}\n")
    shutil.rmtree(archive / "base-s1" / "logs")
    (archive / "base-s1" / "logs").symlink_to(mine)
    again = ablate_here(capfd, *sitting_args(tmp_path, archive, "--seeds", "1"))
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert "base-s1/logs is a symbolic link" in lines[0], lines[0]
    assert {p.name: p.read_text() for p in mine.iterdir()} == {n: f"the user's {n}\n" for n in ("metrics.csv", "notes.txt", "plan.md")}
    assert not (tmp_path / "runs").exists()


def test_a_finished_result_is_reused_only_by_its_own_configuration(tmp_path: Path):
    cfg = resolve("cpu", "base", None, ["train.seed=1"], None)
    done = RunResult(preset="cpu", corpus=cfg.data.corpus, seed=1, steps=cfg.train.max_steps,
                     model=asdict(cfg.model.with_vocabulary(2000, 0)), status="complete")
    check_same_result(tmp_path, done, cfg)  # the vocabulary is the tokenizer's, not the identity
    with pytest.raises(UserError, match="with seed 1, not 2"):
        check_same_result(tmp_path, done, resolve("cpu", "base", None, ["train.seed=2"], None))
    with pytest.raises(UserError, match="with model.d_model 64, not 128"):
        check_same_result(tmp_path, done, resolve("cpu", "C5", None, ["train.seed=1"], None))
    with pytest.raises(UserError, match="with steps 24000, not 100"):
        check_same_result(tmp_path, done, resolve("cpu", "base", None, ["train.seed=1", "train.max_steps=100"],
                                                  None))


def test_a_run_directory_finished_elsewhere_is_queued_before_everything(tmp_path: Path):
    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base", "C5"],
                      seeds=[1, 2], runs_dir=str(tmp_path / "runs"), overrides=["train.max_steps=10"])
    study, _ = queue(plan)
    assert [t.user_attrs["row"] for t in study.trials][:2] == ["C5", "C5"]  # the costliest first
    finished = tmp_path / "runs" / "u" / "base-s2"
    finished.mkdir(parents=True)
    (finished / "results.json").write_text(json.dumps({"status": "complete"}))
    study, _ = queue(replace(plan, study="u"))
    assert (study.trials[0].user_attrs["row"], study.trials[0].user_attrs["seed"]) == ("base", 2)


@pytest.mark.slow
def test_a_sitting_given_stop_after_ends_itself_with_its_run_checkpointed_in_the_archive(tmp_path: Path):
    """`--stop-after`: at the set time the table stops as on Ctrl-C (exit 130, one line saying
    why), and the run still training is stopped with its interrupted checkpoint in the archive for
    the next sitting. A part starts only the runs it expects to finish (this one's estimate: about a
    minute, most of it the preset's allowance for start-up and decoding), so the run is one that
    fits; its trial holds itself after step 7 (`ABLATE_FAULT=train_step@7:SIGSTOP`, inherited through
    the worker) until the part's end has passed the stop on to it as SIGINT: still training at the
    part's end, however fast the machine."""
    from test_slurm import wait_until_stopped
    from test_sweeps import wait_until_pending

    archive = tmp_path / "archive"
    started = time.monotonic()
    log = tmp_path / "stderr.txt"  # a file, not a pipe: a full pipe would block the held table
    with log.open("w") as sink:
        table = subprocess.Popen([sys.executable, "-m", "ablate", *sitting_args(tmp_path, archive, "--seeds", "1",
                                                                                  "--max-steps", "40", "--stop-after",
                                                                                  "80s")],
                                 env={**os.environ, "PYTHONUNBUFFERED": "1", "ABLATE_FAULT": "train_step@7:SIGSTOP"},
                                 stdout=subprocess.DEVNULL, stderr=sink)
    try:
        held = wait_until_stopped(table)
        assert wait_until_pending(held, signal.SIGINT, time.monotonic() + 200, table), \
            f"the part's end never reached the trial; stderr: {log.read_text()[-2000:]}"
        os.kill(held, signal.SIGCONT)
        table.wait(timeout=120)
    finally:
        if table.poll() is None:
            table.kill()
    elapsed, err = time.monotonic() - started, log.read_text()
    assert table.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert "--stop-after 1m 20s reached" in err and "stopped after 1m 20s (--stop-after)" in err, err[-2000:]
    assert 80 < elapsed < 80 + 120
    (checkpoint,) = (archive / "base-s1" / "checkpoints").glob("*.ckpt")
    assert checkpoint.name == "interrupted.ckpt"
    assert 7 <= torch.load(checkpoint, weights_only=False)["global_step"] < 40
    assert [t.state for t in trials(tmp_path)] == [TrialState.FAIL, TrialState.WAITING]  # a retry copy waits


def demo_part(capfd: pytest.CaptureFixture[str], tmp: Path, steps: int, stop_after: str,
              *extra: str) -> subprocess.CompletedProcess:
    """One `--stop-after` part of a one-run demo table (the demo preset states a cost), `ablate
    table3` in this process (its worker, and the run's trial, processes of their own)."""
    return ablate_here(capfd, "table3", "--preset", "demo", "--rows", "base", "--seeds", "1", "--max-steps",
                       str(steps), "train.val_check_interval=3", "data.valid_size=20", "data.test_size=20",
                       "--no-wandb", "--no-report", "--storage", f"sqlite:///{tmp}/t3.db", "--runs-dir",
                       str(tmp / "runs"), "--stop-after", stop_after, *extra)


def test_a_part_starts_only_the_runs_expected_to_finish_before_it_ends(tmp_path: Path, capfd):
    """A part shorter than a run's estimate starts nothing, says why and exits 130, the run left
    queued; a part long enough trains it. (A run stopped at a part's end leaves its checkpoint out
    of a committed archive, checkpoints being git-ignored, so the part does not start it.)"""
    long, short = tmp_path / "long", tmp_path / "short"
    first = demo_part(capfd, long, 200_000, "90s")  # estimated at over an hour
    assert first.returncode == 130, first.stderr[-2000:]
    assert "cannot finish" in first.stderr and "leaving them for the next part" in first.stderr
    assert "run the same command again to go on" in first.stderr and "Traceback" not in first.stderr
    assert [t.state for t in trials(long, "table3-demo")] == [TrialState.WAITING]
    assert not (long / "runs" / "table3-demo" / "base-s1").exists()
    enough = demo_part(capfd, short, 3, "20m", "d_model=32", "d_ff=64", "n_heads=4", "n_layers=1",
                       "data.vocab_size=500")
    assert enough.returncode == 0, enough.stderr[-2000:]
    assert [t.state for t in trials(short, "table3-demo")] == [TrialState.COMPLETE]


def test_the_pace_is_the_median_of_finished_runs_training_seconds_against_their_estimate():
    """`pace`: a row's own median of training seconds / estimate over its complete runs, or the
    median over every row for a row with none; 1.0 with none. One run slowed by other work beside
    it (a part of the cpu modifications table: pre_ln's seeds 2 and 3 at 1.9x where the others
    ran at 0.9-1.5x) does not set the pace of every run after it, as the largest ratio did."""
    start = datetime(2026, 1, 1, 12, 0, 0)

    def trial(number: int, row: str, seconds: float, state: TrialState = TrialState.COMPLETE,
              wall: float = 10.0) -> FrozenTrial:
        return FrozenTrial(number=number, state=state, value=1.0 if state == TrialState.COMPLETE else None,
                           datetime_start=start, datetime_complete=start + timedelta(seconds=wall),
                           params={}, distributions={}, user_attrs={"row": row, "train_time_s": seconds},
                           system_attrs={}, intermediate_values={}, trial_id=number)

    estimates = {"base": 100.0, "C3": 300.0, "E": 100.0}
    assert pace([], estimates)("base") == 1.0
    done = [trial(0, "base", 150), trial(1, "C3", 600), trial(2, "base", 130), trial(3, "base", 400)]
    assert pace(done, estimates)("base") == 1.5  # its own median: 1.3, 1.5, 4.0
    assert pace(done, estimates)("C3") == 2.0
    assert pace(done, estimates)("E") == 1.75  # none of its own: over all, 1.3, 1.5, 2.0, 4.0
    # the wall time is not read (a resumed run's trial spans one part; its training seconds all)
    assert pace([trial(0, "base", 150, wall=9000)], estimates)("base") == 1.5
    ignored = [trial(0, "other", 900), trial(1, "base", 900, TrialState.FAIL), trial(2, "base", None)]
    assert pace(ignored, estimates)("base") == 1.0


@pytest.mark.parametrize("text", ["0", "90x", "30m2", "-5m"])
def test_a_bad_stop_after_is_one_line(text: str, tmp_path: Path, capfd):
    result = ablate_here(capfd, "table3", "--preset", "tiny", "--storage", f"sqlite:///{tmp_path}/t3.db",
                         "--stop-after", text)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--stop-after" in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_removed_while_the_archive_reads_it_is_skipped_without_a_word(tmp_path: Path):
    """The archive reads live run directories, where Lightning removes the older step checkpoint as
    it saves the next: a file listed but gone when read is not "damaged" (that warning, and a
    rename, are for files that are there and broken)."""
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    torch.save({"global_step": 12}, ckpt_dir / "step12.ckpt")
    (ckpt_dir / "step6.ckpt").symlink_to(ckpt_dir / "removed.ckpt")  # listed, gone when opened
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = resume_checkpoint(ckpt_dir)
    assert found == (ckpt_dir / "step12.ckpt", 12)
    assert [str(w.message) for w in caught if "damaged" in str(w.message)] == []
    assert not list(ckpt_dir.glob("*.corrupt"))


def xz_bomb(unpacked_mib: int) -> bytes:
    """xz of `unpacked_mib` MiB of zeros (a few tens of KB), made as a stream."""
    packer = lzma.LZMACompressor(preset=0)
    chunk = bytes(2 ** 20)
    return b"".join(packer.compress(chunk) for _ in range(unpacked_mib)) + packer.flush()


JOURNAL = lzma.compress(b'{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n' * 50)
DAMAGED_JOURNALS = {"not-xz": lambda: b"not xz at all", "not-a-journal": lambda: lzma.compress(b'{"op_code": 0, "worker_id": "w"}\n{broken\n'),
                    "truncated": lambda: JOURNAL[:len(JOURNAL) // 2], "xz-bomb": lambda: xz_bomb(300)}


@pytest.mark.parametrize("damage", list(DAMAGED_JOURNALS))
def test_an_archive_whose_study_is_not_a_journal_is_one_line(damage: str, tmp_path: Path, capfd):
    """A damaged `study.journal.xz` (not xz, xz of something Optuna cannot replay, cut short, or
    a bomb that unpacks past the journal's cap of 256 MiB): one line naming the file, exit 2, no
    traceback, and nothing written before the refusal (no database, no run directory)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "study.journal.xz").write_bytes(DAMAGED_JOURNALS[damage]())
    before = set(tmp_path.rglob("*"))
    result = ablate_here(capfd, *table3_args(tmp_path, "--rows", "base", "--seeds", "1", "--no-report",
                                             "--archive", str(archive)))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "study.journal.xz" in lines[-1] and "is --archive a table's archive?" in lines[-1]
    if damage == "xz-bomb":
        assert "unpacks to more than 256 MiB" in lines[-1]
    assert set(tmp_path.rglob("*")) == before
