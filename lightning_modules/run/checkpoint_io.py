"""Lightning checkpoints written atomically (see `io.atomic_write_bytes`)."""

from __future__ import annotations

import io
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from foundation.io import atomic_write_bytes


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints written to a temporary file, fsynced, then renamed into place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(path, buffer.getvalue(), "checkpoint_write", checkpoint.get("global_step"))
