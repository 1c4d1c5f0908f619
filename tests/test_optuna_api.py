"""The Optuna API the sweeps rely on (`sweeps/optuna_api.py`), exercised call by call with Optuna's
warnings as errors: an upgrade that removes, changes or deprecates one of them fails here, loudly,
instead of in a sweep."""

from __future__ import annotations

import ast
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps import optuna_api
from sweeps.optuna_api import (RetriesFirstStudy, RunningTrial, SystemAttrHeartbeat, fail_running_trial,
                               fail_stale_trials, frozen_trial, grpc_storage, journal_storage, queue_retry,
                               retried_trial_number, trial_id)
from sweeps.storage import make_storage
from sweeps.study import make_pruner, open_study

SWEEPS = Path(optuna_api.__file__).parent


@pytest.fixture(autouse=True)
def optuna_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        warnings.filterwarnings("error", module="optuna")
        yield


def test_installed_optuna_is_in_the_tested_range():
    version = tuple(int(p) for p in optuna.__version__.split(".")[:2])
    low, high = optuna_api.TESTED_VERSIONS
    assert low <= version < high, (
        f"optuna {optuna.__version__} is outside the tested range {low}..<{high}: check "
        f"sweeps/optuna_api.py against it, then widen TESTED_VERSIONS and the pin in pyproject.toml")


def test_the_tested_range_is_the_pin_in_pyproject():
    import tomllib

    (low, high), root = optuna_api.TESTED_VERSIONS, SWEEPS.parent
    pins = [d for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
            if d.startswith("optuna>")]
    assert pins == [f"optuna>={low[0]}.{low[1]},<{high[0]}.{high[1]}"], pins


def test_no_private_optuna_names_outside_the_adapter():
    """`study._storage`, `trial._trial_id`, `optuna.trial.Trial(...)` and the like stay out."""
    for path in SWEEPS.parent.glob("*/*.py"):
        if path.parts[-2] not in ("sweeps", "reports", "ablate", "ablations", "lightning_modules"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("_storage", "_trial_id", "_study_id"):
                pytest.fail(f"{path}:{node.lineno}: private Optuna attribute {node.attr}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("optuna.trial.Trial", "Trial"):
                pytest.fail(f"{path}:{node.lineno}: constructs optuna.trial.Trial directly")


def test_running_trial_reports_and_prunes_from_another_process(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    study = open_study("s", make_storage(url, None), "ppl")
    for value in (1.0, 2.0, 3.0):  # three finished trials with a curve each
        t = study.ask()
        for step in (1, 2):
            t.report(value, step)
        study.tell(t, value)
    running = study.ask()
    # "another process": its own storage and study objects, the trial by number only
    storage, pruner = make_storage(url, None), make_pruner("median", 1, 0)
    other = optuna.load_study(study_name="s", storage=storage, pruner=pruner)
    trial = RunningTrial(other, storage, running.number, pruner)
    trial.report(100.0, 1)
    trial.report(5.0, 1)  # a step reported before is left as it was
    assert frozen_trial(storage, "s", running.number).intermediate_values == {1: 100.0}
    assert trial.should_prune()  # far worse than the median at step 1
    assert trial_id(storage, "s", running.number) == trial_id(make_storage(url, None), "s", running.number)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_successive_halving_compares_a_trial_with_its_cohort_only_and_a_replayed_run_counts(tmp_path, kind):
    """Reason 5: a table tunes each row on its own. A trial of cohort "a" that is worse at the first
    rung than the best of "a" so far is pruned; the same value in cohort "b", whose first trial it is,
    goes on, however good "a"'s trials are. A reference reports its rungs and is never stopped. A
    run that finished outside any cohort takes part through its replay (its rung recorded by the
    pruner itself). On an RDB and on a journal file (the storage without Optuna's own heartbeat)."""
    from sweeps.optuna_api import replay
    from sweeps.study import PRUNING, in_cohort

    url = f"sqlite:///{tmp_path}/o.db" if kind == "sqlite" else f"journal:///{tmp_path}/o.journal"
    storage, pruner = make_storage(url, None), make_pruner("halving", 0, 5)
    study = open_study("s", storage, "ppl")

    def running(cohort: str, reference: bool = False) -> RunningTrial:
        study.enqueue_trial({}, user_attrs={PRUNING: {"cohort": cohort, "reference": reference}})
        return RunningTrial(study, storage, study.ask().number, pruner, among=in_cohort(cohort))

    first = running("a", reference=True)
    first.report(10.0, 5)
    assert first.should_prune() is False  # the first at its rung goes on
    worse = running("a")
    worse.report(12.0, 5)
    assert worse.should_prune()
    alone = running("b")
    alone.report(50.0, 5)
    assert not alone.should_prune()  # "a"'s trials are not its competitors
    late = running("b")
    late.report(8.0, 2)
    assert not late.should_prune()  # before the first rung
    # a run of "c" finished before its cohort existed: replayed, it is the yardstick at step 5
    plain = study.ask()  # it reported nothing: its curve is given
    study.tell(plain, 15.0)
    number = replay(storage, "s", frozen_trial(storage, "s", plain.number), {10: 15.0, 5: 20.0}, pruner,
                    in_cohort("c"), {PRUNING: {"cohort": "c", "reference": True}})
    stand_in = frozen_trial(storage, "s", number)
    assert stand_in.state == TrialState.COMPLETE and stand_in.value == 15.0
    assert stand_in.system_attrs["completed_rung_0"] == 20.0 and stand_in.intermediate_values == {5: 20.0, 10: 15.0}
    behind = running("c")
    behind.report(25.0, 5)
    assert behind.should_prune()


def test_failed_trial_is_retried_as_a_copy(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    assert make_storage(url, 1).get_heartbeat_interval() == 1  # the workers' storage: a heartbeat
    storage = make_storage(url, None)  # (asking a trial outside Study.optimize: no heartbeat)
    study = open_study("s", storage, "ppl")
    t = study.ask()
    study.set_user_attr("kind", "test")
    t.set_user_attr("run_dir", "/runs/x")
    assert fail_running_trial(storage, "s", t.number)
    assert not fail_running_trial(storage, "s", t.number)  # finished already
    queue_retry(study, frozen_trial(storage, "s", t.number))
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["run_dir"] == "/runs/x"
    assert retried_trial_number(waiting[0]) == t.number
    fail_stale_trials(study)  # nothing stale: a no-op, but the call must exist


def test_retry_copies_are_claimed_before_trials_that_never_started(tmp_path):
    """Optuna alone hands out the trial queued first; a run interrupted at 95% would wait for them all."""
    url = f"sqlite:///{tmp_path}/o.db"
    storage = make_storage(url, None)
    study = open_study("s", storage, "ppl")
    for row in ("a", "b", "c", "d"):
        study.enqueue_trial({}, user_attrs={"row": row})
    first = study.ask()  # "a" starts, then its worker is stopped
    assert fail_running_trial(storage, "s", first.number)
    queue_retry(study, frozen_trial(storage, "s", first.number))
    plain = optuna.load_study(study_name="s", storage=storage)
    assert plain.ask().user_attrs["row"] == "b"  # Optuna's own order: the queue's, retry last
    retries_first = RetriesFirstStudy("s", make_storage(url, None))
    again = retries_first.ask()
    assert again.user_attrs["row"] == "a" and retried_trial_number(frozen_trial(storage, "s", again.number)) == 0
    assert [retries_first.ask().user_attrs["row"] for _ in range(2)] == ["c", "d"]  # then the queue's order
    assert retries_first.ask().user_attrs == {}  # nothing queued: a new trial, as Optuna does
    assert not study.get_trials(states=(TrialState.WAITING,))


def _proxy(db: Path) -> tuple[subprocess.Popen, int]:
    """`ablate storage-proxy` (Optuna's run_grpc_proxy_server) with FutureWarnings as errors."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-W", "error::FutureWarning", "-m", "ablate", "storage-proxy",
                             "--storage", f"sqlite:///{db}", "--create", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, port


@pytest.mark.parametrize("kind", ["journal", "grpc"])
def test_storages_without_an_optuna_heartbeat_get_one(kind, tmp_path):
    proc = None
    if kind == "journal":
        path = str(tmp_path / "o.journal")
        beating, plain = journal_storage(path, 1), journal_storage(path, None)
    else:
        pytest.importorskip("grpc")
        proc, port = _proxy(tmp_path / "o.db")
        beating, plain = grpc_storage("127.0.0.1", port, 1, 60), grpc_storage("127.0.0.1", port, None, 60)
    try:
        assert isinstance(beating, SystemAttrHeartbeat) and not isinstance(plain, SystemAttrHeartbeat)
        assert beating.get_heartbeat_interval() == 1
        study = open_study("s", plain, "ppl")
        running = study.ask()
        beating.record_heartbeat(trial_id(plain, "s", running.number))
        study_id = plain.get_study_id_from_name("s")
        assert beating._get_stale_trial_ids(study_id) == []
        time.sleep(2.5)
        assert beating._get_stale_trial_ids(study_id) == [trial_id(plain, "s", running.number)]
        fail_stale_trials(optuna.load_study(study_name="s", storage=beating))
        assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=30)[0]
            assert proc.returncode == 0, out
