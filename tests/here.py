"""`ablate ARGS` run in the pytest process, for checks that are not about a process of its own.

Starting `python -m ablate` costs about 7 s of imports (torch, Lightning) before the command does
anything; most end-to-end tests check what a command wrote and printed, not how its own process
behaves under signals. Those call `ablate_here`. The workers and trials a command starts are still
processes of their own, and the tests that signal a command keep running it as one."""

from __future__ import annotations

import subprocess
from pathlib import Path

# Lightning's log handler writes to the sys.stderr of the moment lightning.pytorch is first imported.
# Imported inside a test, that is the test's capture, closed when the test ends, and every later
# in-process run's log line becomes a `--- Logging error ---` traceback in its own test's stderr. So
# any module that runs commands here imports it at collection, before a test's capture begins.
import lightning.pytorch  # noqa: F401
import pytest


def ablate_here(capfd: pytest.CaptureFixture[str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """What `ablate ARGS` typed in `cwd` (default: here) would return: its exit status, and what it
    and the processes it started printed, read at the file descriptors."""
    from ablate.cli import main
    from foundation.stop import STOP

    assert not STOP.requested, STOP.signals  # a stop recorded earlier in this process would pass on
    capfd.readouterr()  # what came before is not this command's
    with pytest.MonkeyPatch.context() as patch:
        if cwd is not None:
            patch.chdir(cwd)
        code = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["ablate", *args], code, out, err)
