"""Translation of a whole split with beam search, and sacreBLEU scoring with its signature."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from sacrebleu.metrics import BLEU

from lightning_modules.config import EvalConfig
from lightning_modules.data.batching import cut_points
from lightning_modules.base.faults import inject
from lightning_modules.search import beam_search
from lightning_modules.transformer import Transformer


def length_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length so each batch holds about `batch_tokens` source tokens."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    ends = cut_points(np.asarray(lengths)[order], batch_tokens)
    return [order[start:end].tolist() for start, end in zip([0, *ends[:-1]], ends)]


@torch.no_grad()
def translate(model: Transformer, sources: Sequence[list[int]], bos_id: int, eos_id: int,
              cfg: EvalConfig, beam_size: int | None = None) -> list[list[int]]:
    """Token ids of the best translation of each source (ids without specials), in input order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    limit = model.config.max_len - 1  # room for EOS
    sources = [list(s[:limit]) + [eos_id] for s in sources]
    outputs: list[list[int]] = [[] for _ in sources]
    for batch in length_batches([len(s) for s in sources], cfg.batch_tokens):
        width = max(len(sources[i]) for i in batch)
        src = torch.full((len(batch), width), model.config.pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        hyps = beam_search(model, src.to(device), bos_id, eos_id, beam_size or cfg.beam_size,
                           cfg.length_penalty, cfg.max_len_offset, cfg.cuda_graphs)
        for i, hyp in zip(batch, hyps):
            outputs[i] = hyp.tokens
        inject("decode")
    model.train(was_training)
    return outputs


def corpus_bleu(hypotheses: list[str], references: list[str], tokenize: str = "13a") -> tuple[float, str]:
    """sacreBLEU corpus BLEU of detokenized text and the signature that makes it reproducible."""
    metric = BLEU(tokenize=tokenize)
    score = metric.corpus_score(hypotheses, [references])
    return round(score.score, 2), str(metric.get_signature())


def translate_texts(model: Transformer, texts: list[str], encode: Callable[[list[str]], list[list[int]]],
                    decode: Callable[[list[int]], str], bos_id: int, eos_id: int,
                    cfg: EvalConfig) -> list[str]:
    """Raw source sentences in, detokenized translations out."""
    return [decode(ids) for ids in translate(model, encode(texts), bos_id, eos_id, cfg)]
