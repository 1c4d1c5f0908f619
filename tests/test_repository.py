"""What a clone downloads: the repository tracks no checkpoint and no file over 2 MB.

Checkpoints once made a clone hundreds of megabytes; they stay in history, but nothing new may join
them. A long table carries only its finished runs (json, csv, text and a small `attention.npz`)
in its archive.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 2 * 1024 * 1024


def tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout (git ls-files: {done.stderr.decode().strip()})")
    return [name for name in done.stdout.decode().split("\0") if name]


def test_no_checkpoint_is_tracked() -> None:
    checkpoints = [name for name in tracked_files() if name.endswith(".ckpt")]
    assert not checkpoints, f"checkpoints are tracked (git rm --cached them): {checkpoints}"


def test_no_tracked_file_is_over_2_mb() -> None:
    files = tracked_files()
    assert files, "git ls-files listed nothing"
    # a tracked file deleted in the working tree has no size here; git still holds it, but the commit
    # that deletes it is what a clone gets
    big = {name: size for name in files
           if (path := ROOT / name).is_file() and (size := path.stat().st_size) > MAX_BYTES}
    assert not big, "tracked files over 2 MB (results belong in json/csv/text, never binaries): " + \
        ", ".join(f"{name} ({size / 2**20:.1f} MB)" for name, size in sorted(big.items()))
