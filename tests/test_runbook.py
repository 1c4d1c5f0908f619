"""docs/gpus.md, the GPU runbook, walked on a CPU: every command in its code blocks runs here, as
written, with `--dry-run`, or at a tiny scale stated in `TINY` below, so a renamed flag or a
command that stopped working fails a test.

`RULES` says for each command how it runs; a command on the page that no rule covers fails
`test_every_command_on_the_page_has_a_rule`, so a new command cannot go untested. The launch on
eight GPUs runs for real with eight CPU workers (the demo preset's ten rows at 4 steps each,
through the same queue, scheduler and launcher that serve eight GPUs), then the report command,
then the same command again, which trains nothing (slow: `make test-slow`; `make test` runs it as
a dry run).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from ablate.cli import build_parser, main, parse_args

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "gpus.md"
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
# The launch at a tiny scale: the demo preset's rows, eight CPU workers for eight GPUs, 4 steps,
# a 20-sentence dev set decoded greedily with short outputs, no W&B.
TINY = {"--preset paper": "--preset demo", "--gpus 0,1,2,3,4,5,6,7": "--workers 8"}
TINY_EXTRA = ["--max-steps", "4", "data.valid_size=20", "eval.beam_size=1", "eval.max_len_offset=5",
              "train.val_check_interval=4", "--no-wandb"]
LAUNCH = "ablate table3 --preset paper --gpus 0,1,2,3,4,5,6,7 --archive runs/table3-paper-archive"
REPORT = "ablate report --study table3-paper --out runs/table3/table3-paper/report"
SQLITE = "sqlite:///runs/sweeps.db"


def commands() -> list[str]:
    """Every command in the page's bash blocks, continuation lines joined."""
    found = []
    for block in FENCE.findall(PAGE.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(" ".join(line.split()))
    return found


def as_written(command: str) -> list[str]:
    return shlex.split(command)[1:]  # the arguments after `ablate`


def with_dry_run(command: str) -> list[str]:
    return [*as_written(command), *([] if "--dry-run" in command else ["--dry-run"])]


def on_sqlite(command: str) -> list[str]:
    """A shared PostgreSQL study becomes the test's SQLite file (stated: no database host here)."""
    return [SQLITE if a.startswith("postgresql") else a for a in with_dry_run(command)]


def from_sbatch(command: str) -> list[str]:
    """What each array task runs (the script's own extra options), as a dry run."""
    words = shlex.split(command)
    return [*words[words.index("sweeps/slurm/array.sbatch") + 1:], "--workers", "1", "--no-report", "--dry-run"]


# (pattern, how the test runs it): "dry" = `ablate` with --dry-run in this process, "make" = the
# make target's commands (make -n), "python" = the line as written, "sbatch" = the script's syntax
# and its ablate command as a dry run, "launch"/"report" = the tiny walk below.
RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^make setup TORCH=torch$"), "make"),
    (re.compile(r"^\.venv/bin/python -c "), "python"),
    (re.compile(r"^ablate table3 .*--dry-run"), "dry"),
    (re.compile(r"^ablate table3 .*--storage postgresql"), "dry"),
    (re.compile(rf"^{re.escape(LAUNCH)}$"), "launch"),
    (re.compile(r"^sbatch "), "sbatch"),
    (re.compile(rf"^{re.escape(REPORT)}$"), "report"),
]


def rule(command: str) -> str | None:
    return next((how for pattern, how in RULES if pattern.search(command)), None)


def test_every_command_on_the_page_has_a_rule():
    listed = commands()
    assert len(listed) >= 8
    assert [c for c in listed if rule(c) is None] == []
    assert {rule(c) for c in listed} == {how for _, how in RULES}  # and no rule is left over


def test_every_ablate_command_parses_with_the_real_parser():
    for command in commands():
        if command.startswith("ablate "):
            parse_args(build_parser(), as_written(command))  # a renamed flag exits here


def test_the_plans_and_the_shared_study_commands_run_as_dry_runs(tmp_path, capsys, monkeypatch):
    """Each distinct command once: the page repeats the paper plan's dry run (sections 3 and 6),
    and the same command with the same arguments plans the same table twice."""
    monkeypatch.chdir(tmp_path)
    for command in dict.fromkeys(commands()):
        if rule(command) not in ("dry", "launch", "sbatch"):
            continue
        args = from_sbatch(command) if rule(command) == "sbatch" else on_sqlite(command)
        capsys.readouterr()
        assert main(args) == 0, (command, capsys.readouterr().err)
        out = capsys.readouterr().out
        assert "device-hours on" in out and "wall-clock" in out, command
    assert list(tmp_path.iterdir()) == []  # plans write nothing


def test_install_and_check_lines():
    for command in commands():
        if rule(command) == "make":
            plan = subprocess.run(["make", "-n", "-B", *shlex.split(command)[1:]], cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
            assert plan.returncode == 0, plan.stderr
            pip = [line for line in plan.stdout.splitlines() if "pip install" in line]
            assert pip and all('"torch"' in line and "torch==" not in line for line in pip), plan.stdout
        if rule(command) == "python":
            words = shlex.split(command)
            done = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert done.stdout.split()[0].isdigit()  # the GPU count (0 here)
        if rule(command) == "sbatch":
            assert subprocess.run(["bash", "-n", str(ROOT / "sweeps/slurm/array.sbatch")]).returncode == 0


def tiny(command: str) -> list[str]:
    for old, new in TINY.items():
        command = command.replace(old, new)
    return [*as_written(command), *TINY_EXTRA]


@pytest.mark.slow
def test_the_launch_report_and_resume_walked_with_eight_workers(tmp_path):
    """Section 4 with eight workers, then section 8, then section 7 (the same command again)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def ablate(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ablate", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1200)

    first = ablate(tiny(LAUNCH))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "8 worker(s)" in first.stdout
    study = optuna.load_study(study_name="table3-demo", storage=SQLITE.replace("///", f"///{tmp_path}/"))
    rows = [t.user_attrs["row"] for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(rows) == sorted(["base", "A1", "A4", "B1", "C1", "C4", "C6", "D1", "D3", "E"])  # each once
    assert len(study.get_trials()) == 10
    report = ablate([*as_written(REPORT.replace("table3-paper", "table3-demo")), "--bootstrap", "0"])
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "runs/table3/table3-demo/report/table3.md").is_file()
    again = ablate(tiny(LAUNCH))
    assert again.returncode == 0 and "0 queued now" in again.stdout, again.stdout[-2000:]
    assert len(study.get_trials()) == 10  # nothing trained twice
