"""The Optuna study of a sweep: storage (with heartbeat), create-or-load, sampler, pruner, queue.

A study lives in an RDB storage (SQLite by default, PostgreSQL for several machines). The
storage's heartbeat marks a trial whose worker died as FAIL, and Optuna's
`RetryHeartbeatStaleTrialCallback` queues a copy of it (same params and user attributes, so the
same run directory) for the next worker.
"""

from __future__ import annotations

import base64
import sqlite3
import time
import zlib
from contextlib import closing
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from sqlalchemy.engine import make_url
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from lightning_modules.errors import UserError
from lightning_modules.run.io import check_writable_dir
from ablations.resolve import parse_overrides
from sweeps.optuna_api import heartbeat_storage
from sweeps.space import SearchSpace

DEFAULT_STORAGE = "sqlite:///runs/sweeps.db"
OPTUNA_TABLES = {"studies", "version_info"}  # what makes an SQLite file an Optuna database
SQLITE_OPEN_ATTEMPTS = 5  # see _open_rdb
OBJECTIVES = {"ppl": "minimize", "bleu": "maximize"}  # dev perplexity / dev BLEU
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)  # what counts towards --n-trials


def sqlite_path(url: str) -> Path | None:
    """The database file of a `sqlite:///` URL (None for other databases or in-memory)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):]
    return None if not path or path == ":memory:" else Path(path)


def safe_url(url: str) -> str:
    """The storage URL without its password, for printing and reports."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 (not an SQLAlchemy URL: make_storage reports it)
        return url


def in_memory_sqlite(url: str) -> bool:
    """An SQLite URL without a file (`sqlite://`, `sqlite:///:memory:`): each process has its own."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 (not an SQLAlchemy URL: make_storage reports it)
        return False
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def _sqlite_tables(path: Path) -> set[str]:
    """The table names of an SQLite file, read without writing to it (opened read-only)."""
    try:
        with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=60)) as db:
            return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as err:
        raise UserError(f"{path} is not an SQLite database ({err})") from None


def check_sqlite_file(path: Path, existing: bool) -> None:
    """An SQLite file a storage may open: an Optuna database, or (unless `existing` is asked for) no
    file yet, an empty one, or one whose tables another process is creating right now (Optuna
    creates `studies` first). Optuna would add its tables to any other database."""
    if not path.exists():
        if existing:
            raise UserError(f"no database {path}: give the --storage of a sweep or Table 3 run")
        return
    tables = _sqlite_tables(path)
    if OPTUNA_TABLES <= tables or not existing and (not tables or "studies" in tables):
        return
    held = f"its tables: {', '.join(sorted(tables)[:5])}" if tables else "it has no tables"
    raise UserError(f"{path} is not an Optuna database ({held}); give the --storage of a sweep or "
                    f"Table 3 run")


def make_storage(url: str, heartbeat_s: int | None = 60, existing: bool = False) -> RDBStorage:
    """The RDB storage; with a heartbeat, stale trials become FAIL and are re-queued as copies.

    `existing`: the storage must already be an Optuna database (the report and the dashboard:
    reading one must not create one, nor add Optuna's tables to another SQLite file).
    """
    if in_memory_sqlite(url):
        raise UserError(f"storage {url} is an in-memory SQLite database: the worker processes cannot "
                        f"share it and it is gone when the command ends; give a file, e.g. "
                        f"sqlite:///runs/sweeps.db")
    path = sqlite_path(url)
    engine_kwargs: dict[str, Any] = {}
    if path is not None:
        check_sqlite_file(path, existing)
        check_writable_dir(path.parent, f"the database {path.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}}  # several workers write to one file
    try:
        storage = _open_rdb(url, heartbeat_s, engine_kwargs, attempts=1 if path is None else SQLITE_OPEN_ATTEMPTS)
        if path is not None:
            _serialize_sqlite_transactions(storage.engine)
        return storage
    except ImportError as err:
        raise UserError(f"storage {safe_url(url)}: missing database driver ({err}); for PostgreSQL "
                        f"pip install psycopg2-binary") from None
    except Exception as err:  # sqlalchemy: bad URL, unreachable server
        raise UserError(f"cannot open storage {safe_url(url)}: {str(err).splitlines()[0]}") from None


def _open_rdb(url: str, heartbeat_s: int | None, engine_kwargs: dict[str, Any], attempts: int) -> RDBStorage:
    """Optuna's RDB storage, tried `attempts` times. Processes that open a new SQLite file at once
    (the workers of two commands, a test watching a sweep start) all create Optuna's tables and
    version row; Python's sqlite3 commits each CREATE TABLE on its own, so all but one fail ("table
    ... already exists", "UNIQUE constraint failed"). Opened again once the winner is done, the
    database is complete."""
    for attempt in range(1, attempts):
        try:
            return heartbeat_storage(url, heartbeat_s, engine_kwargs=engine_kwargs)
        except (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError):
            time.sleep(0.5 * attempt)
    return heartbeat_storage(url, heartbeat_s, engine_kwargs=engine_kwargs)  # its error is the caller's


def _serialize_sqlite_transactions(engine: sqlalchemy.engine.Engine) -> None:
    """Make every SQLite transaction take the write lock when it begins (BEGIN IMMEDIATE).

    Optuna claims a queued trial by reading it as WAITING and then writing RUNNING. Python's
    sqlite3 only opens the transaction at the write, so two workers can both read WAITING and
    both run the trial (`SELECT ... FOR UPDATE` is a no-op on SQLite). With BEGIN IMMEDIATE the
    read and the write are one locked step; other workers wait (up to the 60 s timeout).
    """

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections made before the listeners existed are not reused


def open_study(name: str, storage: RDBStorage | str, objective: str = "ppl",
               sampler: optuna.samplers.BaseSampler | None = None,
               pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    """Create the study, or load it if it exists (its direction must match `objective`)."""
    direction = OBJECTIVES[objective]
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                sampler=sampler, pruner=pruner, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise UserError(f"study {name!r} exists and is {study.direction.name.lower()}d; "
                        f"--objective {objective} needs {direction}: use another --study")
    saved = study.user_attrs.get("objective")
    if saved is None:
        study.set_user_attr("objective", objective)
    elif saved != objective:
        raise UserError(f"study {name!r} optimises {saved}, not {objective}: use another --study")
    return study


def make_sampler(name: str, space: SearchSpace, seed: int | None = None) -> optuna.samplers.BaseSampler:
    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(name: str, startup_trials: int = 5, warmup_steps: int = 0) -> optuna.pruners.BasePruner:
    """Median (default), 25th-percentile, Hyperband or no pruning, on step-keyed dev perplexity.

    `startup_trials`: trials that finish before any is pruned; `warmup_steps`: training steps
    before a trial can be pruned (Hyperband: its minimum resource).
    """
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)
    if name == "percentile":
        return optuna.pruners.PercentilePruner(25.0, n_startup_trials=startup_trials,
                                               n_warmup_steps=warmup_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup_steps))
    return optuna.pruners.NopPruner()


def pack_lines(lines: list[str]) -> str:
    """Sentences as one compact string for a user attribute (zlib, base64)."""
    return base64.b64encode(zlib.compress("\n".join(lines).encode("utf-8"), 9)).decode("ascii")


def unpack_lines(packed: str) -> list[str]:
    return zlib.decompress(base64.b64decode(packed)).decode("utf-8").split("\n")


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials per state name ('COMPLETE': 3, ...)."""
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def enqueue(study: optuna.Study, overrides: list[str], user_attrs: dict[str, Any] | None = None) -> bool:
    """Queue a fixed configuration (key=value overrides, and the Table 3 row in `user_attrs`)
    unless the same one is queued, running or complete.

    The overrides travel in the trial's user attributes (`enqueued_overrides`); the objective
    prefers them to sampling. Returns whether a trial was queued.
    """
    wanted = parse_overrides(overrides)
    row = (user_attrs or {}).get("row")
    live = (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
    for trial in study.get_trials(deepcopy=False, states=live):
        queued = trial.user_attrs.get("enqueued_overrides")
        if queued is not None and parse_overrides(queued) == wanted and trial.user_attrs.get("row") == row:
            return False
    study.enqueue_trial({}, user_attrs={**(user_attrs or {}), "enqueued_overrides": list(overrides)},
                        skip_if_exists=False)
    return True
