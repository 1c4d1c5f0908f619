"""The encoder-decoder Transformer of Vaswani et al. (2017), one class per sub-layer of the paper.

By default the paper's model: post-LN sub-layers, LayerNorm(x + Dropout(Sublayer(x))); dropout on
embeddings + positions; one embedding matrix shared by the encoder input, the decoder input and
the pre-softmax projection, scaled by sqrt(d_model); biases in every linear layer; no final
LayerNorm. Queries and keys are projected to h·d_k and values to h·d_v, independent of d_model
(rows A and B of Table 3).

The later modifications (`TransformerConfig`'s knobs after `pad_id`, docs/modifications.md)
swap one piece each: pre-LN with a final norm (Xiong et al. 2020), RMSNorm (Zhang & Sennrich
2019), GELU and gated feed-forward networks (Shazeer 2020), rotary positions (Su et al. 2021),
untied embeddings, no embedding scale, and fewer key/value heads (Shazeer 2019; Ainslie et al.
2023). Every linear layer keeps its bias, as in the paper's model, whatever the knobs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lightning_modules.config import GATED_ACTIVATIONS, TransformerConfig, count_parameters  # noqa: F401 (exported)

# Per-layer key/value cache for incremental decoding: {"self_k", "self_v", "cross_k", "cross_v"}.
LayerCache = dict[str, Tensor]
MASK_ALIGNMENT = 8  # SDPA's CUDA kernels want a mask's row stride a multiple of 8 elements
ROPE_BASE = 10000.0  # theta_i = 10000^(-2i/d), as the sinusoids of section 3.5
# `model.attention_backend` -> SDPA kernels in priority order: the one named first, then the others
# in PyTorch's order, so a call the named kernel does not take (flash takes no padding mask, nor
# d_k != d_v; efficient and cudnn have no CPU kernel) runs on the next one instead of failing.
# "math" is alone: it takes every call, and PyTorch's CPU dispatch ignores the priority (it runs
# flash whenever flash is allowed).
_KERNELS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
_PYTORCH_ORDER = ("flash", "efficient", "cudnn", "math")
SDPA_BACKENDS = {name: [_KERNELS[name]] + ([] if name == "math" else [_KERNELS[k] for k in _PYTORCH_ORDER if k != name])
                 for name in _KERNELS}


def sdpa_backend(name: str, q: Tensor) -> contextlib.AbstractContextManager:
    """SDPA's kernels with `name`'s first (`SDPA_BACKENDS`) for queries `q`; "auto": PyTorch's own
    order, no context, but for bf16 on a CPU: there PyTorch's flash kernel trains several times slower
    than its math kernel and than itself in fp32 (the CPU bf16 rows of benchmarks/results), so math."""
    name = "math" if name == "auto" and q.device.type == "cpu" and q.dtype == torch.bfloat16 else name
    return contextlib.nullcontext() if name == "auto" else sdpa_kernel(SDPA_BACKENDS[name], set_priority=True)


def check_length(length: int, max_len: int) -> None:
    if length > max_len:
        raise ValueError(f"sequence of length {length} exceeds model.max_len={max_len}")


def rows_at(table: Tensor, offset: int | Tensor, length: int) -> Tensor:
    """Rows offset .. offset + length - 1 of a table of positions. `offset` is an int (checked
    against the table) or, in a fixed-size decoding step, a 0-d tensor on the table's device,
    which is read without a host read (the decoder keeps it below the table's length)."""
    if isinstance(offset, Tensor):
        return table.index_select(0, offset + torch.arange(length, device=table.device))
    check_length(offset + length, table.size(0))
    return table[offset: offset + length]


class RotaryEmbedding(nn.Module):
    """Rotary positions (Su et al. 2021, eq. 34): each pair (x_2i, x_2i+1) of a query or key at
    position m is rotated by the angle m·theta_i, theta_i = 10000^(-2i/d_k), so that the dot
    product of a query at m and a key at n depends on m - n only."""

    def __init__(self, d_head: int, max_len: int) -> None:
        super().__init__()
        theta = ROPE_BASE ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * theta  # (max_len, d_head / 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """(B, h, T, d_head) at positions offset .. offset + T - 1 -> the same, rotated."""
        cos = rows_at(self.cos, offset, x.size(2)).to(x.dtype)
        sin = rows_at(self.sin, offset, x.size(2)).to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention (section 3.2.2), via PyTorch's SDPA kernels.

    With g = `n_kv_heads` < h, keys and values are projected for g heads only, and query heads
    i·h/g .. (i+1)·h/g - 1 share key/value head i (g = 1: multi-query, Shazeer 2019; a divisor of
    h: grouped-query, Ainslie et al. 2023); the cache holds the g heads. `rotary` rotates queries
    and keys by their positions (self-attention only). `backend` picks the SDPA kernels
    (`SDPA_BACKENDS`). `fused` (self-attention only) holds the query and the key/value projections
    as one matrix `w_qkv` (rows: W_q's, then W_kv's) and projects a sequence attending over itself
    in one matmul; the same parameters and function as `w_q` + `w_kv`.
    """

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_v: int, n_kv_heads: int | None = None,
                 rotary: RotaryEmbedding | None = None, backend: str = "auto", fused: bool = False) -> None:
        super().__init__()
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.rotary, self.backend, self.fused = rotary, backend, fused
        q_rows, kv_rows = n_heads * d_k, self.n_kv_heads * (d_k + d_v)
        if fused:
            self.w_qkv = nn.Linear(d_model, q_rows + kv_rows)
            self.w_qkv.parts = (q_rows, kv_rows)  # initialised part by part, as w_q and w_kv
            self.register_load_state_dict_pre_hook(MultiHeadAttention._fuse_state)
        else:
            self.w_q = nn.Linear(d_model, q_rows)
            self.w_kv = nn.Linear(d_model, kv_rows)  # K and V projections, fused
            self.register_load_state_dict_pre_hook(MultiHeadAttention._unfuse_state)
        self.w_o = nn.Linear(n_heads * d_v, d_model)

    @staticmethod
    def _fuse_state(module: nn.Module, state: dict, prefix: str, *args) -> None:
        """A state_dict with `w_q` and `w_kv` (unfused models, older checkpoints) loads as `w_qkv`."""
        for kind in ("weight", "bias"):
            if f"{prefix}w_q.{kind}" in state:
                state[f"{prefix}w_qkv.{kind}"] = torch.cat([state.pop(f"{prefix}w_q.{kind}"),
                                                            state.pop(f"{prefix}w_kv.{kind}")])

    @staticmethod
    def _unfuse_state(module: nn.Module, state: dict, prefix: str, *args) -> None:
        """A state_dict with `w_qkv` (a fused model's) loads as `w_q` and `w_kv`."""
        for kind in ("weight", "bias"):
            if f"{prefix}w_qkv.{kind}" in state:
                q_rows = module.w_q.out_features
                fused = state.pop(f"{prefix}w_qkv.{kind}")
                state[f"{prefix}w_q.{kind}"], state[f"{prefix}w_kv.{kind}"] = fused[:q_rows], fused[q_rows:]

    def _projection(self, part: str, x: Tensor) -> Tensor:
        """x times W_q ("q") or W_kv ("kv"), plus bias: their own Linear, or rows of the fused one."""
        if not self.fused:
            return (self.w_q if part == "q" else self.w_kv)(x)
        rows = slice(0, self.w_qkv.parts[0]) if part == "q" else slice(self.w_qkv.parts[0], None)
        return F.linear(x, self.w_qkv.weight[rows], self.w_qkv.bias[rows])

    @staticmethod
    def _split(x: Tensor, heads: int, d_head: int) -> Tensor:
        """(B, T, heads·d) -> (B, heads, T, d)."""
        return x.unflatten(-1, (heads, d_head)).transpose(1, 2)

    def _keys_values(self, kv: Tensor, offset: int | Tensor) -> tuple[Tensor, Tensor]:
        """(B, T, g·(d_k + d_v)) projected -> keys and values, each (B, g, T, d_k or d_v)."""
        g = self.n_kv_heads
        k, v = kv.split([g * self.d_k, g * self.d_v], dim=-1)
        k = self._split(k, g, self.d_k)
        if self.rotary is not None:
            k = self.rotary(k, offset)
        return k, self._split(v, g, self.d_v)

    def _queries(self, q: Tensor, offset: int | Tensor) -> Tensor:
        """(B, T, h·d_k) projected -> queries (B, h, T, d_k)."""
        q = self._split(q, self.n_heads, self.d_k)
        return self.rotary(q, offset) if self.rotary is not None else q

    def project_kv(self, x: Tensor, offset: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        """Keys and values of `x` (at positions offset ..), each (B, g, T, d_k or d_v)."""
        return self._keys_values(self._projection("kv", x), offset)

    def queries(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """Queries of `x` (at positions offset ..), (B, h, T, d_k)."""
        return self._queries(self._projection("q", x), offset)

    def per_query_head(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of g heads, repeated so that each of the h query heads has its own."""
        if self.n_kv_heads != self.n_heads:  # each key/value head serves h / g query heads
            group = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return k, v

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """Queries (B, h, T, d_k) over keys/values of g heads -> the output projection's (B, T, d_model)."""
        k, v = self.per_query_head(k, v)
        with sdpa_backend(self.backend, q):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.w_o(out.transpose(1, 2).flatten(2))

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               is_causal: bool = False, offset: int | Tensor = 0) -> Tensor:
        """Queries from `x` (at positions offset ..) attend over precomputed keys/values (g heads
        each); `mask` an additive bias (0 where allowed, -inf where not; `Transformer.padding_mask`)."""
        return self._attention(self.queries(x, offset), k, v, mask, is_causal)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        """Queries from `x` (B, T, d_model) attend over `memory`'s keys/values, positions from 0;
        fused, a sequence attending over itself (`memory is x`) is projected in one matmul."""
        if self.fused and memory is x:
            q, kv = self.w_qkv(x).split(self.w_qkv.parts, dim=-1)  # (B, T, h·d_k), (B, T, g·(d_k + d_v))
            return self._attention(self._queries(q, 0), *self._keys_values(kv, 0), mask, is_causal)
        k, v = self.project_kv(memory)
        return self.attend(x, k, v, mask, is_causal)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3); with GELU (Hendrycks & Gimpel 2016)
    instead of max(0, .) for activation "gelu"."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu") -> None:
        super().__init__()
        self.activation = F.gelu if activation == "gelu" else F.relu
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class GatedFeedForward(nn.Module):
    """FFN_GLU(x) = (act(x W1 + b1) ⊙ (x V + c)) W2 + b2 (Shazeer 2020): act = Swish_1 (SiLU) for
    SwiGLU, GELU for GeGLU; d_ff is the width of each of the two input projections."""

    def __init__(self, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        self.activation = F.silu if activation == "swiglu" else F.gelu
        self.w_1 = nn.Linear(d_model, d_ff)
        self.v = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)) * self.v(x))


def feed_forward(c: TransformerConfig) -> nn.Module:
    if c.activation in GATED_ACTIVATIONS:
        return GatedFeedForward(c.d_model, c.d_ff, c.activation)
    return PositionwiseFeedForward(c.d_model, c.d_ff, c.activation)


class RMSNorm(nn.Module):
    """RMSNorm(x) = g ⊙ x / sqrt(mean_i(x_i²) + eps) (Zhang & Sennrich 2019): LayerNorm's rescaling
    without its centring and without a bias."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def norm_layer(c: TransformerConfig) -> nn.Module:
    return RMSNorm(c.d_model) if c.norm == "rmsnorm" else nn.LayerNorm(c.d_model)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype where autocast is on for `device_type` ("cuda", "cpu"), else None."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def in_autocast_dtype(x: Tensor) -> Tensor:
    """x in autocast's dtype where autocast is on for x's device, else x as it is. With
    `model.residual_bf16` the residual stream passes through this: under bf16 autocast a sub-layer's
    output is bf16 already, but x + it is promoted to fp32 by an fp32 x, and a norm's output is
    fp32 (autocast runs norms in fp32), so the stream stays fp32 unless cast."""
    dtype = autocast_dtype(x.device.type)
    return x if dtype is None else x.to(dtype)


class SublayerConnection(nn.Module):
    """A residual sub-layer. Post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))); pre-LN
    (Xiong et al. 2020): x + Dropout(Sublayer(LayerNorm(x))). The norm is `c.norm`'s; with
    `c.residual_bf16` the output is in autocast's dtype (`in_autocast_dtype`)."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.pre = c.norm_position == "pre"
        self.norm = norm_layer(c)
        self.dropout = nn.Dropout(c.dropout)
        self.low_precision = c.residual_bf16

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre:
            out = x + self.dropout(sublayer(self.norm(x)))
        else:
            out = self.norm(x + self.dropout(sublayer(x)))
        return in_autocast_dtype(out) if self.low_precision else out


def self_attention(c: TransformerConfig) -> MultiHeadAttention:
    rotary = RotaryEmbedding(c.d_k, c.max_len) if c.positional == "rope" else None
    return MultiHeadAttention(c.d_model, c.n_heads, c.d_k, c.d_v, c.n_kv_heads, rotary,
                              c.attention_backend, c.fused_qkv)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each in a residual sub-layer."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = self_attention(c)
        self.feed_forward = feed_forward(c)
        self.sublayers = nn.ModuleList(SublayerConnection(c) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda y: self.self_attn(y, y, src_mask))
        return self.sublayers[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = self_attention(c)
        # cross-attention: no rotary (queries and keys come from different sequences)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.d_k, c.d_v, c.n_kv_heads,
                                             backend=c.attention_backend)
        self.feed_forward = feed_forward(c)
        self.sublayers = nn.ModuleList(SublayerConnection(c) for _ in range(3))

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor,
                cache: LayerCache | None = None, position: int | Tensor = 0) -> Tensor:
        """Full sequence (cache=None, causal mask) or one new position per call (with cache),
        `position` its index in the target (a 0-d tensor: a fixed-size cache, `fixed_size_cache`)."""
        if cache is None:
            x = self.sublayers[0](x, lambda y: self.self_attn(y, y, is_causal=True))
            x = self.sublayers[1](x, lambda y: self.cross_attn(y, memory, src_mask))
        else:
            x = self.sublayers[0](x, lambda y: self._cached_self_attention(y, cache, position))
            if "cross_k" not in cache:
                cache["cross_k"], cache["cross_v"] = self.cross_attn.project_kv(memory)
            x = self.sublayers[1](x, lambda y: self.cross_attn.attend(y, cache["cross_k"], cache["cross_v"],
                                                                      src_mask))
        return self.sublayers[2](x, self.feed_forward)

    def _cached_self_attention(self, y: Tensor, cache: LayerCache, position: int | Tensor) -> Tensor:
        """Append this position's keys/values to the cache; it may see all cached ones. A
        fixed-size cache (a tensor `position`) takes them into slot `position` and hides the
        slots after it, so that every step has the same shapes (one CUDA graph replays them)."""
        k, v = self.self_attn.project_kv(y, offset=position)
        if isinstance(position, Tensor):
            keys, values = cache["self_k"], cache["self_v"]  # (B, g, L, d_k), (B, g, L, d_v)
            keys.index_copy_(2, position.view(1), k.to(keys.dtype))
            values.index_copy_(2, position.view(1), v.to(values.dtype))
            later = torch.arange(keys.size(2), device=keys.device) > position
            hidden = torch.zeros(later.shape, dtype=keys.dtype, device=keys.device).masked_fill(later, float("-inf"))
            return self.self_attn.attend(y, keys, values, hidden.view(1, 1, 1, -1), offset=position)
        if "self_k" in cache:
            k = torch.cat([cache["self_k"], k], dim=2)
            v = torch.cat([cache["self_v"], v], dim=2)
        cache["self_k"], cache["self_v"] = k, v
        return self.self_attn.attend(y, k, v, offset=position)


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

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        weights = self.table.weight if self.learned else self.table
        return x + rows_at(weights, offset, x.size(1)).to(x.dtype)


class Transformer(nn.Module):
    """Encoder-decoder Transformer; by default a single shared embedding/pre-softmax matrix.

    `embedding` is the decoder's input embedding; `tie_embeddings` decides whether the encoder's
    input (`src_embedding`, absent when tied) and the pre-softmax projection (`output`, absent
    when tied) have their own matrices. With rotary positions nothing is added to the embeddings
    (the self-attentions rotate queries and keys instead); with pre-LN a final norm closes the
    encoder and the decoder stacks.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)  # decoder input (and per the tie, more)
        additive = c.positional != "rope"
        self.src_positions = PositionalEncoding(c) if additive else None
        self.tgt_positions = PositionalEncoding(c) if additive else None
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layers))
        if c.norm_position == "pre":  # pre-LN stacks end on an un-normalised residual stream
            self.encoder_norm, self.decoder_norm = norm_layer(c), norm_layer(c)
        if c.tie_embeddings != "all":
            self.src_embedding = nn.Embedding(c.vocab_size, c.d_model)
        if c.tie_embeddings == "none":
            self.output = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                # a fused projection part by part (rows of W_q, then W_kv): the unfused model's init
                for part in module.weight.split(getattr(module, "parts", module.out_features)):
                    nn.init.xavier_uniform_(part)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        # Every vocabulary matrix as the shared one: multiplied by sqrt(d_model) on input,
        # unit-variance embeddings (scale_embeddings=false keeps this init, only drops the factor).
        for matrix in (self.embedding.weight, *self._untied_matrices()):
            nn.init.normal_(matrix, std=self.config.d_model ** -0.5)

    def _untied_matrices(self) -> list[Tensor]:
        return [m.weight for m in (getattr(self, "src_embedding", None), getattr(self, "output", None))
                if m is not None]

    def embed(self, tokens: Tensor, side: str, offset: int | Tensor = 0) -> Tensor:
        """Token ids (B, T) of the "source" or "target" side -> inputs (B, T, d_model) of its stack,
        positions from `offset`."""
        source = side == "source"
        table = self.src_embedding if source and self.config.tie_embeddings != "all" else self.embedding
        x = table(tokens)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        positions = self.src_positions if source else self.tgt_positions
        if positions is not None:
            x = positions(x, offset)
        elif not isinstance(offset, Tensor):  # rotary: the self-attentions rotate, check here
            check_length(offset + x.size(1), self.config.max_len)
        return self.dropout(in_autocast_dtype(x) if self.config.residual_bf16 else x)

    def padding_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S) additive attention bias over the source: 0 on real tokens, -inf on padding,
        in the dtype attention computes in (autocast's, when it is on), so SDPA takes it as it is.

        It is a view of a wider bias whose rows lie a multiple of MASK_ALIGNMENT elements apart,
        always wider than S. SDPA's CUDA kernels want a bias's rows aligned, and Inductor checks
        the buffer SDPA receives: a boolean mask (or a bias of another dtype) became a new,
        contiguous float bias inside SDPA, with row stride S, and torch.compile guarded on
        S % 8 and compiled the step a second time for the first source length of the other kind
        (most of a minute for the base model; benchmarks/README.md, the one-graph case). The rows of
        this buffer lie 8·(S // 8 + 1) apart, aligned for every S.
        """
        s = src.size(1)
        wide = MASK_ALIGNMENT * (s // MASK_ALIGNMENT + 1)
        padding = F.pad(src, (0, wide - s), value=self.config.pad_id) == self.config.pad_id
        bias = torch.zeros(padding.shape, dtype=self.compute_dtype(src.device), device=src.device)
        return bias.masked_fill(padding, float("-inf"))[:, None, None, :s]

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype attention computes in on `device`: autocast's where it is on, else the weights'."""
        return autocast_dtype(device.type) or self.embedding.weight.dtype

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Source ids (B, S) -> memory (B, S, d_model) and its padding mask."""
        src_mask = self.padding_mask(src)
        x = self.embed(src, "source")
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self._final_norm(x, "encoder_norm"), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Whole target prefix (B, T) -> hidden states (B, T, d_model), causally masked."""
        x = self.embed(tgt_in, "target")
        for layer in self.decoder:
            x = layer(x, memory, src_mask)
        return self._final_norm(x, "decoder_norm")

    def fixed_size_cache(self, memory: Tensor, slots: int) -> list[LayerCache]:
        """Caches for `decode_step` at a tensor position, one dict per layer: the cross-attention's
        keys and values of `memory` (B, S, d_model), and self-attention slots for `slots` target
        positions (zeros, each hidden until its step writes it), in the dtype attention computes in.
        The slots are rounded up to a multiple of MASK_ALIGNMENT, so that the bias hiding them has
        aligned rows (as `padding_mask`'s); the extra ones stay hidden."""
        check_length(slots, self.config.max_len)
        dtype, caches = self.compute_dtype(memory.device), []
        width = MASK_ALIGNMENT * -(-slots // MASK_ALIGNMENT)
        for layer in self.decoder:
            a = layer.self_attn
            cross_k, cross_v = layer.cross_attn.project_kv(memory)
            shape = (memory.size(0), a.n_kv_heads, width)
            caches.append({"cross_k": cross_k, "cross_v": cross_v,
                           "self_k": memory.new_zeros((*shape, a.d_k), dtype=dtype),
                           "self_v": memory.new_zeros((*shape, a.d_v), dtype=dtype)})
        return caches

    def _final_norm(self, x: Tensor, name: str) -> Tensor:
        """Pre-LN's final norm of a stack's output; post-LN's output is normalised already."""
        return getattr(self, name)(x) if self.config.norm_position == "pre" else x

    def output_weight(self) -> Tensor:
        """The pre-softmax matrix (vocab_size, d_model): the embedding's unless tie_embeddings=none."""
        return self.output.weight if self.config.tie_embeddings == "none" else self.embedding.weight

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation: hidden (..., d_model) -> logits (..., vocab_size)."""
        return hidden @ self.output_weight().t()

    def hidden_states(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The decoder's output (B, T, d_model) for every target position, before the projection."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, vocab_size) for every target position."""
        return self.project(self.hidden_states(src, tgt_in))

    def decode_step(self, token: Tensor, memory: Tensor, src_mask: Tensor,
                    caches: list[LayerCache], position: int | Tensor) -> Tensor:
        """One incremental decoder step: last tokens (B,) -> logits (B, vocab_size).

        `caches` (one dict per layer, start with empty dicts) keeps keys/values of earlier steps,
        growing by one position a step. With `fixed_size_cache`'s caches and `position` a 0-d
        long tensor on the device, every step has the same shapes and reads nothing on the host.
        """
        x = self.embed(token[:, None], "target", offset=position)
        for layer, cache in zip(self.decoder, caches):
            x = layer(x, memory, src_mask, cache, position)
        return self.project(self._final_norm(x, "decoder_norm")[:, 0])
