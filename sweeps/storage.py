"""Opening a sweep's `--storage`: three kinds of Optuna storage, chosen by the URL.

- an RDB URL (SQLAlchemy): `sqlite:///runs/sweeps.db` (one machine), `postgresql+psycopg2://...`
  (several machines reaching a database server);
- a journal file: `journal:///runs/sweeps.journal` (relative, like `sqlite:///`; four slashes for
  an absolute path: `journal:////nfs/me/sweeps.journal`), or a path ending `.journal` or `.log`:
  Optuna's `JournalStorage` on a shared file system, no server (clusters with NFS);
- `grpc://host:port`: Optuna's `GrpcStorageProxy`, a client of `ablate storage-proxy` (which
  serves an RDB), so that hundreds of workers hold one proxy connection each instead of one
  database connection each.

Every kind gets the same heartbeat: a trial whose worker stopped beating for two intervals
becomes FAIL and is queued again as a copy (`sweeps.optuna_api`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy
from optuna.storages import BaseStorage
from sqlalchemy.engine import make_url

from lightning_modules.errors import UserError
from sweeps.optuna_api import grpc_storage, heartbeat_storage, journal_storage

JOURNAL_SCHEME, GRPC_SCHEME = "journal:///", "grpc://"
JOURNAL_SUFFIXES = (".journal", ".log")
GRPC_DEFAULT_PORT = 13000  # Optuna's default for the proxy
GRPC_CONNECT_S = 10.0  # how long a client waits for the proxy to answer
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


def storage_file(url: str) -> Path | None:
    """The file a SQLite or journal storage lives in (None for a server)."""
    return sqlite_path(url) or journal_path(url)


def safe_url(url: str) -> str:
    """The storage URL without its password, for printing and reports."""
    if journal_path(url) or url.startswith(GRPC_SCHEME):
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 (not an SQLAlchemy URL: make_storage reports it)
        return url


def make_storage(url: str, heartbeat_s: int | None = 60) -> BaseStorage:
    """The storage of `url`; with a heartbeat, stale trials become FAIL and are re-queued as copies."""
    journal, proxy = journal_path(url), grpc_address(url)
    if journal is not None:
        return _open_journal(journal, heartbeat_s)
    if proxy is not None:
        return _open_grpc(*proxy, heartbeat_s)
    return _open_rdb(url, heartbeat_s)


def _open_journal(path: Path, heartbeat_s: int | None) -> BaseStorage:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return journal_storage(str(path), heartbeat_s)
    except (OSError, ValueError) as err:  # unwritable directory, not a journal file
        raise UserError(f"cannot open journal storage {path}: {err}") from None


def _open_grpc(host: str, port: int, heartbeat_s: int | None) -> BaseStorage:
    try:
        return grpc_storage(host, port, heartbeat_s, GRPC_CONNECT_S)
    except ImportError:
        raise UserError(GRPC_HINT) from None
    except ConnectionError:
        raise UserError(f"cannot reach the storage proxy at {host}:{port} within {GRPC_CONNECT_S:g} s; "
                        f"start it with: ablate storage-proxy --storage URL --host HOST --port {port}") from None


def _open_rdb(url: str, heartbeat_s: int | None) -> BaseStorage:
    path = sqlite_path(url)
    engine_kwargs: dict[str, Any] = {}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}}  # several workers write to one file
    try:
        storage = heartbeat_storage(url, heartbeat_s, engine_kwargs=engine_kwargs)
        if path is not None:
            _serialize_sqlite_transactions(storage.engine)
        return storage
    except ImportError as err:
        raise UserError(f"storage {safe_url(url)}: missing database driver ({err}); for PostgreSQL "
                        f"pip install psycopg2-binary") from None
    except Exception as err:  # sqlalchemy: bad URL, unreachable server
        raise UserError(f"cannot open storage {safe_url(url)}: {str(err).splitlines()[0]}") from None


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
