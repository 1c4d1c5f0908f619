"""Attention maps of a run's model on one sentence (one PNG per kind of attention: layers × heads)
and the report's group A figure; the weights are `run.attention`'s, the drawing `run.attention_figures`'."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from foundation.errors import UserError
from lightning_modules.run.attention_figures import (ATTENTION_FILE, attention_figure, group_attention_figure, png_bytes,
                                                     saved_row)
from foundation.io import atomic_write_bytes, check_writable_dir

if TYPE_CHECKING:  # torch: imported where a model is used, not by the report that imports this
    from lightning_modules.run.use import LoadedRun


def _pick(what: str, chosen: int | None, count: int) -> list[int]:
    if chosen is None:
        return list(range(count))
    if not 1 <= chosen <= count:
        raise UserError(f"--{what} {chosen}: the model has {what}s 1 to {count}")
    return [chosen - 1]


def dev_line(run: "LoadedRun", line: int) -> str:
    """Line `line` (from 1) of the run's dev sources (dev.src.txt, written when the run finished)."""
    path = run.run_dir / "dev.src.txt"
    if not path.is_file():
        raise UserError(f"{run.run_dir} has no dev.src.txt (a finished run writes it); use --sentence")
    lines = path.read_text(encoding="utf-8").splitlines()
    if not 1 <= line <= len(lines):
        raise UserError(f"--line {line}: the dev set has lines 1 to {len(lines)}")
    return lines[line - 1]


def write_attention(run: "LoadedRun", sentence: str, out: str | Path, layer: int | None = None,
                    head: int | None = None) -> list[Path]:
    """Translate `sentence`, then draw its attention maps into `out` (a PNG per kind); the files."""
    from lightning_modules.data.tokenizer import BOS_ID, EOS_ID
    from lightning_modules.evaluate import translate
    from lightning_modules.run.attention import attention_maps
    from lightning_modules.run.use import check_known

    out = Path(out)
    check_writable_dir(out, "the attention maps")
    c = run.model.config
    layers, heads = _pick("layer", layer, c.n_layers), _pick("head", head, c.n_heads)
    if not sentence.strip():
        raise UserError("the sentence is empty")
    src = run.encode([sentence])[0][: run.max_len - 1]
    check_known(run, src, "the sentence")
    with run.autocast():
        tgt = translate(run.model, [src], BOS_ID, EOS_ID, run.eval_config)[0][: run.max_len - 1]
    maps = attention_maps(run.model, src, tgt, run.pieces)
    pictures = {kind: png_bytes(attention_figure(maps, kind, layers, heads)) for kind in maps.weights}
    written = []
    for kind, png in pictures.items():
        path = out / f"{re.sub(r'[^a-z]+', '-', kind).strip('-')}.png"
        atomic_write_bytes(path, png)
        written.append(path)
    return written


def group_attention_pictures(runs, runs_dir: str | Path | None) -> dict[str, bytes]:
    """`attention_A.png`: base and group A's rows, from the runs' `attention.npz` under `runs_dir`."""
    if runs_dir is None or "run_dir" not in getattr(runs, "columns", ()):
        return {}
    rows = []
    for _, run in runs.sort_values("seed").drop_duplicates("row").iterrows():
        if run["row"] != "base" and run["group"] != "A":
            continue
        path = Path(runs_dir) / str(run["run_dir"] or "") / ATTENTION_FILE
        if not path.is_file():
            continue
        rows.append(saved_row(path, run["row"]))
    rows.sort(key=lambda r: not r[0].startswith("base "))  # base first, then the table's order
    if len(rows) < 2 or not rows[0][0].startswith("base "):
        return {}
    return {"attention_A.png": png_bytes(group_attention_figure(rows))}
