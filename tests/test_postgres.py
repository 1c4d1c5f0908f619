"""Optuna sweeps against a real, throwaway PostgreSQL server (Debian's `postgresql` package).

No mocks: a real server on 127.0.0.1 and a free port, real worker processes, a real `ablate sweep`.
Skipped only when the PostgreSQL server binaries or psycopg2 are missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from test_sweeps import SPACE, TINY, ablate, take_queued_trials_concurrently, write

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


def test_four_processes_never_take_one_queued_trial_twice_on_postgres(postgres_url):
    assert sorted(take_queued_trials_concurrently(postgres_url)) == list(range(40))
