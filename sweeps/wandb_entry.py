"""What a W&B sweep agent runs: `ablate train ARGS --out <root>/<sweep id>/<run id>`.

`--out-root DIR` (first, optional; default runs/sweeps/wandb) is this shim's only option; every
other argument goes to `ablate train` unchanged. After training, dev BLEU is written to the W&B
run's summary so a sweep can maximise it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from lightning_modules.cli import main as ablate

    args = list(sys.argv[1:] if argv is None else argv)
    root = "runs/sweeps/wandb"
    if args[:1] == ["--out-root"]:
        root, args = args[1], args[2:]
    out = Path(root) / os.environ.get("WANDB_SWEEP_ID", "no-sweep") / os.environ.get("WANDB_RUN_ID", "local")
    code = ablate(["train", "--out", str(out), *args])
    results = out / "results.json"
    if code == 0 and results.is_file():
        import wandb

        if wandb.run is not None:
            data = json.loads(results.read_text(encoding="utf-8"))
            wandb.run.summary.update({k: data.get(k) for k in ("bleu", "ppl", "test_bleu", "params")})
            wandb.finish()
    return code


if __name__ == "__main__":
    sys.exit(main())
