"""`ablate dashboard`: optuna-dashboard for a sweep's storage until Ctrl-C, on 127.0.0.1 unless
`--host` says otherwise (it has no authentication); a bad storage or a taken port is one line first."""

from __future__ import annotations

import socket
import sys
import threading
from wsgiref.simple_server import WSGIServer, make_server

from foundation.errors import UserError
from foundation.stop import INTERRUPTS, STOP
from sweeps.storage import exposure_warning, make_storage, safe_url


def cannot_listen(host: str, port: int, err: OSError) -> UserError:
    """The one line for a port that cannot be bound (the dashboard's, the storage proxy's)."""
    return UserError(f"cannot listen on {host}:{port}: {err.strerror or err}")


def banner(storage_url: str, host: str, port: int) -> str:
    """The line printed once the dashboard is about to listen (no password in it)."""
    shown = f"[{host}]" if ":" in host else host
    return f"optuna-dashboard for {safe_url(storage_url)} at http://{shown}:{port}/ (Ctrl-C to stop)"


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Open the storage, print the URL, serve until Ctrl-C or SIGTERM (exit status 0)."""
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
        raise cannot_listen(host, port, err) from None
    with server, STOP.recording(*INTERRUPTS):
        if warning := exposure_warning("dashboard", storage_url, host):
            print(warning, file=sys.stderr, flush=True)
        print(banner(storage_url, host, port), flush=True)
        serve_until_stopped(server)
    return 0


def _server_class(host: str) -> type[WSGIServer]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return type("DashboardServer", (WSGIServer,), {"address_family": family})


def serve_until_stopped(server: WSGIServer) -> None:
    """Serve in a thread until SIGINT or SIGTERM is recorded (`foundation.stop`), then shut the server
    down between requests. Not by KeyboardInterrupt: wsgiref's handler catches every exception while
    it serves a request (a bare `except:`, to answer 500), so a Ctrl-C raised there was lost."""
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    while not STOP.wait(60):
        pass
    server.shutdown()  # returns once serve_forever has stopped
    serving.join()
