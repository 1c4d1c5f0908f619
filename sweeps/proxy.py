"""`ablate storage-proxy`: Optuna's gRPC storage proxy (`run_grpc_proxy_server`) in front of an RDB,
until Ctrl-C or SIGTERM. Workers reach it with `--storage grpc://HOST:PORT`.

The proxy has no authentication and no encryption: whoever reaches the port can read and edit
every study of the database. It listens on 127.0.0.1 unless `--host` says otherwise; expose it on
a trusted cluster network only (or through an SSH tunnel).
"""

from __future__ import annotations

from lightning_modules.errors import UserError
from lightning_modules.run.stop import INTERRUPTS, interrupting
from sweeps.optuna_api import serve_grpc_proxy
from sweeps.storage import GRPC_SCHEME, GRPC_HINT, journal_path, make_storage, safe_url


def serve(storage_url: str, host: str = "127.0.0.1", port: int = 13000) -> int:
    """Serve the RDB at `storage_url` on host:port until interrupted (exit status 0)."""
    if journal_path(storage_url) or storage_url.startswith(GRPC_SCHEME):
        raise UserError(f"the storage proxy serves an RDB (sqlite:///..., postgresql+psycopg2://...), "
                        f"not {safe_url(storage_url)}")
    if not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    storage = make_storage(storage_url, heartbeat_s=None)  # the clients beat (sweeps.optuna_api)
    shown = f"[{host}]" if ":" in host else host
    print(f"storage proxy for {safe_url(storage_url)} at grpc://{shown}:{port} (Ctrl-C to stop)", flush=True)
    # The one stop that raises in sweeps: Optuna's `run_grpc_proxy_server` blocks until the process
    # ends and hands out no server to shut down, so there is no point at which to look at a request.
    try:
        with interrupting(*INTERRUPTS):
            serve_grpc_proxy(storage, host, port)
    except KeyboardInterrupt:
        pass
    except ImportError:
        raise UserError(GRPC_HINT) from None
    except RuntimeError as err:  # grpc: the port is taken, or the host is not this machine's
        raise UserError(f"cannot listen on {host}:{port}: {err}") from None
    return 0
