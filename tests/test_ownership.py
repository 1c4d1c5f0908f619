"""Ownership between the folders one command writes: `--archive`, `--out`, `--report-dir` and a
table's run directories may not name, contain or sit inside each other or a run directory, and a
folder that is not ours is never written (`foundation.rundir.check_apart`,
`tables.archive.check_owned`). Each case is refused in one line before anything is
written, and every file the user had is still there, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.cli import main
from foundation.rundir import mark


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ablate: error:"), (code, err)
    return err[0]


def a_finished_run(folder: Path) -> Path:
    """A run directory of ours with a checkpoint and results (as far as ownership looks)."""
    (folder / "checkpoints").mkdir(parents=True)
    mark(folder)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    (folder / "results.json").write_text('{"status": "complete"}')
    return folder


def table(tmp: Path, *extra: str) -> list[str]:
    return ["table3", "--preset", "tiny", "--rows", "base", "--seeds", "1", "--no-wandb", "--max-steps", "2",
            "--storage", f"sqlite:///{tmp}/t.db", "--runs-dir", str(tmp / "runs"), *extra]


def test_an_archive_pointed_at_the_tables_own_run_directories_is_refused(tmp_path, capsys):
    """It had exited 0 with the finished runs' checkpoints gone from their run directories."""
    run = a_finished_run(tmp_path / "runs" / "table3-tiny" / "base-s1")
    before = snapshot(tmp_path / "runs")
    line = one_line(capsys, table(tmp_path, "--archive", str(tmp_path / "runs" / "table3-tiny")))
    assert f"--runs-dir {run} is inside the --archive folder" in line
    assert snapshot(tmp_path / "runs") == before and not (tmp_path / "t.db").exists()


def test_an_archive_that_is_a_users_folder_is_never_written(tmp_path, capsys):
    """`backup/` holds the user's copy of a run: it had lost its checkpoints, with exit status 1."""
    a_finished_run(tmp_path / "backup" / "base-s1")
    before = snapshot(tmp_path / "backup")
    line = one_line(capsys, table(tmp_path, "--archive", str(tmp_path / "backup")))
    assert f"--archive {tmp_path / 'backup'} is not a table's archive (it holds base-s1 and no table3.json)" in line
    assert snapshot(tmp_path / "backup") == before and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("where", ["checkpoints/nested", "logs", "checkpoints"])
def test_a_run_inside_another_runs_folder_is_refused(where, tmp_path, capsys):
    run = a_finished_run(tmp_path / "run")
    before = snapshot(run)
    line = one_line(capsys, ["train", "--preset", "tiny", "--out", str(run / where), "--no-wandb"])
    assert f"--out {run / where} is inside the run directory {run}" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("report", ["runs/table3-tiny", "runs/table3-tiny/base-s1", "runs/table3-tiny/base-s1/report",
                                    "archive", "archive/report", "runs"])
def test_a_report_folder_is_apart_from_the_run_directories_and_the_archive(report, tmp_path, capsys):
    line = one_line(capsys, table(tmp_path, "--archive", str(tmp_path / "archive"), "--report-dir",
                                  str(tmp_path / report)))
    assert "--report-dir" in line and "each must be a folder of its own" in line
    assert not (tmp_path / "t.db").exists() and not (tmp_path / "archive").exists()
