"""Optuna sweeps against a real, throwaway PostgreSQL server (Debian's `postgresql` package).

No mocks: a real server on 127.0.0.1 and a free port, real worker processes, a real `ablate sweep`.
Skipped only when the PostgreSQL server binaries or psycopg2 are missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from test_sweeps import EXPECTED_KEYS, SPACE, TINY, ablate, take_queued_trials_concurrently, write

SKIP = "PostgreSQL server not installed (apt-get install postgresql)"


def _pg_bindir() -> Path | None:
    """The newest Debian PostgreSQL bin directory holding initdb and pg_ctl, else one on PATH."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if os.access(Path(d) / "initdb", os.X_OK) and os.access(Path(d) / "pg_ctl", os.X_OK):
            return Path(d)
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl and Path(initdb).resolve().parent == Path(pg_ctl).resolve().parent:
        return Path(initdb).resolve().parent
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server for this test session: yields its SQLAlchemy URL; stopped and removed after."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(SKIP)
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 not importable (pip install psycopg2-binary)")

    base = Path(tempfile.mkdtemp(prefix="ablate-pg-"))
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:  # PostgreSQL refuses to run as root: the Debian package's `postgres` user runs it
        shutil.chown(base, "postgres", "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    data, log = base / "data", base / "server.log"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}

    def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        # cwd=base: the postgres user may not be allowed into the test's working directory
        result = subprocess.run([*prefix, *cmd], cwd=base, env=env, capture_output=True, text=True,
                                timeout=120)
        if check and result.returncode != 0:
            server_log = log.read_text() if log.exists() else "(no server log)"
            pytest.fail(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                        f"--- server log ---\n{server_log}", pytrace=False)
        return result

    started = False
    try:
        run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--no-locale", "--no-sync")
        for attempt in range(3):  # the free port may be taken between probing and binding
            port = _free_port()
            result = run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                         "-o", f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off", "start", check=False)
            if result.returncode == 0:
                break
            if attempt == 2 or not log.exists() or "already in use" not in log.read_text():
                pytest.fail(f"pg_ctl start failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                            f"--- server log ---\n{log.read_text() if log.exists() else '(none)'}",
                            pytrace=False)
        started = True
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)


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


def test_ablate_sweep_optuna_on_postgres(tmp_path, postgres_url):
    result = ablate("sweep", "optuna", "--study", "pg", "--storage", postgres_url,
                    "--space", str(write(tmp_path / "space.yaml", SPACE)), "--n-trials", "6",
                    "--workers", "2", "--heartbeat", "5", "--runs-dir", str(tmp_path / "runs"),
                    *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = optuna.load_study(study_name="pg", storage=postgres_url).get_trials()
    assert len(trials) == 6, [t.state for t in trials]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), [t.state for t in trials]
    for t in trials:
        if t.state == TrialState.PRUNED:
            continue
        assert {"bleu", "ppl", "run_dir"} <= set(t.user_attrs), t.user_attrs
        assert t.value == t.user_attrs["ppl"]
        assert t.user_attrs["run_dir"] == str((tmp_path / "runs" / "pg" / f"trial-{t.number}").resolve())
        assert Path(t.user_attrs["run_dir"]).is_dir()


def test_four_workers_queueing_and_taking_never_run_a_trial_twice_on_postgres(postgres_url):
    assert sorted(take_queued_trials_concurrently(postgres_url)) == EXPECTED_KEYS


def _command_lines(but: int) -> list[str]:
    """Every process's command line, as `ps` would show it to any user (except process `but`)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        if cmdline.parent.name == str(but):
            continue
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # the process ended
            continue
    return lines


def test_database_password_appears_in_no_output_file_command_line_or_trial(tmp_path, postgres_url):
    """Security: the storage URL's password (trust auth ignores it) never reaches the logs, the
    run directories, the report, the study's attributes or any process's command line."""
    secret = "Pw-9f3k2-secret"
    url = postgres_url.replace("postgres@", f"postgres:{secret}@")
    runs = tmp_path / "runs"
    args = [sys.executable, "-m", "ablate", "table3", "--preset", "tiny", "--rows", "base",
            "--study", "secret-table", "--storage", url, "--runs-dir", str(runs), "--wandb", "offline",
            *[a for a in TINY if a != "--no-wandb"]]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen_in_ps = False
    while proc.poll() is None:
        seen_in_ps |= any(secret in line for line in _command_lines(but=proc.pid))
        time.sleep(0.2)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert not seen_in_ps, "a worker or trial process carried the password on its command line"
    assert secret not in out + err
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
                             "--port", str(_free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()  # the banner, printed once the storage opened
    finally:
        proc.send_signal(signal.SIGINT)
        out = first + proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert first.startswith("optuna-dashboard for postgresql+psycopg2://postgres:***@127.0.0.1:"), out
    assert secret not in out
