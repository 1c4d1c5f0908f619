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

import contextlib
import io
import json
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
    return [*words[words.index("sweeps/slurm/array.sbatch") + 1:], "--workers", "1", "--dry-run"]


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
        if rule(command) == "make":  # on this checkout, set up (make test did) with the pinned CPU torch (#70)
            plan = subprocess.run(["make", "-n", *shlex.split(command)[1:]], cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
            assert plan.returncode == 0, plan.stderr
            pip = [line for line in plan.stdout.splitlines() if "pip install" in line]
            assert pip and all('--upgrade "torch"' in line and "torch==" not in line for line in pip), plan.stdout
            assert "apt-get" not in plan.stdout and "sudo" not in plan.stdout  # a GPU node without sudo
            again = subprocess.run(["make", "-n", "setup"], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert "pip install" not in again.stdout, again.stdout  # the torch it has: nothing to do
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


# --- the page's commands as a researcher varies them (#70) ------------------------------------

def one_line_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """The one stderr line of a command that must refuse `args` with exit status 2."""
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ablate: error:"), (args, code, err)
    return err[0]


@pytest.mark.parametrize("args, meant", [
    (["table3", "--preset", "paper", "--devices", "8", "--dry-run"], "--devices-per-run"),
    (["sweep", "optuna", "--study", "s", "--space", "sweeps/example.yaml", "--devices", "2"], "--devices-per-run"),
    (["train", "--max-step", "3"], "--max-steps"),
    (["report", "--wandb", "online"], "--wandb-report"),
    (["report", "--ou", "x"], "--out"),  # named before the missing --out is
    (["translate", "runs/x", "--bem", "2"], "--beam"),
])
def test_no_option_is_taken_for_an_abbreviation_of_another(args, meant, capsys, tmp_path, monkeypatch):
    """argparse takes a prefix of an option for the option: `--devices 8` on a launcher was
    `--devices-per-run 8`, one worker whose runs trained with gloo DDP on the CPU (an 8-GPU
    machine's table, all on its CPU). Every command refuses a prefix in one line naming the option."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, args)
    assert "unknown option --" in line and f"did you mean '{meant}'?" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("setting", ["train.lr_scale=nan", "train.adam_eps=1e400", "train.gradient_clip_val=-inf",
                                     "scale.width=.nan", "train.max_memory_gb=inf", "dropout=nan"])
def test_a_setting_that_is_not_a_finite_number_is_refused_before_a_run_folder_exists(setting, capsys, tmp_path):
    line = one_line_error(capsys, ["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--no-wandb", setting])
    assert "must be a finite number" in line and setting.split("=")[0].split(".")[-1] in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e400"])
def test_a_spec_rows_non_finite_setting_is_refused_by_the_dry_run(value, capsys, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"base: {{group: base, model: {{}}, train_steps: 10}}\nL: {{group: l, train: {{lr_scale: {value}}}}}\n")
    line = one_line_error(capsys, ["table3", "--preset", "demo", "--spec", str(spec), "--dry-run",
                                   "--storage", f"sqlite:///{tmp_path}/t.db"])
    assert "row 'L'" in line and "train.lr_scale must be a finite number" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_the_plan_shows_the_value_each_run_trains_with_and_params_a_rows_vocabulary(capsys, tmp_path):
    """A row's `train:`/`data:` numbers are written at the paper's scale and scaled by the preset's
    own ratio to the paper's value (`ablations.spec`): the plan prints both, and the rule. A row's
    vocabulary reaches `ablate params --spec` (it had printed base's for every row)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {group: base, model: {}, train_steps: 100000}\n"
                    "V16: {group: vocabulary, data: {vocab_size: 16000}}\n"
                    "L2: {group: lr, train: {lr_scale: 2.0}}\n")
    capsys.readouterr()
    assert main(["table3", "--preset", "gpu", "--spec", str(spec), "--dry-run",
                 "--storage", f"sqlite:///{tmp_path}/t.db"]) == 0
    out = capsys.readouterr().out
    # gpu: vocabulary 8,000 against the paper's 37,000; lr_scale 1.0 as the paper's
    assert "vocab_size 16000 -> 3459" in out and "lr_scale 2.0\n" in out
    assert "recipe: a row's train:/data: settings as its spec writes them, at the paper's scale" in out
    assert main(["params", "--spec", str(spec), "--json"]) == 0
    vocab = {entry["row"]: entry["vocab"] for entry in json.loads(capsys.readouterr().out)}
    assert vocab == {"base": 37000, "V16": 16000, "L2": 37000}
    assert main(["params", "--spec", str(spec), "--vocab-size", "8000", "--json"]) == 0
    assert {e["row"]: e["vocab"] for e in json.loads(capsys.readouterr().out)}["V16"] == 3459


def test_a_part_shorter_than_a_run_says_up_front_which_runs_it_will_not_start(capfd, tmp_path):
    """A part starts only the runs it expects to finish: with the runbook's `--stop-after 10h` the
    paper's big row (about 18 hours) never starts. The dry run and the launcher say so first, with
    the part length the run needs."""
    capfd.readouterr()
    assert main(["table3", "--preset", "paper", "--gpus", "0,1,2,3,4,5,6,7", "--dry-run", "--stop-after", "10h",
                 "--storage", f"sqlite:///{tmp_path}/t.db"]) == 0
    out = capfd.readouterr().out
    note = out.strip().splitlines()[-1]
    assert note.startswith("--stop-after 10h: a part starts only the runs it expects to finish")
    assert "big (about 18h" in note and "need --stop-after 18h" in note and "base" not in note
    assert main(["table3", "--preset", "paper", "--gpus", "0,1", "--dry-run", "--stop-after", "20h",
                 "--storage", f"sqlite:///{tmp_path}/t.db"]) == 0
    assert "--stop-after 20h" not in capfd.readouterr().out  # every run fits
    code = main(["table3", "--preset", "demo", "--rows", "base", "--stop-after", "1s", "--no-wandb", "--no-report",
                 "--storage", f"sqlite:///{tmp_path}/t.db", "--runs-dir", str(tmp_path / "runs")])
    err = capfd.readouterr().err
    assert code == 130 and "table3 table3-demo: --stop-after 1s: a part starts only the runs" in err
    assert err.index("base (about") < err.index("--stop-after 1s reached")  # said before the workers start


def table_commands(text: str) -> list[list[str]]:
    """The `ablate table3` arguments of each shared-study or SLURM array line in a page or script
    (continuation lines joined, a comment's leading '#' dropped), without what says where the study
    lives or how many tasks take from it."""
    text = re.sub(r"\\\n#?\s*", " ", text)
    found = []
    for line in text.splitlines():
        line = line.lstrip("# ").strip()
        if re.match(r"^(ablate table3|sbatch --array=\S+ sweeps/slurm/array\.sbatch table3) .*", line) \
                and ("sbatch" in line or "--storage" in line):
            words = shlex.split(line)
            words = words[words.index("table3") + 1:]
            found.append(sorted(w for w in words if not w.startswith("postgresql") and w != "--storage"))
    return found


def test_the_shared_study_and_the_slurm_array_are_one_table_wherever_they_are_written():
    """The runbook's section 5 and docs/scale-out.md train the same table, on machines sharing a
    study and as a SLURM array (the script itself is generic: it names no table) (#70: scale-out's added data.max_tokens=6250 train.accumulate_grad_batches=4, another table,
    and since max_tokens is one step's tokens a quarter of the paper's step)."""
    written = [command for path in (PAGE, ROOT / "docs" / "scale-out.md")
               for command in table_commands(path.read_text())]
    assert len(written) >= 4
    plain = [[w for w in c if w not in ("--gpus", "0,1,2,3,4,5,6,7", "--no-report")] for c in written]
    assert all(c == ["--preset", "paper"] for c in plain), written


def test_every_option_the_pages_name_for_a_command_is_one_it_has():
    """docs/table3.md had `ablate report --wandb`; the flag is `--wandb-report`. Every `ablate CMD
    --option` written in README and docs/ names an option of that command."""
    commands = ("train", "params", "table3", "report", "dashboard", "storage-proxy", "translate", "evaluate",
                "attention", "sweep optuna", "sweep wandb")
    known = {}
    for command in commands:  # each command's options, as its --help lists them
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            assert main([*command.split(), "--help"]) == 0
        known[command] = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", shown.getvalue()))
    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for found in re.finditer(r"ablate ((?:sweep )?[a-z3-]+)((?: [^`|\n]*?)?)(?=`|\n|$)", page.read_text()):
            if found.group(1) in known:
                wrong += [f"{page.name}: ablate {found.group(1)} {flag}"
                          for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", found.group(2))
                          if flag not in known[found.group(1)]]
    assert wrong == []


@pytest.mark.parametrize("name", ["A100", "RTX 4090", "H1", "80GB", "h100x"])
def test_a_plan_is_made_only_for_a_gpu_by_a_known_name(name, capsys, tmp_path):
    """`--plan-for A100` had the H100's rate unscaled, and `H1` or `80GB` matched the H100."""
    line = one_line_error(capsys, ["table3", "--preset", "gpu", "--dry-run", "--plan-for", name,
                                   "--storage", f"sqlite:///{tmp_path}/t.db"])
    assert f"--plan-for {name!r} is not a GPU this project knows; plan for one of H100, H200" in line


def test_the_plan_says_where_its_rate_comes_from_what_it_misses_and_which_rows_fit(capsys, tmp_path):
    """The rate's device and corpus, the preset's known over-estimate of big, the memory estimate
    against the planned GPU's; and `--plan-for` outside a dry run is refused."""
    def plan(*args: str) -> str:
        capsys.readouterr()
        assert main(["table3", "--preset", "paper", "--dry-run", "--rows", "base,big", "--seeds", "1",
                     "--storage", f"sqlite:///{tmp_path}/t.db", *args]) == 0
        return capsys.readouterr().out

    out = plan("--plan-for", "H100")
    assert "The rate's run trained on newstest2013+2014 as a stand-in for WMT14's training side" in out
    assert "Known to miss: big's estimate is high by up to 2.5x" in out
    assert "every row fits the planned GPU's 80 GB" in out
    big = plan("--plan-for", "H100", "data.max_tokens=50000")  # big's activations at a 50K step: ~80 GB
    assert "above the planned GPU's 80 GB: big (split each step into more batches" in big
    assert "every row fits the planned GPU's 141 GB" in plan("--plan-for", "H200", "data.max_tokens=50000")
    assert "every row fits" in plan("--plan-for", "H100", "data.max_tokens=50000", "train.accumulate_grad_batches=2")
    line = one_line_error(capsys, ["table3", "--preset", "paper", "--plan-for", "H100", "--storage",
                                   f"sqlite:///{tmp_path}/t.db"])
    assert "--plan-for plans for a GPU (--dry-run)" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_tables_max_steps_are_bases_and_every_row_keeps_its_ratio(capsys, tmp_path):
    """`--max-steps 1000` gave big 1,000 steps too, losing its 3x; it is base's now."""
    capsys.readouterr()
    assert main(["table3", "--preset", "paper", "--dry-run", "--rows", "base,big", "--max-steps", "1000",
                 "--storage", f"sqlite:///{tmp_path}/t.db"]) == 0
    steps = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[2:4]}
    assert steps == {"base": "1,000", "big": "3,000"}


def test_a_dry_run_whose_storage_cannot_be_reached_says_so(capsys, tmp_path):
    """Section 6 on an unreachable database had silently left out where the table stands."""
    capsys.readouterr()
    assert main(["table3", "--preset", "paper", "--gpus", "0,1", "--dry-run", "--rows", "base",
                 "--storage", "postgresql+psycopg2://user:secret@127.0.0.1:1/db"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("where the table stands: not known here; the study was not read (cannot open storage")
    assert "secret" not in last


@pytest.mark.parametrize("size, said", [(3, "needs more than 4 pieces"), (10, "needs at least")])
def test_a_vocabulary_too_small_for_the_corpus_is_one_line(size, said, capsys, tmp_path):
    line = one_line_error(capsys, ["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--no-wandb",
                                   f"data.vocab_size={size}"])
    assert f"data.vocab_size={size} is too small for this corpus: sentencepiece {said}" in line
    assert "INTERNAL" not in line and not (tmp_path / "run").exists()
