"""Label-smoothed cross-entropy (section 5.4 of the paper), without an fp32 copy of the full logits.
For one target token with logits x (V values), label y and smoothing ε:

    loss = lse(x) - (1 - ε)·x_y - ε·mean_v(x)     (= (1 - ε)·(-log p_y) + ε·mean_v(-log p_v))
    nll  = lse(x) - x_y
    ∂loss/∂x_v = softmax(x)_v - (1 - ε)·[v = y] - ε/V

The textbook form, a log-softmax of the (N, V) matrix in fp32 with autograd, keeps fp32 copies of the
bf16 logits and their gradient (3.7 GB each at 25K tokens × 37,000 pieces; docs/gpu-performance.md).
`LabelSmoothedNLL` reads the logits once each way, forming the gradient in the logits' dtype, eager in
chunks of about CHUNK_ELEMENTS values, compiled in one piece (no loop over a symbolic row count). The
textbook form stays where it costs nothing: eager fp32 logits within one chunk (faster on a CPU)."""

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
    """Row slices of about CHUNK_ELEMENTS values; one slice of everything when compiling."""
    if torch.compiler.is_compiling():
        return [slice(None)]
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    return [slice(start, start + step) for start in range(0, rows, step)]


def _grad(x: Tensor, target: Tensor, lse: Tensor, scale: Tensor, epsilon: float) -> Tensor:
    """∂loss/∂x of logits `x` (rows, V), rows scaled by `scale`: compiled, one pointwise kernel (a
    scatter would write the fp32 gradient out first); eager, in place with a scatter (2× faster on CPU)."""
    vocab = x.size(-1)
    if torch.compiler.is_compiling():
        is_target = torch.arange(vocab, device=x.device) == target[:, None]
        g = torch.exp(x.float() - lse[:, None]) - epsilon / vocab - is_target * (1 - epsilon)
        return (g * scale[:, None]).to(x.dtype)
    g = (x.float() - lse[:, None]).exp_().sub_(epsilon / vocab).mul_(scale[:, None])
    return g.scatter_add_(1, target[:, None], (scale * -(1 - epsilon))[:, None]).to(x.dtype)


class LabelSmoothedNLL(torch.autograd.Function):
    """(summed smoothed loss, summed NLL) of logits (N, V), rows not `keep` left out; NLL without gradient."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, keep: Tensor, epsilon: float
                ) -> tuple[Tensor, Tensor]:
        pieces = _chunks(*logits.shape)
        if len(pieces) == 1:
            lse, target_logit, mean_logit = _terms(logits, target)
        else:
            lse, target_logit, mean_logit = (logits.new_empty(logits.size(0), dtype=torch.float32) for _ in range(3))
            for rows in pieces:
                lse[rows], target_logit[rows], mean_logit[rows] = _terms(logits[rows], target[rows])
        nll_tokens = (lse - target_logit).masked_fill(~keep, 0.0)
        loss_tokens = (lse - (1 - epsilon) * target_logit - epsilon * mean_logit).masked_fill(~keep, 0.0)
        ctx.save_for_backward(logits, target, keep, lse)
        ctx.epsilon, ctx.pieces = epsilon, pieces
        nll = nll_tokens.sum()
        ctx.mark_non_differentiable(nll)
        return loss_tokens.sum(), nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        logits, target, keep, lse = ctx.saved_tensors
        scale = grad_loss.float() * keep.float()  # (N,): 0 on left-out rows
        if len(ctx.pieces) == 1:
            return _grad(logits, target, lse, scale, ctx.epsilon), None, None, None
        grad = torch.empty_like(logits)
        for rows in ctx.pieces:
            grad[rows] = _grad(logits[rows], target[rows], lse[rows], scale[rows], ctx.epsilon)
        return grad, None, None, None


def _whole(flat: Tensor, target: Tensor, keep: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The textbook form: one log-softmax of the whole matrix in fp32, autograd for the rest."""
    lprobs = F.log_softmax(flat.float(), dim=-1)
    nll_tokens = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)
    loss_tokens = (1 - epsilon) * nll_tokens - epsilon * lprobs.mean(dim=-1)
    return loss_tokens.masked_fill(~keep, 0.0).sum(), nll_tokens.detach().masked_fill(~keep, 0.0).sum()


def label_smoothed_nll(logits: Tensor, target: Tensor, pad_id: int,
                       epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed loss, summed NLL and non-pad target tokens (`pad_id` counts for nothing)."""
    flat = logits.reshape(-1, logits.size(-1))
    keep = target.reshape(-1) != pad_id
    flat_target = target.reshape(-1).masked_fill(~keep, 0)
    if not torch.compiler.is_compiling() and flat.dtype == torch.float32 and flat.numel() <= CHUNK_ELEMENTS:
        loss, nll = _whole(flat, flat_target, keep, epsilon)
    else:
        loss, nll = LabelSmoothedNLL.apply(flat, flat_target, keep, epsilon)
    return loss, nll, keep.sum()


class ProjectedLabelSmoothedNLL(torch.autograd.Function):
    """(summed smoothed loss, summed NLL) of hidden states (N, d) through `weight` (V, d) in exactly
    `chunks` padded pieces (no guard on the row count, which `tensor_split` would add), each piece's
    logits reduced to its gradients in the forward pass and dropped: the (N, V) logits never exist."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, target: Tensor, keep: Tensor, epsilon: float,
                chunks: int) -> tuple[Tensor, Tensor]:
        n, d = hidden.shape
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
            g = _grad(x, t, lse, k.float(), epsilon)  # (rows, V) ∂loss/∂logits, 0 on left-out rows
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
    """`label_smoothed_nll` of `hidden @ weight.T`, in `chunks` row pieces (`ProjectedLabelSmoothedNLL`)."""
    flat = hidden.reshape(-1, hidden.size(-1))  # (N, d)
    keep = target.reshape(-1) != pad_id
    flat_target = target.reshape(-1).masked_fill(~keep, 0)
    loss, nll = ProjectedLabelSmoothedNLL.apply(flat, weight, flat_target, keep, epsilon, chunks)
    return loss, nll, keep.sum()
