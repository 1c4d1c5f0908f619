"""A table's report regenerates byte for byte from its archive in any folder: no run stores the
absolute path of the machine that trained it, and the report reads nothing but the study (each
run's class comes from the inputs it stored, by the current rule) and, for the A group's attention
figure, the runs' attention.npz (each archived with its run).

Real tiny runs on the Ding corpus, real SQLite studies, commands run as a user types them (relative
paths, from the table's folder; in the folder that trains the tiny table and in the deepest folder
that rebuilds it they run in this process, in the other each in a process of its own); the slow
test rebuilds each committed cpu table with the two commands of its results page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import optuna
import pytest

from test_table3 import SMALL
from here import ablate_here as ablate_in_this_process

REPO = Path(__file__).resolve().parent.parent
CPU = Path("reports/results/cpu-converged-2026-11-22")


def ablate(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`ablate ARGS` run from `home`, with this checkout's code."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "ablate", *args], cwd=home, capture_output=True, text=True,
                            timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def ablate_here(capfd: pytest.CaptureFixture[str], home: Path, *args: str) -> subprocess.CompletedProcess:
    """`ablate ARGS` typed in `home`, run in this process; it must succeed."""
    result = ablate_in_this_process(capfd, *args, cwd=home)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_sitting(home: Path, run=ablate) -> subprocess.CompletedProcess:
    """base and A1 (h 8 and 1: the rows' own head counts, SMALL's n_heads left out), one seed, in
    `ablate report`'s default runs directory."""
    return run(home, "table3", "--preset", "tiny", "--rows", "base,A1", "--seeds", "1", "--storage",
               "sqlite:///t3.db", "--runs-dir", "runs/table3", "--archive", "archive", "--no-report",
               *[a for a in SMALL if a != "n_heads=4"])


def report(home: Path, out: str, run=ablate) -> dict[str, bytes]:
    run(home, "report", "--storage", "sqlite:///t3.db", "--out", out, "--bootstrap", "100")
    return files(home / out)


def test_a_tiny_tables_report_is_the_same_from_its_archive_in_two_other_folders(tmp_path: Path, browser, capfd):
    """A table trained in one folder, then rebuilt from its archive alone in two others (the first
    folder gone): no archived file names the folder that trained it, nor does the study made in
    the others, nothing is trained again, and the reports are byte for byte the first one. The archive's class of one run is made stale (as
    runs classified by an older rule once were): the report still shows the class of its inputs.

    Its rows, base and A1 (h 8 and 1), give the report the A group's attention figure, drawn from
    the runs' attention.npz, as an image that loads in Chromium; the archive carries each run's
    file, and in the other folders the report draws the same figure from the restored files.

    The first folder's commands run in this process, and so do those of the deepest of the other
    two; the clone's each run in a process of its own: the reports compared come from different
    processes as well as from different folders."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    first = tmp_path / "trained-here"
    first.mkdir()
    here = partial(ablate_here, capfd)
    tiny_sitting(first, here)
    original = report(first, "report", here)
    archive = files(first / "archive")
    assert archive and not [name for name, data in archive.items() if str(tmp_path).encode() in data]

    runs = first / "runs" / "table3" / "table3-tiny"
    for row in ("base", "A1"):
        kept = f"{row}-s1/attention.npz"
        assert archive[kept] == (runs / kept).read_bytes() and len(archive[kept]) < 100_000
    figure = first / "report" / "figures" / "attention_A.png"
    assert "figures/attention_A.png" in original
    browser.get((first / "report" / "report.html").as_uri())
    (img,) = browser.find_elements(By.CSS_SELECTOR, 'img[alt="attention_A.png"]')
    shown = browser.execute_script("return [arguments[0].complete, arguments[0].naturalWidth, "
                                   "arguments[0].naturalHeight]", img)
    assert shown == [True, *Image.open(figure).size] and shown[1] > 0

    stale = json.loads((first / "archive" / "A1-s1" / "results.json").read_text())
    assert stale["convergence"] != "diverged"  # the class its inputs give
    stale["convergence"], stale["convergence_reason"] = "diverged", "a class another rule gave"
    (first / "archive" / "A1-s1" / "results.json").write_text(json.dumps(stale, indent=2) + "\n")
    elsewhere = [tmp_path / "clone", tmp_path / "other" / "machine" / "deeper"]
    for home in elsewhere:
        shutil.copytree(first / "archive", home / "archive")
    shutil.rmtree(first)

    for home, run in zip(elsewhere, (ablate, here)):
        sitting = tiny_sitting(home, run)
        assert "restored from archive: base seed 1 (complete), A1 seed 1 (complete)" in sitting.stdout
        assert "Restoring states" not in "".join(p.read_text() for p in (home / "runs").rglob("trial.log"))
        study = optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{home}/t3.db")
        stored = json.dumps([[t.user_attrs, t.system_attrs] for t in study.get_trials()])
        assert str(tmp_path) not in stored  # run directories relative to --runs-dir
        again = report(home, "report", run)
        assert again.keys() == original.keys()
        for name, data in original.items():
            assert again[name] == data, f"{home}: {name}"


# each committed table: its results folder, spec (None: Table 3's), study and storage, as its page names them
# folder, spec, study, storage, the rows its page's command names (None: the preset's)
COMMITTED = {
    "table3": (CPU, None, "table3-cpu-v2", "sqlite:///runs/table3-cpu.db", None),
    "modifications": (Path("reports/results/cpu-modifications-2026-11-26"), "ablations/modifications.yaml",
                      "modifications-cpu", "sqlite:///runs/modifications-cpu.db",
                      "base,pre_ln,rmsnorm,feed-forward,positions,embeddings,attention-heads,modern"),
}


@pytest.mark.slow
@pytest.mark.parametrize("table", sorted(COMMITTED))
def test_a_committed_cpu_report_regenerates_byte_for_byte_in_another_folder(tmp_path: Path, table: str):
    """A committed cpu table, rebuilt in a folder that is not this checkout from a copy of its
    results folder (and its spec), with its results page's own two commands: every file of the
    report (tables, HTML, figures) as committed, and the archive as it was."""
    folder, spec, study, storage, rows = COMMITTED[table]
    home = tmp_path / "elsewhere"
    committed = REPO / folder
    shutil.copytree(committed, home / folder)
    if spec:
        (home / spec).parent.mkdir(parents=True)
        shutil.copy(REPO / spec, home / spec)
    archive = files(committed / "archive")
    ablate(home, "table3", *(["--spec", spec] if spec else []), *(["--rows", rows] if rows else []),
           "--preset", "cpu", "--workers", "2",
           "--study", study, "--storage", storage, "--runs-dir", "runs/table3", "--no-wandb",
           "--archive", str(folder / "archive"), timeout=3600)
    ablate(home, "report", "--storage", storage, "--study", study, "--out", str(folder), timeout=1200)
    for name in ["table3.md", "table3.csv", "table3.tex", "report.html",
                 *(f"figures/{p.name}" for p in sorted((committed / "figures").glob("*.png")))]:
        assert (home / folder / name).read_bytes() == (committed / name).read_bytes(), name
    assert files(home / folder / "archive") == archive


def test_no_committed_result_names_a_path_of_the_machine_that_made_it():
    """Results and logs under reports/results and benchmarks/results name places relative to the
    repository (`<repo>/...`, `<scratch>/...` in device logs), never a machine's absolute path (the
    scripts that ran there keep the scratch folders they chose)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "reports/results", "benchmarks/results"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in listed:
        path = REPO / name
        if path.suffix in (".py", ".sh", ".png") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if any(root in line for root in ("/work/", "/tmp/", "/root/", "/home/")):
                found.append(f"{name}:{number}")
    assert not found, found
