"""The peers our `Transformer` is measured against, built to the same dimensions.

* `TorchTransformer`: `torch.nn.Transformer` with the paper's embedding: one matrix shared by
  encoder input, decoder input and pre-softmax projection, ×√d_model, sinusoidal positions,
  dropout on embeddings + positions. Two things are switched off so that it computes the same
  network as ours: the final LayerNorm after each stack (`nn.Transformer` adds one; the paper's
  post-LN model has none) and the dropouts the paper does not have (on attention weights and
  between the two FFN layers; `nn.Transformer` applies P_drop there too).
* `MarianPeer`: Hugging Face `MarianMTModel` configured to the same dimensions (post-LN, ReLU,
  scaled and tied embeddings, sinusoidal positions, dropout only where the paper has it).
* `port_to_marian`: our weights copied into a Marian model so both compute the same function
  (used by the generation benchmark), verified on logits.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_modules.config import TransformerConfig
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from lightning_modules.transformer import Transformer, sinusoidal_table


def trainable_parameters(model: nn.Module) -> int:
    """Distinct parameters that receive gradients (tied matrices counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


class TorchTransformer(nn.Module):
    """`torch.nn.Transformer` wrapped with the paper's shared embedding and sinusoidal positions."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        if c.d_k * c.n_heads != c.d_model or c.d_v != c.d_k:
            raise ValueError("nn.Transformer needs d_k = d_v = d_model / h")
        self.config = c
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        nn.init.normal_(self.embedding.weight, std=c.d_model ** -0.5)
        self.register_buffer("positions", sinusoidal_table(c.max_len, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(c.d_model, c.n_heads, c.n_layers, c.n_layers, c.d_ff,
                                          c.dropout, batch_first=True)
        self.transformer.encoder.norm = None  # no final LayerNorm in the paper's post-LN stacks
        self.transformer.decoder.norm = None
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout = nn.Identity()  # inside the FFN: not in the paper
            layer.self_attn.dropout = 0.0  # on attention weights: not in the paper
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = 0.0

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.positions[: tokens.size(1)].to(x.dtype))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = src == self.config.pad_id
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=src.device, dtype=self.embedding.weight.dtype)
        hidden = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=causal,
                                  src_key_padding_mask=pad, memory_key_padding_mask=pad,
                                  tgt_is_causal=True)
        return hidden @ self.embedding.weight.t()


def marian_config(c: TransformerConfig):
    """A `MarianConfig` with our dimensions and special ids (pad 0, BOS 2, EOS 3)."""
    from transformers import MarianConfig

    if c.d_k * c.n_heads != c.d_model or c.d_v != c.d_k:
        raise ValueError("Marian needs d_k = d_v = d_model / h")
    return MarianConfig(
        d_model=c.d_model, encoder_layers=c.n_layers, decoder_layers=c.n_layers,
        encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, vocab_size=c.vocab_size,
        dropout=c.dropout, attention_dropout=0.0, activation_dropout=0.0,
        activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, max_position_embeddings=c.max_len,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID,  # Marian's default (0) would force PAD at the length cap
        bos_token_id=None)


class MarianPeer(nn.Module):
    """`MarianMTModel` behind our interface: (src, tgt_in) -> logits."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        from transformers import MarianMTModel

        self.config = c
        self.marian = MarianMTModel(marian_config(c))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.marian(input_ids=src, attention_mask=src != self.config.pad_id,
                           decoder_input_ids=tgt_in, use_cache=False).logits


# ----------------------------------------------------------------------------------- port

def marian_order(d_model: int) -> Tensor:
    """Residual coordinate permutation: Marian's coordinate m is our coordinate order[m].

    Marian's sinusoids put sin(pos·ω_i) in coordinate i and cos(pos·ω_i) in d/2 + i; ours
    interleave them (2i sin, 2i+1 cos) with the same ω_i. Permuting every residual-stream
    coordinate this way maps one table onto the other and leaves the network's function unchanged
    (LayerNorm is permutation-equivariant; attention heads live in their own projected space).
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _copy_linear(dst: nn.Linear, weight: Tensor, bias: Tensor) -> None:
    dst.weight.copy_(weight)
    dst.bias.copy_(bias)


@torch.no_grad()
def load_into_torch(ours: Transformer, peer: TorchTransformer) -> None:
    """Copy our weights into the nn.Transformer peer (same layout; Q, K, V fused in in_proj)."""
    peer.embedding.weight.copy_(ours.embedding.weight)

    def attention(dst: nn.MultiheadAttention, src) -> None:
        dst.in_proj_weight.copy_(torch.cat([src.w_q.weight, src.w_kv.weight]))
        dst.in_proj_bias.copy_(torch.cat([src.w_q.bias, src.w_kv.bias]))
        _copy_linear(dst.out_proj, src.w_o.weight, src.w_o.bias)

    def rest(dst, src, norms: list[nn.LayerNorm]) -> None:
        _copy_linear(dst.linear1, src.feed_forward.w_1.weight, src.feed_forward.w_1.bias)
        _copy_linear(dst.linear2, src.feed_forward.w_2.weight, src.feed_forward.w_2.bias)
        for norm, sublayer in zip(norms, src.sublayers):
            norm.load_state_dict(sublayer.norm.state_dict())

    for dst, src in zip(peer.transformer.encoder.layers, ours.encoder):
        attention(dst.self_attn, src.self_attn)
        rest(dst, src, [dst.norm1, dst.norm2])
    for dst, src in zip(peer.transformer.decoder.layers, ours.decoder):
        attention(dst.self_attn, src.self_attn)
        attention(dst.multihead_attn, src.cross_attn)
        rest(dst, src, [dst.norm1, dst.norm2, dst.norm3])


@torch.no_grad()
def load_into_marian(ours: Transformer, peer: MarianPeer) -> float:
    """Copy our weights into the Marian peer so that both compute the same function.

    Residual coordinates are permuted (`marian_order`); K and V are split out of our fused
    `w_kv`; `final_logits_bias` is zeroed. Returns max |Marian's own position table − ours
    (permuted)|, then copies ours in, so the two agree to float rounding.
    """
    c = ours.config
    if c.positional != "sinusoidal":
        raise ValueError("Marian has sinusoidal positions only")
    order = marian_order(c.d_model).to(ours.embedding.weight.device)

    def residual_in(dst: nn.Linear, weight: Tensor, bias: Tensor) -> None:
        """A Linear that reads the residual stream: permute its input columns."""
        _copy_linear(dst, weight[:, order], bias)

    def residual_out(dst: nn.Linear, src: nn.Linear) -> None:
        """A Linear that writes the residual stream: permute its output rows and bias."""
        _copy_linear(dst, src.weight[order], src.bias[order])

    def norm(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
        dst.weight.copy_(src.weight[order])
        dst.bias.copy_(src.bias[order])
        dst.eps = src.eps

    def attention(dst, src) -> None:
        q_size = src.n_heads * src.d_k
        residual_in(dst.q_proj, src.w_q.weight, src.w_q.bias)
        residual_in(dst.k_proj, src.w_kv.weight[:q_size], src.w_kv.bias[:q_size])
        residual_in(dst.v_proj, src.w_kv.weight[q_size:], src.w_kv.bias[q_size:])
        residual_out(dst.out_proj, src.w_o)

    def feed_forward(dst, src) -> None:
        residual_in(dst.fc1, src.w_1.weight, src.w_1.bias)
        residual_out(dst.fc2, src.w_2)

    marian = peer.marian
    model = marian.model
    model.shared.weight.copy_(ours.embedding.weight[:, order])  # tied: encoder, decoder, lm_head
    marian.final_logits_bias.zero_()
    table = sinusoidal_table(c.max_len, c.d_model).to(order.device)[:, order]
    position_gap = 0.0
    for stack in (model.encoder, model.decoder):
        weight = stack.embed_positions.weight
        position_gap = max(position_gap, float((weight - table.to(weight.dtype)).abs().max()))
        weight.copy_(table)
    for dst, src in zip(model.encoder.layers, ours.encoder):
        attention(dst.self_attn, src.self_attn)
        norm(dst.self_attn_layer_norm, src.sublayers[0].norm)
        feed_forward(dst, src.feed_forward)
        norm(dst.final_layer_norm, src.sublayers[1].norm)
    for dst, src in zip(model.decoder.layers, ours.decoder):
        attention(dst.self_attn, src.self_attn)
        norm(dst.self_attn_layer_norm, src.sublayers[0].norm)
        attention(dst.encoder_attn, src.cross_attn)
        norm(dst.encoder_attn_layer_norm, src.sublayers[1].norm)
        feed_forward(dst, src.feed_forward)
        norm(dst.final_layer_norm, src.sublayers[2].norm)
    if marian.lm_head.weight.data_ptr() != model.shared.weight.data_ptr():
        marian.lm_head.weight.copy_(model.shared.weight)
    return position_gap


def port_to_marian(ours: Transformer) -> tuple[MarianPeer, float]:
    """A new Marian peer holding our weights (see `load_into_marian`), in eval mode."""
    peer = MarianPeer(ours.config).to(ours.embedding.weight.device)
    gap = load_into_marian(ours, peer)
    return peer.eval(), gap


@torch.no_grad()
def logits_error(ours: Transformer, peer: nn.Module, src: Tensor, tgt_in: Tensor) -> float:
    """Max |logits difference| of ours and a peer (both in eval mode) on one batch.

    Logits index the vocabulary, which no port permutes, so they compare directly.
    """
    modes = ours.training, peer.training
    ours.eval()
    peer.eval()
    try:
        a, b = ours(src, tgt_in).float(), peer(src, tgt_in).float()
        real = tgt_in != ours.config.pad_id
        return float((a - b).abs()[real].max())
    finally:
        ours.train(modes[0])
        peer.train(modes[1])
