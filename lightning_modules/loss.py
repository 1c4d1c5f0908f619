"""Label-smoothed cross-entropy (section 5.4 of the paper), without an fp32 copy of the full logits.

For one target token with logits x (V values), label y and smoothing ε:

    loss = lse(x) - (1 - ε)·x_y - ε·mean_v(x)     (= (1 - ε)·(-log p_y) + ε·mean_v(-log p_v))
    nll  = lse(x) - x_y
    ∂loss/∂x_v = softmax(x)_v - (1 - ε)·[v = y] - ε/V

`LabelSmoothedNLL` works through the rows in chunks of about CHUNK_ELEMENTS values: each chunk is
read into fp32 and reduced to three numbers per row (lse, x_y, mean), and in the backward pass its
gradient is formed in fp32 and written straight in the logits' dtype. The textbook form, a
log-softmax of the whole (N, V) matrix in fp32, keeps an fp32 copy of bf16 logits and of their
gradient (25K tokens × 37,000 pieces: 3.7 GB each); in an eager base step on an H100 it took ~20 %
of the GPU time (benchmarks/results/gpu-h100-2026-11-22b). It stays in use where it costs
nothing: fp32 logits that fit one chunk (CPU training; there the chunked form was 4-30 % slower
on 1,500 × 2,000-37,000 logits and 2× faster on 6,000 × 37,000), and under torch.compile, which
fuses it into a few kernels itself (a Python loop over a symbolic row count would not trace).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 1 << 24  # fp32 values per chunk: 64 MB


def _terms(x: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of logits `x` (rows, V): logsumexp, the target's logit and the mean logit, in fp32."""
    x = x.float()
    return torch.logsumexp(x, dim=-1), x.gather(1, target.unsqueeze(1)).squeeze(1), x.mean(dim=-1)


def _chunks(rows: int, vocab: int) -> list[slice]:
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    return [slice(start, start + step) for start in range(0, rows, step)]


class LabelSmoothedNLL(torch.autograd.Function):
    """(summed smoothed loss, summed NLL) of logits (N, V) against targets (N,), rows where
    `keep` is False left out; the NLL carries no gradient."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, keep: Tensor, epsilon: float
                ) -> tuple[Tensor, Tensor]:
        n, vocab = logits.shape
        lse, target_logit, mean_logit = (logits.new_empty(n, dtype=torch.float32) for _ in range(3))
        for rows in _chunks(n, vocab):
            lse[rows], target_logit[rows], mean_logit[rows] = _terms(logits[rows], target[rows])
        nll_tokens = (lse - target_logit).masked_fill(~keep, 0.0)
        loss_tokens = (lse - (1 - epsilon) * target_logit - epsilon * mean_logit).masked_fill(~keep, 0.0)
        ctx.save_for_backward(logits, target, keep)
        ctx.epsilon = epsilon
        nll = nll_tokens.sum()
        ctx.mark_non_differentiable(nll)
        return loss_tokens.sum(), nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, keep = ctx.saved_tensors
        epsilon, (n, vocab) = ctx.epsilon, logits.shape
        grad = torch.empty_like(logits)
        scale = grad_loss.float() * keep.float()  # (N,): 0 on left-out rows
        for rows in _chunks(n, vocab):
            s = scale[rows, None]
            # (softmax - ε/V)·s, then -(1 - ε)·s at the target: one fused pass after the softmax
            g = torch.addcmul(s * (-epsilon / vocab), torch.softmax(logits[rows].float(), dim=-1), s)
            grad[rows] = g.scatter_add_(1, target[rows, None], s * -(1 - epsilon))
        return grad, None, None, None


def _whole(flat: Tensor, target: Tensor, keep: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The textbook form: one log-softmax of the whole matrix in fp32, autograd for the rest."""
    lprobs = F.log_softmax(flat.float(), dim=-1)
    nll_tokens = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)
    loss_tokens = (1 - epsilon) * nll_tokens - epsilon * lprobs.mean(dim=-1)
    return loss_tokens.masked_fill(~keep, 0.0).sum(), nll_tokens.detach().masked_fill(~keep, 0.0).sum()


def label_smoothed_nll(logits: Tensor, target: Tensor, pad_id: int,
                       epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed loss, summed plain NLL and the number of non-pad target tokens.

    `logits` (..., V) and `target` (...); positions whose target is `pad_id` count for nothing
    (neither the loss nor the gradient sees what their logits hold). PyTorch's definition of
    smoothing: (1 - ε)·(-log p_y) + ε·mean_v(-log p_v).
    """
    flat = logits.reshape(-1, logits.size(-1))
    keep = target.reshape(-1) != pad_id
    flat_target = target.reshape(-1).masked_fill(~keep, 0)
    if torch.compiler.is_compiling() or (flat.dtype == torch.float32 and flat.numel() <= CHUNK_ELEMENTS):
        loss, nll = _whole(flat, flat_target, keep, epsilon)
    else:
        loss, nll = LabelSmoothedNLL.apply(flat, flat_target, keep, epsilon)
    return loss, nll, keep.sum()


class ProjectedLabelSmoothedNLL(torch.autograd.Function):
    """(summed smoothed loss, summed NLL) of hidden states (N, d) through the pre-softmax matrix
    `weight` (V, d), rows where `keep` is False left out; the NLL carries no gradient.

    Method: the rows, padded to a multiple of `chunks` with left-out rows, are cut into `chunks`
    equal pieces (always that many: a traced step has no data-dependent loop, and no guard on the
    row count's remainder, which `tensor_split` would add and recompile for). Each piece's logits
    are formed, reduced to its loss terms and turned into its gradients with respect to the hidden
    states and the weight in the forward pass (∂loss/∂x as in `LabelSmoothedNLL`), then dropped: the full (N, V) logits never
    exist, in any dtype. The backward pass scales those gradients by the incoming one (the loss is
    a scalar). The matmuls run in whatever dtype autocast gives them.
    """

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, target: Tensor, keep: Tensor, epsilon: float,
                chunks: int) -> tuple[Tensor, Tensor]:
        (n, d), vocab = hidden.shape, weight.size(0)
        rows = (n + chunks - 1) // chunks  # per piece; the last rows are padding, left out (keep False)
        pad = rows * chunks - n
        pieces = (F.pad(hidden, (0, 0, 0, pad)).view(chunks, rows, d), F.pad(target, (0, pad)).view(chunks, rows),
                  F.pad(keep, (0, pad)).view(chunks, rows))
        loss, nll = hidden.new_zeros((), dtype=torch.float32), hidden.new_zeros((), dtype=torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_hidden = []
        for i in range(chunks):
            h, t, k = (piece[i] for piece in pieces)
            x = (h @ weight.t()).float()  # (rows, V) logits of this piece only
            lse, x_t = torch.logsumexp(x, dim=-1), x.gather(1, t.unsqueeze(1)).squeeze(1)
            loss = loss + (lse - (1 - epsilon) * x_t - epsilon * x.mean(dim=-1)).masked_fill(~k, 0.0).sum()
            nll = nll + (lse - x_t).masked_fill(~k, 0.0).sum()
            s = k.float()[:, None]  # (rows, 1): 0 on left-out rows
            g = torch.addcmul(s * (-epsilon / vocab), torch.softmax(x, dim=-1), s)
            g = g.scatter_add(1, t[:, None], s * -(1 - epsilon))  # (n, V) ∂loss/∂logits
            grad_hidden.append((g @ weight).to(hidden.dtype))  # (rows, d)
            grad_weight = grad_weight + (g.t() @ h).float()  # (V, d)
        ctx.save_for_backward(torch.cat(grad_hidden)[:n], grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss.to(grad_weight.dtype),
                None, None, None, None)


def projected_label_smoothed_nll(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, epsilon: float,
                                 chunks: int) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_nll` of the logits `hidden @ weight.T` (hidden (..., d), weight (V, d)),
    computed in `chunks` row pieces without forming the full logits (`ProjectedLabelSmoothedNLL`)."""
    flat = hidden.reshape(-1, hidden.size(-1))  # (N, d)
    keep = target.reshape(-1) != pad_id
    flat_target = target.reshape(-1).masked_fill(~keep, 0)
    loss, nll = ProjectedLabelSmoothedNLL.apply(flat, weight, flat_target, keep, epsilon, chunks)
    return loss, nll, keep.sum()
