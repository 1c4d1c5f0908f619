"""`ablate dashboard`: serve optuna-dashboard for a sweep's storage until Ctrl-C.

It listens on 127.0.0.1 unless `--host` says otherwise (the dashboard has no authentication and
can edit studies). A malformed storage URL, or a SQLite or journal file that does not exist, is a
`UserError`.
"""

from __future__ import annotations

from lightning_modules.errors import UserError
from sweeps.storage import make_storage, safe_url, storage_file


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Open the storage, print the URL, and serve the dashboard until interrupted (exit status 0)."""
    path = storage_file(storage_url)
    if path is not None and not path.is_file():
        raise UserError(f"no database at {path} (storage {safe_url(storage_url)}); run a sweep first")
    if not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    storage = make_storage(storage_url, heartbeat_s=None)
    try:
        from optuna_dashboard import run_server  # heavy: after validation
    except ImportError:
        raise UserError("optuna-dashboard is not installed: pip install optuna-dashboard") from None

    shown = f"[{host}]" if ":" in host else host
    print(f"optuna-dashboard for {safe_url(storage_url)} at http://{shown}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        run_server(storage, host=host, port=port)
    except KeyboardInterrupt:
        pass
    except OSError as err:  # port in use, host not on this machine
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return 0
