"""The attention pictures and a finished run's `attention.npz`, without torch, so that the report, the
archive and a run's W&B logging share one drawing and one file format."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ATTENTION_FILE = "attention.npz"
KINDS = ("encoder self-attention", "decoder self-attention", "encoder-decoder attention")

INCH_PER_PIECE = 0.17  # 30 wordpieces: a 5-inch panel, labels at 7 pt stay apart
MIN_PANEL_INCHES = 2.5
HEADS_PER_LINE = 16


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display), imported where a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def kind_key(kind: str) -> str:
    """The npz key of one kind ('encoder self-attention' -> 'encoder_self_attention')."""
    return kind.replace("-", "_").replace(" ", "_")


def load_attention(path) -> tuple[dict[str, Any], list[str], list[str], int]:
    """A saved `attention.npz`: (weights by kind, source pieces, target pieces, dev line from 1)."""
    with np.load(path, allow_pickle=False) as saved:
        weights = {kind: saved[kind_key(kind)].astype(np.float32) for kind in KINDS}
        return weights, saved["source"].tolist(), saved["target"].tolist(), int(saved["line"])


def png_bytes(fig: "Figure") -> bytes:
    """The figure as PNG bytes (no software stamp: the same figure gives the same bytes); closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    _pyplot().close(fig)
    return buf.getvalue()


def attention_figure(maps, kind: str, layers: list[int], heads: list[int]) -> "Figure":
    """A grid of `layers` × `heads` (0-based) panels of one kind's weights in `maps` (`AttentionMaps`)."""
    plt = _pyplot()
    queries, keys = maps.labels[kind]
    size = max(MIN_PANEL_INCHES, INCH_PER_PIECE * max(len(queries), len(keys)) + 1.0)
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(size * len(heads), size * len(layers)),
                             squeeze=False)
    font = 7 if max(len(queries), len(keys)) <= 40 else 5
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(np.asarray(maps.weights[kind][layer, head]), cmap="viridis", vmin=0.0, vmax=1.0,
                      aspect="auto", interpolation="nearest")
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=font)
            ax.set_yticks(range(len(queries)), queries, fontsize=font)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
    fig.suptitle(kind, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # tight_layout ignores the suptitle
    return fig


def group_attention_figure(rows: list[tuple[str, np.ndarray, list[str]]]) -> "Figure":
    """Per row (label, encoder self-attention, source pieces): the last layer's heads, 16 to a line."""
    plt = _pyplot()
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


def saved_row(path: str | Path, row: str) -> tuple[str, np.ndarray, list[str]]:
    """A run's `attention.npz` as a group figure's row: ('ROW (h=H)', encoder self-attention, source)."""
    weights, source, _, _ = load_attention(path)
    encoder = weights[KINDS[0]]
    return f"{row} (h={encoder.shape[1]})", encoder, source


def run_attention_png(path: str | Path, row: str) -> bytes:
    """A finished run's own figure (its W&B record's): the report's group figure for this run alone."""
    return png_bytes(group_attention_figure([saved_row(path, row)]))
