"""A run's logged history across resumptions (Lightning's CSVLogger deletes metrics.csv when a
resumed run starts; `metrics_log` sets it aside first and reads the parts back as one history)."""

from __future__ import annotations

from pathlib import Path

from lightning_modules.metrics_log import read_rows, set_aside


def write_log(log_dir: Path, steps: list[int], tag: str) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "metrics.csv").write_text("step,train/loss\n" + "".join(f"{s},{tag}\n" for s in steps))


def history(log_dir: Path) -> list[tuple[int, str]]:
    return [(int(r["step"]), r["train/loss"]) for r in read_rows(log_dir)]


def test_each_attempt_counts_up_to_the_checkpoint_the_next_one_resumed_from(tmp_path: Path):
    logs = tmp_path / "logs"
    write_log(logs, [5, 10, 15, 20], "1")  # first attempt, killed after step 20
    assert set_aside(logs, 10).name == "metrics.part-1.until-10.csv"  # resumed at 10
    write_log(logs, [15, 20, 25, 30, 35], "2")  # second attempt, killed after 35
    assert set_aside(logs, 30).name == "metrics.part-2.until-30.csv"
    write_log(logs, [35, 40], "3")
    assert history(logs) == [(5, "1"), (10, "1"), (15, "2"), (20, "2"), (25, "2"), (30, "2"),
                             (35, "3"), (40, "3")]


def test_a_resumption_from_an_older_checkpoint_drops_what_it_redid(tmp_path: Path):
    logs = tmp_path / "logs"
    write_log(logs, [5, 10, 15, 20], "1")
    set_aside(logs, 20)
    write_log(logs, [25], "2")  # its newer checkpoint was damaged: the third attempt resumes at 15
    set_aside(logs, 15)
    write_log(logs, [20, 25], "3")
    assert history(logs) == [(5, "1"), (10, "1"), (15, "1"), (20, "3"), (25, "3")]


def test_nothing_to_set_aside_and_a_second_resumption_from_the_same_step(tmp_path: Path):
    logs = tmp_path / "logs"
    assert set_aside(logs, 5) is None and history(logs) == []
    write_log(logs, [5, 10], "1")
    set_aside(logs, 10)
    write_log(logs, [], "2")  # killed before its first window
    assert set_aside(logs, 10).name == "metrics.part-2.until-10.csv"
    write_log(logs, [15], "3")
    assert history(logs) == [(5, "1"), (10, "1"), (15, "3")]
