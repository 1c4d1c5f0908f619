"""Local ports for tests that start servers on 127.0.0.1 (PostgreSQL, the dashboard, the storage
proxy, DDP rendezvous)."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Return once `proc` listens on `port`; fail the test with its output if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{proc.args} did not start listening: {proc.communicate()[0]}")
            time.sleep(0.2)
