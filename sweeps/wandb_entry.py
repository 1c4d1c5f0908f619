"""What a W&B sweep agent runs: `ablate train` into `<root>/<sweep id>/<run id>`, then the results
`RunResult` marks for the summary into the W&B run's summary. Exit status as `ablate train`'s."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse(argv: list[str]) -> tuple[Path, argparse.Namespace]:
    root = "runs/sweeps/wandb"
    if argv[:1] == ["--out-root"]:
        root, argv = argv[1], argv[2:]
    out = Path(root) / os.environ.get("WANDB_SWEEP_ID", "no-sweep") / os.environ.get("WANDB_RUN_ID", "local")
    parser = argparse.ArgumentParser(prog="sweeps.wandb_entry", allow_abbrev=False)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--row", default="base")
    parser.add_argument("--config")
    parser.add_argument("--spec")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return out, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from ablations.resolve import Recipe
    from foundation.errors import EXIT_INTERRUPTED, UserError, exit_status

    out, args = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = Recipe(args.preset, args.row, args.config, args.spec, tuple(args.overrides)).resolve()
        from lightning_modules.run.train import summary_table, train  # heavy: after validation

        results = train(cfg, out)
    except UserError as err:
        print(f"ablate: error: {err}", file=sys.stderr)
        return exit_status(err)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if results is None:  # another DDP rank
        return 0
    print("\n" + summary_table(results, out), flush=True)
    import wandb

    if wandb.run is not None:
        wandb.run.summary.update(results.select("summary"))
        wandb.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
