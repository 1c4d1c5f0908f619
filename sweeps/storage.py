"""Opening a sweep's `--storage`: an RDB URL (SQLite, PostgreSQL), a journal file or `grpc://host:port`
(`ablate storage-proxy`), each with the heartbeat of `sweeps.optuna_api` (docs/scale-out.md)."""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import optuna
import sqlalchemy
from optuna.storages import BaseStorage
from sqlalchemy.engine import make_url

from foundation.errors import UserError
from foundation.io import check_writable_dir
from sweeps.optuna_api import grpc_storage, heartbeat_storage, journal_storage

JOURNAL_SCHEME, GRPC_SCHEME = "journal:///", "grpc://"
JOURNAL_SUFFIXES = (".journal", ".log")
GRPC_DEFAULT_PORT = 13000  # Optuna's default for the proxy
GRPC_CONNECT_S = 10.0  # how long a client waits for the proxy to answer
OPTUNA_TABLES = {"studies", "version_info"}  # what makes an SQLite file an Optuna database
SQLITE_OPEN_ATTEMPTS = 5  # see _open_rdb
GRPC_HINT = "the gRPC storage proxy needs grpcio: pip install 'transformer-ablations[grpc]'"


def sqlite_path(url: str) -> Path | None:
    """The database file of a `sqlite:///` URL (None for other databases or in-memory)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):]
    return None if not path or path == ":memory:" else Path(path)


def journal_path(url: str) -> Path | None:
    """The journal file of a `journal:///PATH` URL or of a bare PATH ending .journal/.log."""
    if url.startswith(JOURNAL_SCHEME):
        return Path(url[len(JOURNAL_SCHEME):]) if url[len(JOURNAL_SCHEME):] else None
    if "://" not in url and url.endswith(JOURNAL_SUFFIXES):
        return Path(url)
    return None


def grpc_address(url: str) -> tuple[str, int] | None:
    """(host, port) of a `grpc://host[:port]` URL; UserError if malformed."""
    if not url.startswith(GRPC_SCHEME):
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or GRPC_DEFAULT_PORT
    except ValueError as err:
        raise UserError(f"storage {url}: {err}; expected grpc://HOST:PORT") from None
    if not host or parts.path not in ("", "/"):
        raise UserError(f"storage {url}: expected grpc://HOST:PORT")
    return host, port


def safe_url(url: str) -> str:
    """The storage URL without its password, for printing and reports."""
    if journal_path(url) or url.startswith(GRPC_SCHEME):
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 (not an SQLAlchemy URL: make_storage reports it)
        return url


def exposure_warning(what: str, storage_url: str, host: str) -> str | None:
    """The line a server without authentication prints when `host` is not a loopback address."""
    import ipaddress

    try:
        local = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        local = host == "localhost"
    if local:
        return None
    return (f"ablate: warning: the {what} listens on {host}, beyond this machine, with no authentication: "
            f"whoever reaches the port can read and edit every study in {safe_url(storage_url)}")


def in_memory_sqlite(url: str) -> bool:
    """An SQLite URL without a file (`sqlite://`, `sqlite:///:memory:`): each process has its own."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 (not an SQLAlchemy URL: make_storage reports it)
        return False
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def _sqlite_tables(path: Path) -> set[str]:
    """The table names of an SQLite file, opened read-only, or as its next writer would where a
    killed process left a hot journal (SQLITE_READONLY_ROLLBACK), so SQLite rolls it back first."""
    try:
        return _read_tables(f"{path.absolute().as_uri()}?mode=ro")
    except sqlite3.DatabaseError as err:
        if getattr(err, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
            raise UserError(f"{path} is not an SQLite database ({err})") from None
    try:
        return _read_tables(path.absolute().as_uri())
    except sqlite3.DatabaseError as err:
        raise UserError(f"{path}: a killed process left a transaction that SQLite cannot roll back "
                        f"here ({err}); make the file and its folder writable") from None


def _read_tables(uri: str) -> set[str]:
    with closing(sqlite3.connect(uri, uri=True, timeout=60)) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def check_sqlite_file(path: Path, existing: bool) -> None:
    """An SQLite file a storage may open (Optuna would add its tables to any other): an Optuna database,
    or unless `existing` none yet, an empty one, or one being created (Optuna makes `studies` first)."""
    if not path.exists():
        if existing:
            raise UserError(f"no database {path}: give the --storage of a sweep or a table")
        return
    tables = _sqlite_tables(path)
    if OPTUNA_TABLES <= tables or not existing and (not tables or "studies" in tables):
        return
    raise _not_optuna(path, tables)


def _server_tables(url: str) -> set[str]:
    """The table names of a server's database, read through SQLAlchemy's inspector (writing nothing)."""
    engine = sqlalchemy.create_engine(url)
    try:
        return set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _not_optuna(where: object, tables: set[str]) -> UserError:
    held = f"its tables: {', '.join(sorted(tables)[:5])}" if tables else "it has no tables"
    return UserError(f"{where} is not an Optuna database ({held}); give the --storage of a sweep or table")


def make_storage(url: str, heartbeat_s: int | None = 60, existing: bool = False,
                 read_only: bool = False) -> BaseStorage:
    """The storage of `url`; `existing`: Optuna's data must be there; `read_only`: SQLite read-only too."""
    existing = existing or read_only
    journal, proxy = journal_path(url), grpc_address(url)
    if journal is not None:
        if existing and not journal.is_file():
            raise UserError(f"no database {journal} (a journal file): give the --storage of a sweep or a table")
        try:
            return _open_journal(journal, heartbeat_s)
        except UserError:
            if not read_only:
                raise
            return _open_journal(_snapshot(journal), None)  # a journal that cannot be opened for writing
    if proxy is not None:
        return _open_grpc(*proxy, heartbeat_s)
    check_url(url)  # an in-memory database, a URL of no dialect: one line before anything opens
    return _open_rdb(url, heartbeat_s, existing, read_only)


def check_url(url: str) -> str:
    """`url` if it names a storage, checked without opening it (a journal must be a regular file)."""
    journal = journal_path(url)
    if journal is not None:
        if journal.exists() and not journal.is_file():
            raise UserError(f"storage {url}: {journal} is not a regular file (a journal is one file that "
                            f"every process appends to)")
        return url
    if grpc_address(url) is not None:
        return url
    if in_memory_sqlite(url):
        raise UserError(f"storage {url} is an in-memory SQLite database: the worker processes cannot "
                        f"share it and it is gone when the command ends; give a file, e.g. "
                        f"sqlite:///runs/sweeps.db")
    try:
        sqlalchemy.engine.make_url(url).get_dialect()
    except Exception:  # noqa: BLE001 (ArgumentError, NoSuchModuleError: not a database URL we can open)
        raise UserError(f"storage {safe_url(url)[:80]!r} is not a storage URL: give sqlite:///FILE, "
                        f"postgresql+psycopg2://USER@HOST/DB, journal:///FILE or grpc://HOST:PORT") from None
    return url


def _snapshot(journal: Path) -> Path:
    """A read-only journal's copy, removed at exit (Optuna's backend opens its file for writing)."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-journal-"))
    atexit.register(shutil.rmtree, folder, True)
    copy = folder / journal.name
    shutil.copyfile(journal, copy)
    return copy


def _open_journal(path: Path, heartbeat_s: int | None) -> BaseStorage:
    check_url(f"{JOURNAL_SCHEME}{path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return journal_storage(str(path), heartbeat_s)
    except (OSError, ValueError) as err:  # unwritable directory, not a journal file
        raise UserError(f"cannot open journal storage {path}: {err}") from None


def _open_grpc(host: str, port: int, heartbeat_s: int | None) -> BaseStorage:
    # Our processes fork then exec; with gRPC's fork support on, grpcio >= 1.80 aborts such a child
    # now and then (grpc/grpc#43055: 9 of 800 spawns) or deadlocks it before exec, blocking Popen for
    # ever. Read when grpc is first imported, below; the children inherit it.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    try:
        return grpc_storage(host, port, heartbeat_s, GRPC_CONNECT_S)
    except ImportError:
        raise UserError(GRPC_HINT) from None
    except ConnectionError:
        raise UserError(f"cannot reach the storage proxy at {host}:{port} within {GRPC_CONNECT_S:g} s; "
                        f"start it with: ablate storage-proxy --storage URL --host HOST --port {port}") from None


def _open_rdb(url: str, heartbeat_s: int | None, existing: bool, read_only: bool = False) -> BaseStorage:
    path = sqlite_path(url)
    engine_kwargs: dict[str, Any] = {}
    if path is not None:
        check_sqlite_file(path, existing)
        if read_only:  # a backup on a read-only disk or folder (SQLite's mode=ro)
            url = f"sqlite:///file:{path.absolute()}?mode=ro&uri=true"
        else:
            check_writable_dir(path.parent, f"the database {path.name}")
            path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}}  # several workers write to one file
    try:
        if path is None and existing and not OPTUNA_TABLES <= (tables := _server_tables(url)):
            raise _not_optuna(safe_url(url), tables)  # a reading command must not create Optuna's tables
        storage = _retry_open(url, heartbeat_s, engine_kwargs, 1 if path is None else SQLITE_OPEN_ATTEMPTS,
                              skip_table_creation=existing)
        if path is not None and not read_only:
            _serialize_sqlite_transactions(storage.engine)
        return storage
    except UserError:
        raise
    except ImportError as err:
        raise UserError(f"storage {safe_url(url)}: missing database driver ({err}); for PostgreSQL "
                        f"pip install psycopg2-binary") from None
    except Exception as err:  # sqlalchemy: bad URL, unreachable server
        raise UserError(f"cannot open storage {safe_url(url)}: {str(err).splitlines()[0]}") from None


def _retry_open(url: str, heartbeat_s: int | None, engine_kwargs: dict[str, Any], attempts: int,
                skip_table_creation: bool = False) -> BaseStorage:
    """Optuna's RDB storage, tried `attempts` times: processes that open a new SQLite file at once all
    create its tables, each CREATE TABLE committed alone, and all but one fail ("already exists")."""
    for attempt in range(1, attempts):
        try:
            return heartbeat_storage(url, heartbeat_s, engine_kwargs=engine_kwargs,
                                     skip_table_creation=skip_table_creation)
        except (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError):
            time.sleep(0.5 * attempt)
    return heartbeat_storage(url, heartbeat_s, engine_kwargs=engine_kwargs,
                             skip_table_creation=skip_table_creation)  # its error is the caller's


def _serialize_sqlite_transactions(engine: sqlalchemy.engine.Engine) -> None:
    """Every SQLite transaction takes the write lock when it begins (BEGIN IMMEDIATE): Optuna claims a
    trial by reading WAITING then writing RUNNING, and sqlite3 opens the transaction only at the write
    (`FOR UPDATE` is a no-op on SQLite), so two workers could both run it (docs/reliability.md)."""

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections made before the listeners existed are not reused
