"""Translation of a whole split with beam search, and sacreBLEU scoring with its signature."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sacrebleu.metrics import BLEU
from torch.nn.utils.rnn import pad_sequence

from lightning_modules.config import EvalConfig
from lightning_modules.data.batching import cut_points
from foundation.faults import inject
from lightning_modules.search import beam_search
from lightning_modules.transformer import Transformer


def length_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length so each batch holds about `batch_tokens` source tokens."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    ends = cut_points(np.asarray(lengths)[order], batch_tokens)
    return [order[start:end].tolist() for start, end in zip([0, *ends[:-1]], ends)]


@torch.no_grad()
def translate(model: Transformer, sources: Sequence[list[int]], bos_id: int, eos_id: int,
              cfg: EvalConfig) -> list[list[int]]:
    """Token ids of the best translation of each source (ids without specials), in input order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    limit = model.config.max_len - 1  # room for EOS
    sources = [list(s[:limit]) + [eos_id] for s in sources]
    outputs: list[list[int]] = [[] for _ in sources]
    for batch in length_batches([len(s) for s in sources], cfg.batch_tokens):
        src = pad_sequence([torch.tensor(sources[i]) for i in batch], batch_first=True,
                           padding_value=model.config.pad_id)
        hyps = beam_search(model, src.to(device), bos_id, eos_id, cfg.beam_size,
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
