"""The attention weights of a run's model on one sentence pair, computed by hooks (SDPA never hands them
out) and checked against SDPA's output (`AttentionMaps.max_difference`)."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lightning_modules.data.tokenizer import BOS_ID, EOS_ID
from lightning_modules.run.attention_figures import ATTENTION_FILE, KINDS, kind_key
from lightning_modules.transformer import MultiHeadAttention, Transformer


def explicit_attention(module: MultiHeadAttention, x: Tensor, memory: Tensor, mask: Tensor | None = None,
                       is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """(weights (B, h, T_q, T_k), output) of `module`, queries from `x` over `memory`, SDPA's `mask` added."""
    q = module.queries(x)  # the module's own projections: rotary and shared key/value heads included
    k, v = module.per_query_head(*module.project_kv(memory))
    scores = q @ k.transpose(-2, -1) / math.sqrt(module.d_k)
    if mask is not None:
        scores = scores + mask
    if is_causal:
        t_q, t_k = scores.shape[-2:]
        causal = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights, module.w_o((weights @ v).transpose(1, 2).flatten(2))


@dataclass
class AttentionMaps:
    """Per kind (KINDS), a (layers, heads, T_q, T_k) array; the wordpieces on each axis."""

    weights: dict[str, Tensor]
    source: list[str]  # source pieces, EOS included (keys of encoder self and cross attention)
    target: list[str]  # decoder inputs: BOS then the translation's pieces
    max_difference: float = 0.0  # largest |explicit - SDPA| over every sub-layer output
    labels: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # (queries, keys)


@torch.no_grad()
def attention_maps(model: Transformer, src: list[int], tgt: list[int], pieces) -> AttentionMaps:
    """Every head's weights of `model` teacher-forced on `src` and `tgt`, named by `pieces(ids)`."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    modules = {KINDS[0]: [layer.self_attn for layer in model.encoder],
               KINDS[1]: [layer.self_attn for layer in model.decoder],
               KINDS[2]: [layer.cross_attn for layer in model.decoder]}
    found: dict[str, list[Tensor]] = {kind: [] for kind in KINDS}
    worst = [0.0]
    handles = []

    def hook_for(kind: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> None:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            bound.apply_defaults()
            weights, out = explicit_attention(module, **bound.arguments)
            worst[0] = max(worst[0], float((out.float() - output.float()).abs().max()))
            found[kind].append(weights[0].float().cpu())
        return hook

    try:
        for kind, mods in modules.items():
            for m in mods:
                handles.append(m.register_forward_hook(hook_for(kind), with_kwargs=True))
        src_t = torch.tensor([list(src) + [EOS_ID]], device=device)
        tgt_t = torch.tensor([[BOS_ID, *tgt]], device=device)
        model(src_t, tgt_t)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    source = [*pieces(list(src)), "</s>"]
    target = ["<s>", *pieces(list(tgt))]
    labels = {KINDS[0]: (source, source), KINDS[1]: (target, target), KINDS[2]: (target, source)}
    return AttentionMaps({kind: torch.stack(w) for kind, w in found.items()}, source, target,
                         worst[0], labels)


FIXED_PIECES = (8, 30)  # the fixed dev sentence: the first with this many wordpieces (inclusive)


def fixed_sentence(sources: list[list[int]]) -> int | None:
    """Index of the run's fixed dev sentence: the first of FIXED_PIECES wordpieces, else non-empty."""
    low, high = FIXED_PIECES
    for i, ids in enumerate(sources):
        if low <= len(ids) <= high:
            return i
    return next((i for i, ids in enumerate(sources) if ids), None)


def save_run_attention(model: Transformer, data, eval_cfg, out) -> bool:
    """A finished run's `attention.npz`: every head on its fixed dev sentence; False if there is none."""
    import io
    from pathlib import Path

    import numpy as np

    from foundation.io import atomic_write_bytes
    from lightning_modules.evaluate import translate

    sources = data.encode(list(data.corpus.valid.src))
    index = fixed_sentence(sources)
    if index is None:
        return False
    limit = model.config.max_len - 1
    src = list(sources[index][:limit])
    tgt = translate(model, [src], BOS_ID, EOS_ID, eval_cfg)[0][:limit]
    maps = attention_maps(model, src, tgt, lambda ids: [data.tokenizer.id_to_piece(i) for i in ids])
    buffer = io.BytesIO()
    np.savez_compressed(buffer, line=np.int64(index + 1), source=np.array(maps.source),
                        target=np.array(maps.target),
                        **{kind_key(kind): maps.weights[kind].numpy().astype(np.float16) for kind in KINDS})
    atomic_write_bytes(Path(out) / ATTENTION_FILE, buffer.getvalue())
    return True
