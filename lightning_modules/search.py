"""Greedy and beam search over a `Transformer`, batched, with a key/value cache.

Beam search follows the paper (section 6.1): beam size 4, length penalty alpha = 0.6 as in GNMT,
lp(Y) = ((5 + |Y|) / 6) ** alpha, maximum output length = source length + 50, early termination
(a sentence stops once it has `beam_size` finished hypotheses). Finished sentences leave the
batch, so the work per step shrinks as decoding goes on.

The network runs through one of two decoders with the same interface. `_Growing` keeps
key/value caches that grow a position per step and drops the rows of finished sentences.
`_FixedSize` (`cuda_graphs=True`) keeps every row and cache slot for the whole batch, so that
every step has the same shapes and reads nothing on the host; on a CUDA device it captures the
step once per batch as a CUDA graph and replays it, so a step costs one launch on the host
instead of one per kernel (decoding a small model is bound by those launches). On a CPU the
same fixed-size step runs without a graph: the same numbers, for checking.
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


def _max_steps(model: Transformer, src: Tensor, max_len_offset: int) -> Tensor:
    """Per-sentence cap on output tokens (EOS included): its source length + `max_len_offset`,
    within the model's positions."""
    return ((src != model.config.pad_id).sum(dim=1) + max_len_offset).clamp(max=model.config.max_len)


def _only_eos(logp: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """Mask every token but EOS in the selected rows; EOS keeps its real log-probability."""
    not_eos = torch.arange(logp.size(-1), device=logp.device) != eos_id
    return logp.masked_fill(rows[:, None] & not_eos, float("-inf"))


def _encoded_rows(model: Transformer, src: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The encoder's memory and padding mask of `src`, repeated for each sentence's k rows."""
    memory, src_mask = model.encode(src)
    if k > 1:
        memory, src_mask = memory.repeat_interleave(k, dim=0), src_mask.repeat_interleave(k, dim=0)
    return memory, src_mask


class _Growing:
    """The network's side of a search, with caches that grow a position per step; the rows of
    finished sentences leave. Rows b·k .. b·k + k - 1 are sentence b's k beams."""

    def __init__(self, model: Transformer, src: Tensor, k: int) -> None:
        self.model, self.k, self.position = model, k, 0
        self.memory, self.src_mask = _encoded_rows(model, src, k)
        self.caches: list[dict] = [{} for _ in model.decoder]

    def logprobs(self, tokens: Tensor) -> Tensor:
        """Each row's last token (rows,) -> log-probabilities of its next one (rows, vocab), float32."""
        logits = self.model.decode_step(tokens, self.memory, self.src_mask, self.caches, self.position)
        self.position += 1
        return logits.float().log_softmax(-1)

    def reorder(self, rows: Tensor, live: Tensor | None) -> None:
        """Row r continues row `rows[r]` from now on; `live` (the sentences that go on, ascending;
        None when all do) decides which sentences' rows remain. The cross-attention's keys and
        values are the same for a sentence's k beams, so they follow the sentences only."""
        for cache in self.caches:
            cache["self_k"], cache["self_v"] = cache["self_k"][rows], cache["self_v"][rows]
        if live is None:
            return
        kept = (live[:, None] * self.k + torch.arange(self.k, device=live.device)).reshape(-1)
        self.memory, self.src_mask = self.memory[kept], self.src_mask[kept]
        for cache in self.caches:
            cache["cross_k"], cache["cross_v"] = cache["cross_k"][kept], cache["cross_v"][kept]


class _FixedSize:
    """The network's side of a search over fixed-size buffers (`Transformer.fixed_size_cache`):
    all batch·k rows stay, a finished sentence's computed and ignored; the search's rows (those
    of the sentences still going) are `index` among them. On a CUDA device the step (reordering
    the caches, the network, the log-softmax) is captured once as a CUDA graph and replayed."""

    def __init__(self, model: Transformer, src: Tensor, k: int, steps: int) -> None:
        self.model, self.k, self.step = model, k, 0
        self.memory, self.src_mask = memory, src_mask = _encoded_rows(model, src, k)
        self.caches = model.fixed_size_cache(memory, steps)
        rows, device = memory.size(0), memory.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # the graph's inputs ...
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.order = torch.arange(rows, device=device)  # row r continues row order[r] (beam search)
        self.index = torch.arange(rows, device=device)  # the search's rows among all rows
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Tensor | None = None  # ... and its output

    def _step(self) -> Tensor:
        if self.k > 1:
            for cache in self.caches:
                for name in ("self_k", "self_v"):
                    cache[name].copy_(cache[name].index_select(0, self.order))
        logits = self.model.decode_step(self.tokens, self.memory, self.src_mask, self.caches, self.position)
        return logits.float().log_softmax(-1)

    def _capture(self) -> None:
        """Record `_step` as a CUDA graph (after one warm-up run on a side stream, as CUDA graphs
        need: it writes slot 0, which the first replay writes again). Autocast's cache of cast
        weights cannot live across a capture, so the capture runs with it off."""
        dtype, on = torch.get_autocast_dtype("cuda"), torch.is_autocast_enabled("cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.autocast("cuda", dtype=dtype, enabled=on, cache_enabled=False):
            self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.autocast("cuda", dtype=dtype, enabled=on, cache_enabled=False):
            self.out = self._step()

    def logprobs(self, tokens: Tensor) -> Tensor:
        """As `_Growing.logprobs`, for the search's rows."""
        self.tokens.index_copy_(0, self.index, tokens)
        self.position.fill_(self.step)
        self.step += 1
        if self.memory.device.type != "cuda":
            return self._step().index_select(0, self.index)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.out.index_select(0, self.index)

    def reorder(self, rows: Tensor, live: Tensor | None) -> None:
        """As `_Growing.reorder`: the search's row r is `index[rows[r]]` continued; the rows of
        sentences that stop stay where they are, unused."""
        source = self.index[rows]
        if live is not None:
            self.index = self.index.view(-1, self.k)[live].reshape(-1)
        self.order.copy_(torch.arange(self.order.numel(), device=self.order.device).index_copy_(0, self.index, source))


def _decoder(model: Transformer, src: Tensor, k: int, steps: int, cuda_graphs: bool) -> _Growing | _FixedSize:
    return _FixedSize(model, src, k, steps) if cuda_graphs else _Growing(model, src, k)


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, bos_id: int, eos_id: int,
                  max_len_offset: int = 50, alpha: float = 0.6, cuda_graphs: bool = False) -> list[Hypothesis]:
    """Pick the most probable token at each step, for a batch of sources (B, S)."""
    batch = src.size(0)
    limit = _max_steps(model, src, max_len_offset)
    shortest, longest = int(limit.min()), int(limit.max())  # read once: no device read per step for them
    decoder = _decoder(model, src, 1, longest, cuda_graphs)
    token = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)
    log_prob = torch.zeros(batch, device=src.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    outputs: list[Tensor] = []
    for step in range(longest):
        logp = decoder.logprobs(token)
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
                alpha: float = 0.6, max_len_offset: int = 50, cuda_graphs: bool = False) -> list[Hypothesis]:
    """Best hypothesis per source sentence under the length-normalised score."""
    if beam_size == 1:
        return greedy_search(model, src, bos_id, eos_id, max_len_offset, alpha, cuda_graphs)
    device, k = src.device, beam_size
    batch = src.size(0)
    limit = _max_steps(model, src, max_len_offset).tolist()
    # Row b*k + j is beam j of sentence b.
    decoder = _decoder(model, src, k, max(limit), cuda_graphs)
    # Which sentences are still decoding is kept on the host: deciding it per sentence from a device
    # tensor would read the device once per sentence and step (a host sync each on a GPU).
    alive = list(range(batch))  # original index of each sentence still decoding
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step is not duplicated
    prefixes = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    for step in range(max(limit)):
        n = len(alive)
        logp = decoder.logprobs(prefixes[:, -1])
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
        decoder.reorder(rows, live if len(live_rows) < n else None)

    return [max(hyps, key=lambda h: h.score) if hyps else Hypothesis([], 0.0, 0.0)
            for hyps in finished]
