"""`ablate dashboard`: serve optuna-dashboard for a sweep's storage until Ctrl-C.

It listens on 127.0.0.1 unless `--host` says otherwise (the dashboard has no authentication and
can edit studies). A malformed storage URL, a SQLite or journal file that does not exist, an SQLite
file that is not an Optuna database, or a port that is taken, is a `UserError`, before anything
is printed or written. The storage URL is printed with its password masked.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from wsgiref.simple_server import WSGIServer, make_server

from lightning_modules.errors import UserError
from sweeps.storage import exposure_warning, make_storage, safe_url


def _cannot_listen(host: str, port: int, err: OSError) -> UserError:
    return UserError(f"cannot listen on {host}:{port}: {err.strerror or err}")


def banner(storage_url: str, host: str, port: int) -> str:
    """The line printed once the dashboard is about to listen (no password in it)."""
    shown = f"[{host}]" if ":" in host else host
    return f"optuna-dashboard for {safe_url(storage_url)} at http://{shown}:{port}/ (Ctrl-C to stop)"


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Open the storage, print the URL, and serve the dashboard until Ctrl-C or SIGTERM (exit
    status 0)."""
    if not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    storage = make_storage(storage_url, heartbeat_s=None, existing=True)
    try:
        from optuna_dashboard import wsgi  # heavy: after validation
    except ImportError:
        raise UserError("optuna-dashboard is not installed: pip install optuna-dashboard") from None
    try:  # binds here (SO_REUSEADDR: only a port in use fails, not one lingering in TIME_WAIT)
        server = make_server(host, port, wsgi(storage), server_class=_server_class(host))
    except OSError as err:  # port in use, host not on this machine
        raise _cannot_listen(host, port, err) from None
    with server:
        stop_on_signals(server)
        if warning := exposure_warning("dashboard", storage_url, host):
            print(warning, file=sys.stderr, flush=True)
        print(banner(storage_url, host, port), flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # a second Ctrl-C while the first was stopping the server
            pass
    return 0


def _server_class(host: str) -> type[WSGIServer]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return type("DashboardServer", (WSGIServer,), {"address_family": family})


def stop_on_signals(server: WSGIServer) -> None:
    """SIGINT and SIGTERM stop `server.serve_forever()` between requests.

    Not by KeyboardInterrupt: wsgiref's request handler catches every exception raised while it
    serves a request (a bare `except:`, to answer 500), so a Ctrl-C that lands there is lost and
    the dashboard went on serving (seen on a loaded machine). A second signal raises
    KeyboardInterrupt as usual."""
    signals = (signal.SIGINT, signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.default_int_handler)
        threading.Thread(target=server.shutdown, daemon=True).start()  # waits for serve_forever

    for sig in signals:
        signal.signal(sig, stop)
