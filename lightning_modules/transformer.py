"""The encoder-decoder Transformer of Vaswani et al. (2017), one class per sub-layer of the paper.

Post-LN sub-layers, LayerNorm(x + Dropout(Sublayer(x))); dropout on embeddings + positions; one
embedding matrix shared by the encoder input, the decoder input and the pre-softmax projection,
scaled by sqrt(d_model); biases in every linear layer; no final LayerNorm. Queries and keys are
projected to h·d_k and values to h·d_v, independent of d_model (rows A and B of Table 3).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.config import TransformerConfig, count_parameters  # noqa: F401 (exported)

# Per-layer key/value cache for incremental decoding: {"self_k", "self_v", "cross_k", "cross_v"}.
LayerCache = dict[str, Tensor]
MASK_ALIGNMENT = 8  # SDPA's CUDA kernels want a mask's row stride a multiple of 8 elements


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention (section 3.2.2), via PyTorch's SDPA kernels."""

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.w_q = nn.Linear(d_model, n_heads * d_k)
        self.w_kv = nn.Linear(d_model, n_heads * (d_k + d_v))  # K and V projections, fused
        self.w_o = nn.Linear(n_heads * d_v, d_model)

    def _split(self, x: Tensor, d_head: int) -> Tensor:
        """(B, T, h·d) -> (B, h, T, d)."""
        return x.unflatten(-1, (self.n_heads, d_head)).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `x`, each (B, h, T, d_k or d_v)."""
        k, v = self.w_kv(x).split([self.n_heads * self.d_k, self.n_heads * self.d_v], dim=-1)
        return self._split(k, self.d_k), self._split(v, self.d_v)

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               is_causal: bool = False) -> Tensor:
        """Queries from `x` attend over precomputed keys/values; `mask` is True where allowed."""
        q = self._split(self.w_q(x), self.d_k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.w_o(out.transpose(1, 2).flatten(2))

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        k, v = self.project_kv(memory)
        return self.attend(x, k, v, mask, is_causal)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.relu(self.w_1(x)))


class SublayerConnection(nn.Module):
    """Residual connection then layer norm: LayerNorm(x + Dropout(Sublayer(x))) (post-LN)."""

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        return self.norm(x + self.dropout(sublayer_out))


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each in a post-LN sub-layer."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.d_k, c.d_v)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff)
        self.sublayers = nn.ModuleList(SublayerConnection(c.d_model, c.dropout) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, self.self_attn(x, x, src_mask))
        return self.sublayers[1](x, self.feed_forward(x))


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.d_k, c.d_v)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.d_k, c.d_v)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff)
        self.sublayers = nn.ModuleList(SublayerConnection(c.d_model, c.dropout) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor,
                cache: LayerCache | None = None) -> Tensor:
        """Full sequence (cache=None, causal mask) or one new position per call (with cache)."""
        if cache is None:
            x = self.sublayers[0](x, self.self_attn(x, x, is_causal=True))
            x = self.sublayers[1](x, self.cross_attn(x, memory, src_mask))
        else:  # incremental: append this position's keys/values; it may see all cached ones
            k, v = self.self_attn.project_kv(x)
            if "self_k" in cache:
                k = torch.cat([cache["self_k"], k], dim=2)
                v = torch.cat([cache["self_v"], v], dim=2)
            cache["self_k"], cache["self_v"] = k, v
            x = self.sublayers[0](x, self.self_attn.attend(x, k, v))
            if "cross_k" not in cache:
                cache["cross_k"], cache["cross_v"] = self.cross_attn.project_kv(memory)
            x = self.sublayers[1](x, self.cross_attn.attend(x, cache["cross_k"], cache["cross_v"],
                                                            src_mask))
        return self.sublayers[2](x, self.feed_forward(x))


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same)."""
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)[:, : d_model // 2]
    return table


class PositionalEncoding(nn.Module):
    """Adds sinusoidal (fixed) or learned positions; row E of Table 3 swaps one for the other."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.learned = c.positional == "learned"
        if self.learned:
            self.table = nn.Embedding(c.max_len, c.d_model)
            nn.init.normal_(self.table.weight, std=c.d_model ** -0.5)
        else:
            self.register_buffer("table", sinusoidal_table(c.max_len, c.d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        length = x.size(1)
        if offset + length > (max_len := self._max_len()):
            raise ValueError(f"sequence of length {offset + length} exceeds model.max_len={max_len}")
        weights = self.table.weight if self.learned else self.table
        return x + weights[offset: offset + length].to(x.dtype)

    def _max_len(self) -> int:
        return self.table.num_embeddings if self.learned else self.table.size(0)


class Transformer(nn.Module):
    """Encoder-decoder Transformer with a single shared embedding/pre-softmax matrix."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)  # encoder, decoder and softmax
        self.src_positions = PositionalEncoding(c)
        self.tgt_positions = PositionalEncoding(c)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layers))
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        # The shared matrix is multiplied by sqrt(d_model) on input: unit-variance embeddings.
        nn.init.normal_(self.embedding.weight, std=self.config.d_model ** -0.5)

    def embed(self, tokens: Tensor, positions: PositionalEncoding, offset: int = 0) -> Tensor:
        x = self.embedding(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(positions(x, offset))

    def padding_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S) boolean mask, True on real source tokens.

        It is a view of a wider mask whose rows lie a multiple of MASK_ALIGNMENT elements apart,
        always wider than S: SDPA's CUDA kernels want a mask's rows aligned (eager SDPA copies a
        mask into such a layout itself), and torch.compile would otherwise guard on S % 8, or
        on the mask being contiguous, and compile the step a second time for the first source
        length of the other kind (~50 s for the base model on an H100 host).
        """
        s = src.size(1)
        wide = MASK_ALIGNMENT * (s // MASK_ALIGNMENT + 1)
        return (F.pad(src, (0, wide - s), value=self.config.pad_id) != self.config.pad_id)[:, None, None, :s]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Source ids (B, S) -> memory (B, S, d_model) and its padding mask."""
        src_mask = self.padding_mask(src)
        x = self.embed(src, self.src_positions)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return x, src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Whole target prefix (B, T) -> hidden states (B, T, d_model), causally masked."""
        x = self.embed(tgt_in, self.tgt_positions)
        for layer in self.decoder:
            x = layer(x, memory, src_mask)
        return x

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation, tied to the embedding matrix."""
        return hidden @ self.embedding.weight.t()

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, vocab_size) for every target position."""
        memory, src_mask = self.encode(src)
        return self.project(self.decode(tgt_in, memory, src_mask))

    def decode_step(self, token: Tensor, memory: Tensor, src_mask: Tensor,
                    caches: list[LayerCache], position: int) -> Tensor:
        """One incremental decoder step: last tokens (B,) -> logits (B, vocab_size).

        `caches` (one dict per layer, start with empty dicts) keeps keys/values of earlier steps.
        """
        x = self.embed(token[:, None], self.tgt_positions, offset=position)
        for layer, cache in zip(self.decoder, caches):
            x = layer(x, memory, src_mask, cache)
        return self.project(x[:, 0])
