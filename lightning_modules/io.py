"""Atomic file writes: a reader sees the old file or the complete new one, never half of it."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_modules.faults import inject


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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints written to a temporary file, fsynced, then renamed into place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(path, buffer.getvalue(), "checkpoint_write", checkpoint.get("global_step"))
