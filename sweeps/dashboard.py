"""`ablate dashboard`: serve optuna-dashboard for a sweep's storage until Ctrl-C.

It listens on 127.0.0.1 unless `--host` says otherwise (the dashboard has no authentication and
can edit studies). A malformed storage URL, a SQLite or journal file that does not exist, an SQLite
file that is not an Optuna database, or a port that is taken, is a `UserError`, before anything
is printed or written. The storage URL is printed with its password masked.
"""

from __future__ import annotations

import socket

from lightning_modules.errors import UserError
from sweeps.storage import make_storage, safe_url


def _cannot_listen(host: str, port: int, err: OSError) -> UserError:
    return UserError(f"cannot listen on {host}:{port}: {err.strerror or err}")


def check_port_free(host: str, port: int) -> None:
    """Fail unless `host`:`port` can be listened on (bound the way the dashboard's server binds:
    with SO_REUSEADDR, so only a port in use fails, not one lingering in TIME_WAIT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:  # port in use, host not on this machine
        raise _cannot_listen(host, port, err) from None


def banner(storage_url: str, host: str, port: int) -> str:
    """The line printed once the dashboard is about to listen (no password in it)."""
    shown = f"[{host}]" if ":" in host else host
    return f"optuna-dashboard for {safe_url(storage_url)} at http://{shown}:{port}/ (Ctrl-C to stop)"


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Open the storage, print the URL, and serve the dashboard until interrupted (exit status 0)."""
    if not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    storage = make_storage(storage_url, heartbeat_s=None, existing=True)
    try:
        from optuna_dashboard import run_server  # heavy: after validation
    except ImportError:
        raise UserError("optuna-dashboard is not installed: pip install optuna-dashboard") from None
    check_port_free(host, port)
    try:
        # Inside: a Ctrl-C sent on seeing the banner can land before print() has returned.
        print(banner(storage_url, host, port), flush=True)
        try:
            run_server(storage, host=host, port=port)
        except OSError as err:  # taken between the check and the server's own bind
            raise _cannot_listen(host, port, err) from None
    except KeyboardInterrupt:
        pass
    return 0
