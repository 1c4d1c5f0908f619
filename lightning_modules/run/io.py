"""Atomic file writes: a reader sees the old file or the complete new one, never half of it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lightning_modules.run.faults import inject


def atomic_write_bytes(path: str | Path, data: bytes, fault: str | None = None,
                       step: int | None = None) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`.

    `fault` names the fault-injection point hit between writing and renaming (see `faults`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            half = len(data) // 2
            handle.write(data[:half])
            if fault:
                handle.flush()
                inject(fault, step)
            handle.write(data[half:])
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str, fault: str | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fault)


def atomic_write_json(path: str | Path, data: Any, fault: str | None = None) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", fault)


def write_lines(path: str | Path, lines: list[str]) -> None:
    """One sentence a line (newlines inside a sentence become spaces)."""
    atomic_write_text(path, "".join(" ".join(line.split("\n")) + "\n" for line in lines))
