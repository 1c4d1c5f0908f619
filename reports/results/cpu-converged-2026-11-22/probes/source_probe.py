"""Does a trained run use its source? Dev perplexity with each dev source against its own
reference, and with the sources rotated by one (each reference scored against another sentence's
source). A model that translates gets much worse without its source; a decoder that has become a
language model of the target side barely notices.

    python reports/results/cpu-converged-2026-11-22/probes/source_probe.py RUN_DIR [RUN_DIR ...]

Reads each run's config.yaml, spm.model, dev.src.txt, dev.ref.txt and checkpoints/last.ckpt;
writes nothing. A diagnostic of this table's runs, not part of the harness.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import sentencepiece as spm
import torch
import yaml

from lightning_modules.config import TransformerConfig
from lightning_modules.data.batching import collate
from lightning_modules.loss import label_smoothed_nll
from lightning_modules.transformer import Transformer


def dev_ppl(model: Transformer, src: list[list[int]], tgt: list[list[int]], pad_id: int) -> float:
    nll = tokens = 0.0
    with torch.no_grad():
        for start in range(0, len(src), 64):
            batch = collate(list(zip(src[start:start + 64], tgt[start:start + 64])), pad_id)
            logits = model(batch["src"], batch["tgt_in"])
            _, n, k = label_smoothed_nll(logits, batch["tgt_out"], pad_id, 0.0)
            nll, tokens = nll + float(n), tokens + float(k)
    return math.exp(nll / tokens)


def probe(run: Path) -> str:
    config = yaml.safe_load((run / "config.yaml").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    model_keys = {k: v for k, v in config["model"].items() if v is not None}
    model = Transformer(TransformerConfig(**model_keys, vocab_size=sp.get_piece_size(), pad_id=sp.pad_id()))
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    model.eval()
    src = sp.encode((run / "dev.src.txt").read_text().splitlines())
    tgt = sp.encode((run / "dev.ref.txt").read_text().splitlines())
    own, rotated = dev_ppl(model, src, tgt, sp.pad_id()), dev_ppl(model, src[1:] + src[:1], tgt, sp.pad_id())
    return f"{run.name}: dev PPL {own:.2f} with its sources, {rotated:.2f} with the sources rotated by one ({rotated / own:.2f}x)"


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(probe(Path(path)), flush=True)
