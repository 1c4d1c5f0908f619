"""Optuna sweeps against a real, throwaway PostgreSQL server (Debian's `postgresql` package; the
`postgres_url` fixture is in conftest.py).

No mocks: a real server on 127.0.0.1 and a free port, real worker and trial processes, real `ablate
sweep` and `ablate table3` runs (their launchers in the test process, `tests/here.py`).
Skipped only when the PostgreSQL server binaries or psycopg2 are missing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ports import free_port
from here import ablate_here
from test_sweeps import EXPECTED_KEYS, SPACE, TINY, take_queued_trials_concurrently, write

WORKER = """
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=sys.argv[2], storage=optuna.storages.RDBStorage(sys.argv[1]))
study.optimize(lambda t: (t.suggest_float("x", -10, 10) - 2) ** 2, n_trials=5)
"""


def test_rdb_storage_on_postgres_two_processes(postgres_url):
    storage = optuna.storages.RDBStorage(postgres_url)
    study = optuna.create_study(study_name="two-procs", storage=storage)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, postgres_url, "two-procs"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    trials = optuna.load_study(study_name="two-procs", storage=postgres_url).get_trials()
    assert len(trials) == 10
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted(t.number for t in trials) == list(range(10))
    assert len({t._trial_id for t in trials}) == 10
    assert study.best_value == min(t.value for t in trials)


def test_ablate_sweep_optuna_on_postgres(tmp_path, postgres_url, capfd):
    """A sampled trial on the server: its worker claims it and keeps its heartbeat there, its
    process reports to it, the worker records its results. (Processes at once on the server: the
    two Optuna processes above and the four racing workers below. The `ablate sweep` launcher runs
    in this process; its worker and trial are processes of their own.)"""
    result = ablate_here(capfd, "sweep", "optuna", "--study", "pg", "--storage", postgres_url,
                         "--space", str(write(tmp_path / "space.yaml", SPACE)), "--n-trials", "1",
                         "--heartbeat", "15", "--runs-dir", str(tmp_path / "runs"), *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = optuna.load_study(study_name="pg", storage=postgres_url).get_trials()
    assert len(trials) == 1, [t.state for t in trials]
    assert all(t.state == TrialState.COMPLETE for t in trials), [t.state for t in trials]
    for t in trials:
        assert {"bleu", "ppl", "run_dir"} <= set(t.user_attrs), t.user_attrs
        assert set(t.intermediate_values) == {5, 10}  # reported to the server at each validation
        assert t.value == t.user_attrs["ppl"]
        assert t.user_attrs["run_dir"] == f"pg/trial-{t.number}"  # relative to --runs-dir
        assert (tmp_path / "runs" / t.user_attrs["run_dir"]).is_dir()


def test_four_workers_queueing_and_taking_never_run_a_trial_twice_on_postgres(postgres_url):
    assert sorted(take_queued_trials_concurrently(postgres_url)) == EXPECTED_KEYS




SMALL_MODEL = ["d_model=32", "d_ff=64", "n_heads=4", "n_layers=1"]  # what trains is not what is tested here


def _command_lines() -> list[str]:
    """Every process's command line, as `ps` would show it to any user."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # the process ended
            continue
    return lines


def test_database_password_appears_in_no_output_file_command_line_or_trial(tmp_path, postgres_url, capfd):
    """Security: the storage URL's password (trust auth ignores it) never reaches the logs, the
    run directories, the report, the study's attributes or any process's command line. The
    `ablate table3` launcher runs in this process (so no command line holds the URL it was given:
    pytest's does not), while a thread looks at every process's command line, its worker's and
    its trial's (processes of their own) among them."""
    secret = "Pw-9f3k2-secret"
    url = postgres_url.replace("postgres@", f"postgres:{secret}@")
    runs = tmp_path / "runs"
    args = ["table3", "--preset", "tiny", "--rows", "base", "--study", "secret-table", "--storage", url,
            "--runs-dir", str(runs), "--wandb", "offline", *[a for a in TINY if a != "--no-wandb"], *SMALL_MODEL]
    done, seen_in_ps, looks = threading.Event(), [], [0]

    def look() -> None:
        while not done.is_set():
            seen_in_ps.extend(line for line in _command_lines() if secret in line)
            looks[0] += 1
            time.sleep(0.2)

    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        result = ablate_here(capfd, *args)
    finally:
        done.set()
        watcher.join(timeout=30)
    assert result.returncode == 0, result.stderr[-3000:]
    assert looks[0] > 10, looks  # it looked all along the run
    assert not seen_in_ps, f"a process carried the password on its command line: {seen_in_ps[:3]}"
    assert secret not in result.stdout + result.stderr
    leaked = [p for p in runs.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked, leaked
    assert (runs / "secret-table" / "report" / "report.html").is_file()
    study = optuna.load_study(study_name="secret-table", storage=postgres_url)
    stored = repr(study.user_attrs) + "".join(repr(t.user_attrs) + repr(t.system_attrs) for t in study.trials)
    assert secret not in stored


def test_dashboard_prints_the_storage_url_without_its_password(postgres_url):
    secret = "Pw-dash-secret"
    optuna.create_study(study_name="dash", storage=postgres_url, load_if_exists=True)
    url = postgres_url.replace("postgres@", f"postgres:{secret}@")
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "dashboard", "--storage", url,
                             "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()  # the banner, printed once the storage opened
    finally:
        proc.send_signal(signal.SIGINT)
        out = first + proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert first.startswith("optuna-dashboard for postgresql+psycopg2://postgres:***@127.0.0.1:"), out
    assert secret not in out


@pytest.mark.parametrize("command", ["report", "dashboard"])
def test_reading_commands_leave_a_database_without_optuna_tables_as_it_was(postgres_url, command, tmp_path, capsys):
    """`report` and `dashboard` on a server database that is not Optuna's (empty, or someone
    else's tables) refuse in one line and create nothing in it (run in this process: what is tested
    is what they do to the database, and their one line)."""
    import psycopg2

    from ablate.cli import main

    server, _ = postgres_url.rsplit("/", 1)
    dsn = server.replace("postgresql+psycopg2://", "postgresql://")
    admin = psycopg2.connect(f"{dsn}/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        for name in (f"empty_{command}", f"shop_{command}"):
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
            cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    with psycopg2.connect(f"{dsn}/shop_{command}") as shop, shop.cursor() as cur:
        cur.execute("CREATE TABLE customers (id integer PRIMARY KEY, name text)")
    expected = {f"empty_{command}": "it has no tables", f"shop_{command}": "its tables: customers"}
    for name, held in expected.items():
        args = ["--storage", f"{server}/{name}"]
        args += ["--out", str(tmp_path / "report")] if command == "report" else ["--port", str(free_port())]
        code = main([command, *args])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert "is not an Optuna database" in lines[0] and held in lines[0], lines[0]
        with psycopg2.connect(f"{dsn}/{name}") as db, db.cursor() as cur:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
            assert sorted(row[0] for row in cur.fetchall()) == (["customers"] if "shop" in name else [])
    assert not (tmp_path / "report").exists()
