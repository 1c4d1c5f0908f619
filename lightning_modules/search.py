"""Greedy and beam search over a `Transformer`, batched, with a key/value cache.

Beam search follows the paper (section 6.1): beam size 4, length penalty alpha = 0.6 as in GNMT,
lp(Y) = ((5 + |Y|) / 6) ** alpha, maximum output length = source length + 50, early termination
(a sentence stops once it has `beam_size` finished hypotheses). Finished sentences leave the
batch, so the work per step shrinks as decoding goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_modules.transformer import Transformer


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS, without EOS
    log_prob: float  # sum of token log-probabilities, EOS included
    score: float  # log_prob / length penalty (the quantity beam search maximises)


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha; |Y| counts the EOS token."""
    return ((5.0 + length) / 6.0) ** alpha


def _source_lengths(model: Transformer, src: Tensor) -> Tensor:
    return (src != model.config.pad_id).sum(dim=1)


def _max_steps(model: Transformer, src: Tensor, max_len_offset: int) -> Tensor:
    """Per-sentence cap on output tokens (EOS included), within the model's positions."""
    return (_source_lengths(model, src) + max_len_offset).clamp(max=model.config.max_len)


def _only_eos(logp: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """Mask every token but EOS in the selected rows; EOS keeps its real log-probability."""
    not_eos = torch.arange(logp.size(-1), device=logp.device) != eos_id
    return logp.masked_fill(rows[:, None] & not_eos, float("-inf"))


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, bos_id: int, eos_id: int,
                  max_len_offset: int = 50, alpha: float = 0.6) -> list[Hypothesis]:
    """Pick the most probable token at each step, for a batch of sources (B, S)."""
    memory, src_mask = model.encode(src)
    batch = src.size(0)
    limit = _max_steps(model, src, max_len_offset)
    caches: list[dict] = [{} for _ in model.decoder]
    token = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)
    log_prob = torch.zeros(batch, device=src.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    outputs: list[Tensor] = []
    shortest, longest = int(limit.min()), int(limit.max())  # read once: no device read per step for them
    for step in range(longest):
        logp = model.decode_step(token, memory, src_mask, caches, step).float().log_softmax(-1)
        if step + 1 >= shortest:  # where the cap is reached, only EOS remains possible
            logp = _only_eos(logp, (step + 1 >= limit) & ~done, eos_id)
        best_logp, token = logp.max(dim=-1)
        log_prob += torch.where(done, 0.0, best_logp)
        token = torch.where(done, torch.full_like(token, eos_id), token)
        outputs.append(token)
        done |= token == eos_id
        if bool(done.all()):
            break
    hyps = []
    steps = torch.stack(outputs, dim=1).tolist()
    for row, lp in zip(steps, log_prob.tolist()):
        tokens = row[: row.index(eos_id)] if eos_id in row else row
        hyps.append(Hypothesis(tokens, lp, lp / length_penalty(len(tokens) + 1, alpha)))
    return hyps


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, bos_id: int, eos_id: int, beam_size: int = 4,
                alpha: float = 0.6, max_len_offset: int = 50) -> list[Hypothesis]:
    """Best hypothesis per source sentence under the length-normalised score."""
    if beam_size == 1:
        return greedy_search(model, src, bos_id, eos_id, max_len_offset, alpha)
    device, k = src.device, beam_size
    memory, src_mask = model.encode(src)
    batch = src.size(0)
    limit = _max_steps(model, src, max_len_offset).tolist()
    # Expand to (batch * k) rows: row b*k + j is beam j of sentence b.
    memory = memory.repeat_interleave(k, dim=0)
    src_mask = src_mask.repeat_interleave(k, dim=0)
    caches: list[dict] = [{} for _ in model.decoder]
    # Which sentences are still decoding is kept on the host: deciding it per sentence from a device
    # tensor would read the device once per sentence and step (a host sync each on a GPU).
    alive = list(range(batch))  # original index of each sentence still decoding
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step is not duplicated
    prefixes = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    for step in range(max(limit)):
        n = len(alive)
        logp = model.decode_step(prefixes[:, -1], memory, src_mask, caches, step).float()
        logp = logp.log_softmax(-1)
        vocab = logp.size(-1)
        at_limit = [step + 1 >= limit[b] for b in alive]  # these sentences must end now
        if any(at_limit):
            logp = _only_eos(logp, torch.tensor(at_limit, device=device).repeat_interleave(k), eos_id)
        candidates = (scores[:, :, None] + logp.view(n, k, vocab)).view(n, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)  # (n, 2k)
        origin, token = top_index // vocab, top_index % vocab
        is_eos = token == eos_id
        # Continue with the best k candidates that did not end.
        masked = top_scores.masked_fill(is_eos, float("-inf"))
        keep_scores, keep = masked.topk(k, dim=1)  # (n, k) positions within the 2k candidates

        # One read of the device per step: the top k's scores, beams and ends, and whether each
        # sentence has a candidate left to continue (beams < k and 0/1 are exact in float).
        read = torch.cat([top_scores[:, :k], origin[:, :k].to(top_scores.dtype), is_eos[:, :k].to(top_scores.dtype),
                          keep_scores[:, :1]], dim=1).tolist()
        # Finalise EOS candidates ranked within the top k (as in fairseq / GNMT).
        eos_hits = [(i, j) for i, row in enumerate(read) for j in range(k)
                    if row[2 * k + j] and row[j] > float("-inf") and len(finished[alive[i]]) < k]
        if eos_hits:
            beams = [i * k + int(read[i][k + j]) for i, j in eos_hits]
            ended = prefixes[torch.tensor(beams, device=device), 1:].tolist()
            for (i, j), tokens in zip(eos_hits, ended):
                hyps, lp = finished[alive[i]], read[i][j]
                if len(hyps) < k:
                    hyps.append(Hypothesis(tokens, lp, lp / length_penalty(len(tokens) + 1, alpha)))

        done = [len(finished[b]) >= k or at_limit[i] or read[i][3 * k] == float("-inf") for i, b in enumerate(alive)]
        if all(done):
            break
        live_rows = [i for i, d in enumerate(done) if not d]
        live = torch.tensor(live_rows, device=device)
        keep_origin = origin.gather(1, keep)
        keep_token = token.gather(1, keep)
        rows = (torch.arange(n, device=device)[:, None] * k + keep_origin)  # (n, k) source rows
        rows = rows[live].reshape(-1)
        prefixes = torch.cat([prefixes[rows], keep_token[live].reshape(-1, 1)], dim=1)
        scores = keep_scores[live]
        alive = [alive[i] for i in live_rows]
        for cache in caches:
            for name, tensor in cache.items():
                cache[name] = tensor[rows]
        if len(live_rows) < n:
            sentence_rows = (live[:, None] * k + torch.arange(k, device=device)).reshape(-1)
            memory, src_mask = memory[sentence_rows], src_mask[sentence_rows]

    return [max(hyps, key=lambda h: h.score) if hyps else Hypothesis([], 0.0, 0.0)
            for hyps in finished]
