"""Attention maps of a run's model on one sentence: one PNG per kind of attention (encoder
self-attention, decoder self-attention, encoder-decoder attention), a grid of layers × heads with
the wordpieces on the axes (the weights: `lightning_modules.run.attention`)."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lightning_modules.errors import UserError  # noqa: E402
from lightning_modules.run.io import atomic_write_bytes, check_writable_dir  # noqa: E402

if TYPE_CHECKING:  # torch: imported where a model is used, not by the report that imports this
    from lightning_modules.run.attention import AttentionMaps
    from lightning_modules.run.use import LoadedRun

ATTENTION_FILE = "attention.npz"  # lightning_modules.run.attention.ATTENTION_FILE (tests check they agree)

INCH_PER_PIECE = 0.17  # 30 wordpieces: a 5-inch panel, labels at 7 pt stay apart
MIN_PANEL_INCHES = 2.5


def attention_figure(maps: "AttentionMaps", kind: str, layers: list[int], heads: list[int]) -> plt.Figure:
    """A grid of `layers` (rows, 0-based) × `heads` (columns) panels of one kind's weights."""
    queries, keys = maps.labels[kind]
    size = max(MIN_PANEL_INCHES, INCH_PER_PIECE * max(len(queries), len(keys)) + 1.0)
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(size * len(heads), size * len(layers)),
                             squeeze=False)
    font = 7 if max(len(queries), len(keys)) <= 40 else 5
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(maps.weights[kind][layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0,
                      aspect="auto", interpolation="nearest")
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=font)
            ax.set_yticks(range(len(queries)), queries, fontsize=font)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
    fig.suptitle(kind, fontsize=12)
    fig.tight_layout()
    return fig


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


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
    """Translate `sentence` with the run's decoding settings, then draw its attention maps into
    `out` (one PNG per kind, named after it); the files written."""
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
    pictures = {kind: _png(attention_figure(maps, kind, layers, heads)) for kind in maps.weights}
    written = []
    for kind, png in pictures.items():
        path = out / f"{re.sub(r'[^a-z]+', '-', kind).strip('-')}.png"
        atomic_write_bytes(path, png)
        written.append(path)
    return written


HEADS_PER_LINE = 16


def group_attention_figure(rows: list[tuple[str, np.ndarray, list[str]]]) -> plt.Figure:
    """Per Table 3 row (label, its encoder self-attention (layers, heads, S, S), source pieces):
    the last encoder layer's heads side by side, 16 to a line; the wordpieces on the first panel
    of each row."""
    lines = [(label, w[-1], src, start) for label, w, src in rows
             for start in range(0, w.shape[1], HEADS_PER_LINE)]
    columns = min(HEADS_PER_LINE, max(w.shape[1] for _, w, _ in rows))
    panel = 1.6
    fig, axes = plt.subplots(len(lines), columns, figsize=(panel * columns + 1.5, panel * len(lines) + 0.8),
                             squeeze=False)
    for r, (label, last, src, start) in enumerate(lines):
        for c in range(columns):
            ax = axes[r][c]
            head = start + c
            if head >= last.shape[0]:
                ax.remove()
                continue
            ax.imshow(last[head], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_yticks(range(len(src)), src, fontsize=4)
                ax.set_ylabel(label if start == 0 else "", fontsize=9)
            ax.set_title(f"head {head + 1}", fontsize=6)
    fig.suptitle("last encoder layer, every head, on one dev sentence", fontsize=10)
    fig.tight_layout()
    return fig


def group_attention_pictures(runs, runs_dir: str | Path | None) -> dict[str, bytes]:
    """`attention_A.png` for the report: base and each row of group A (first seed), from the
    `attention.npz` each finished run keeps in its run directory under `runs_dir` (trials name it
    relative to that); nothing without `runs_dir`, or when base or no A row has one there (the
    run directories are on another machine, or the runs predate the file)."""
    if runs_dir is None or "run_dir" not in getattr(runs, "columns", ()):
        return {}
    rows = []
    for _, run in runs.sort_values("seed").drop_duplicates("row").iterrows():
        if run["row"] != "base" and run["group"] != "A":
            continue
        path = Path(runs_dir) / str(run["run_dir"] or "") / ATTENTION_FILE
        if not path.is_file():
            continue
        from lightning_modules.run.attention import KINDS, load_attention  # torch: only where a file is

        weights, source, _, _ = load_attention(path)
        rows.append((f"{run['row']} (h={weights[KINDS[0]].shape[1]})", weights[KINDS[0]], source))
    rows.sort(key=lambda r: not r[0].startswith("base "))  # base first, then the table's order
    if len(rows) < 2 or not rows[0][0].startswith("base "):
        return {}
    return {"attention_A.png": _png(group_attention_figure(rows))}
