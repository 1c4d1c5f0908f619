"""Parameter counts of every ablation row at the paper's scale, beside the paper's printed values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foundation.errors import UserError
from lightning_modules.config import MODIFICATION_KEYS, ScaleConfig, TransformerConfig, count_parameters, modifications
from ablations.spec import load_preset, load_spec, row_settings


def paper_architecture(row: str, spec: dict[str, dict[str, Any]], vocab_size: int = 37000) -> TransformerConfig:
    """The row's model at the paper's scale (d_k, d_v derived where the row leaves them out)."""
    max_len = load_preset("paper").get("model", {}).get("max_len", TransformerConfig.max_len)
    model = row_settings(row, spec, ScaleConfig())["model"]
    try:
        return TransformerConfig(**{**model, "vocab_size": vocab_size, "max_len": max_len})
    except UserError as err:  # a model the row cannot build (n_kv_heads: 3 of 8 heads): name the row
        raise UserError(f"row {row!r}: {err}") from None


def row_vocabulary(row: str, spec: dict[str, dict[str, Any]], vocab_size: int) -> int:
    """The row's vocabulary when base's is `vocab_size`, scaled as a preset scales it (else base's)."""
    paper = load_preset("paper")["data"]["vocab_size"]
    data = row_settings(row, spec, ScaleConfig(), {"data.vocab_size": vocab_size / paper}).get("data", {})
    return int(data.get("vocab_size", vocab_size))


def params_table(vocab_size: int = 37000, spec_path: str | Path | None = None) -> list[dict[str, Any]]:
    """One entry per row: architecture, vocabulary, our closed-form count and the paper's (M or None)."""
    spec = load_spec(spec_path)
    table = []
    for row, entry in spec.items():
        vocab = row_vocabulary(row, spec, vocab_size)
        c = paper_architecture(row, spec, vocab)
        n = count_parameters(c)
        table.append({"row": row, "group": entry.get("group", row), "vocab": vocab, "N": c.n_layers, "d_model": c.d_model,
                      "d_ff": c.d_ff, "h": c.n_heads, "d_k": c.d_k, "d_v": c.d_v,
                      "positional": c.positional, **{key: getattr(c, key) for key in MODIFICATION_KEYS},
                      "modifications": modifications(c), "params": n, "params_M": round(n / 1e6, 1),
                      "paper_params": (entry.get("paper") or {}).get("params_m")})
    return table


def format_params(table: list[dict], vocab_size: int) -> str:
    """Plain-text table of every row's architecture and parameter count."""
    cols = ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "positional", "params", "params_M", "paper_params"]
    if any(entry["vocab"] != vocab_size for entry in table):  # a row with a vocabulary of its own
        cols.insert(1, "vocab")
    if any(entry["modifications"] for entry in table):
        cols.insert(cols.index("params"), "modifications")
    head = {"paper_params": "paper (M)", "params_M": "ours (M)"}
    cells = [[head.get(c, c) for c in cols]]
    cells += [["" if entry.get(c) is None else (f"{entry[c]:,}" if c in ("params", "vocab") else str(entry[c]))
               for c in cols]
              for entry in table]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    left = {0, cols.index("modifications")} if "modifications" in cols else {0}
    lines = ["  ".join(v.ljust(w) if i in left else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "-" * len(lines[0]))
    return (f"Parameters with a shared vocabulary of {vocab_size:,} (a row's own vocabulary where it sets one; "
            f"paper: printed values)\n" + "\n".join(lines))
