"""`ablate storage-proxy`: Optuna's gRPC storage proxy in front of an RDB until stopped; it has no
authentication, so it listens on 127.0.0.1 unless `--host` says otherwise (docs/scale-out.md)."""

from __future__ import annotations

import os
import socket
import sys

from foundation.errors import UserError
from foundation.stop import INTERRUPTS, interrupting
from sweeps.dashboard import cannot_listen
from sweeps.optuna_api import serve_grpc_proxy
from sweeps.storage import GRPC_SCHEME, GRPC_HINT, exposure_warning, journal_path, make_storage, safe_url


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 13000, create: bool = False) -> int:
    """Serve the existing RDB at `storage_url` (a new one with `create`) on host:port until stopped."""
    if journal_path(storage_url) or storage_url.startswith(GRPC_SCHEME):
        raise UserError(f"the storage proxy serves an RDB (sqlite:///..., postgresql+psycopg2://...), "
                        f"not {safe_url(storage_url)}")
    if not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    storage = make_storage(storage_url, heartbeat_s=None, existing=not create)  # the clients beat
    _check_port(host, port)
    if warning := exposure_warning("storage proxy", storage_url, host):
        print(warning, file=sys.stderr, flush=True)
    # gRPC's C core would log to stderr before its error reaches us: ours is the one line
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    shown = f"[{host}]" if ":" in host else host
    # The one stop that raises in sweeps: `run_grpc_proxy_server` blocks until the process ends and
    # hands out no server to shut down. Set before the banner, which promises a clean stop.
    try:
        with interrupting(*INTERRUPTS):
            print(f"storage proxy for {safe_url(storage_url)} at grpc://{shown}:{port} (Ctrl-C to stop)",
                  flush=True)
            serve_grpc_proxy(storage, host, port)
    except KeyboardInterrupt:
        pass
    except ImportError:
        raise UserError(GRPC_HINT) from None
    except RuntimeError as err:  # grpc: the port is taken, or the host is not this machine's
        raise UserError(f"cannot listen on {host}:{port}: {err}") from None
    return 0


def _check_port(host: str, port: int) -> None:
    """Bind host:port once (SO_REUSEADDR, as gRPC binds) so that a port in use is one line first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        raise cannot_listen(host, port, err) from None
