"""The Transformer itself: masking, attention, caching, weight tying, post-LN, positions, size."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.config import ScaleConfig, TransformerConfig
from ablations.spec import load_spec, row_settings
from lightning_modules.search import greedy_search
from lightning_modules.transformer import (MultiHeadAttention, Transformer, count_parameters,
                                           sinusoidal_table)

# Tiny models are fastest single-threaded; the default thread pool oversubscribes a busy 2-core box.
torch.set_num_threads(1)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB = 60


def tiny_config(**overrides) -> TransformerConfig:
    settings = dict(n_layers=2, d_model=32, d_ff=48, n_heads=4, dropout=0.0, label_smoothing=0.0,
                    vocab_size=VOCAB, max_len=40)
    settings.update(overrides)
    return TransformerConfig(**settings)


# One setting per value of every later modification's knob (docs/modifications.md), and the
# "modern" row's combination; {} is the paper's model.
KNOB_SETTINGS = [
    {}, dict(positional="learned"), dict(positional="rope"), dict(norm_position="pre"),
    dict(norm="rmsnorm"), dict(activation="gelu"), dict(activation="swiglu"), dict(activation="geglu"),
    dict(tie_embeddings="decoder"), dict(tie_embeddings="none"), dict(scale_embeddings=False),
    dict(n_kv_heads=1), dict(n_kv_heads=2),
    dict(norm_position="pre", norm="rmsnorm", activation="swiglu", positional="rope"),
    # kernel choices (docs/gpu-performance.md#kernel-variants): the same function, other kernels
    dict(fused_qkv=True), dict(fused_qkv=True, n_kv_heads=2, positional="rope"),
    dict(attention_backend="math"), dict(attention_backend="flash"),
    dict(residual_bf16=True),  # without autocast (as here) the paper's function, bit for bit
]
KNOB_IDS = [",".join(f"{k}={v}" for k, v in s.items()) or "paper" for s in KNOB_SETTINGS]


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides)).eval()


def pad_batch(seqs: list[list[int]]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])


def random_tokens(generator: torch.Generator, length: int) -> list[int]:
    return torch.randint(4, VOCAB, (length,), generator=generator).tolist()


def source_batch(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return pad_batch([random_tokens(g, n) for n in (7, 3, 5, 1)])


def target_batch(seed: int = 2, length: int = 6, batch: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.full((batch, 1), BOS), torch.randint(4, VOCAB, (batch, length - 1),
                                                                 generator=g)], dim=1)


# --------------------------------------------------------------------------- masking


@pytest.mark.parametrize("settings", KNOB_SETTINGS, ids=KNOB_IDS)
def test_causal_mask_future_targets_do_not_change_earlier_logits(settings):
    model = tiny_model(**settings)
    src, tgt = source_batch(), target_batch(length=7)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        reference = model(src, tgt)
        for t in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, t:] = torch.randint(4, VOCAB, changed[:, t:].shape, generator=g)
            logits = model(src, changed)
            torch.testing.assert_close(logits[:, :t], reference[:, :t], atol=1e-6, rtol=0)
            # the changed positions must matter somewhere, or the check above is vacuous
            assert not torch.allclose(logits[:, t:], reference[:, t:], atol=1e-4)


@pytest.mark.parametrize("settings", KNOB_SETTINGS, ids=KNOB_IDS)
def test_appending_source_padding_does_not_change_logits(settings):
    model = tiny_model(**settings)
    src, tgt = source_batch(), target_batch()
    padded = torch.cat([src, torch.full((src.size(0), 5), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=0)
        # ... whereas a real token in that place does change them
        other = padded.clone()
        other[:, -1] = 9
        assert not torch.allclose(model(other, tgt), model(src, tgt), atol=1e-4)


# --------------------------------------------------------------------------- attention


def test_multi_head_attention_matches_explicit_reference():
    d_model, h, d_k, d_v = 12, 3, 5, 7  # h·d_k = 15 and h·d_v = 21, both != d_model
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model, h, d_k, d_v)
    with torch.no_grad():
        for p in attn.parameters():  # non-zero biases too
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 4, d_model)
    memory = torch.randn(2, 6, d_model)
    lengths = torch.tensor([6, 3])
    mask = (torch.arange(6)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)

    # Reference: every head by hand with the module's own weights.
    w_k, w_v = attn.w_kv.weight.split([h * d_k, h * d_v], dim=0)
    b_k, b_v = attn.w_kv.bias.split([h * d_k, h * d_v], dim=0)
    q_all = x @ attn.w_q.weight.T + attn.w_q.bias
    k_all = memory @ w_k.T + b_k
    v_all = memory @ w_v.T + b_v
    heads = []
    for i in range(h):
        q = q_all[..., i * d_k:(i + 1) * d_k]
        k = k_all[..., i * d_k:(i + 1) * d_k]
        v = v_all[..., i * d_v:(i + 1) * d_v]
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_k)
        scores = scores + torch.where(mask[:, 0], 0.0, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    expected = torch.cat(heads, dim=-1) @ attn.w_o.weight.T + attn.w_o.bias

    with torch.no_grad():
        actual = attn(x, memory, mask)
    assert actual.shape == (2, 4, d_model)
    torch.testing.assert_close(actual, expected.detach(), atol=1e-5, rtol=1e-5)


def test_multi_head_attention_causal_matches_reference():
    d_model, h, d_k, d_v = 10, 2, 3, 6
    torch.manual_seed(1)
    attn = MultiHeadAttention(d_model, h, d_k, d_v)
    x = torch.randn(2, 5, d_model)
    w_k, w_v = attn.w_kv.weight.split([h * d_k, h * d_v], dim=0)
    b_k, b_v = attn.w_kv.bias.split([h * d_k, h * d_v], dim=0)
    q_all, k_all, v_all = (x @ attn.w_q.weight.T + attn.w_q.bias, x @ w_k.T + b_k, x @ w_v.T + b_v)
    future = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    heads = []
    for i in range(h):
        scores = q_all[..., i * d_k:(i + 1) * d_k] @ k_all[..., i * d_k:(i + 1) * d_k].transpose(-1, -2)
        scores = (scores / math.sqrt(d_k)).masked_fill(future, float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v_all[..., i * d_v:(i + 1) * d_v])
    expected = torch.cat(heads, -1) @ attn.w_o.weight.T + attn.w_o.bias
    with torch.no_grad():
        torch.testing.assert_close(attn(x, x, is_causal=True), expected.detach(), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("settings", KNOB_SETTINGS, ids=KNOB_IDS)
def test_incremental_decoding_equals_full_decode(settings):
    model = tiny_model(**{"d_k": 6, "d_v": 11, **settings})
    src, tgt = source_batch(), target_batch(length=8)
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_mask = model.encode(src)
        caches = [{} for _ in model.decoder]
        for position in range(tgt.size(1)):
            step = model.decode_step(tgt[:, position], memory, src_mask, caches, position)
            torch.testing.assert_close(step, full[:, position], atol=1e-5, rtol=1e-5)
    assert all(cache["self_k"].size(2) == tgt.size(1) for cache in caches)
    # the cache holds the key/value heads only (fewer than h with n_kv_heads)
    assert all(cache[name].size(1) == model.config.n_kv_heads for cache in caches for name in cache)


@pytest.mark.parametrize("settings", KNOB_SETTINGS, ids=KNOB_IDS)
def test_fixed_size_decoding_equals_full_decode(settings):
    """The fixed-size cache (`cuda_graphs`' decoding): the position a tensor, every step the same
    shapes, later slots hidden; the logits are the full decode's at every position."""
    model = tiny_model(**{"d_k": 6, "d_v": 11, **settings})
    src, tgt = source_batch(), target_batch(length=8)
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_mask = model.encode(src)
        caches = model.fixed_size_cache(memory, slots=11)
        shapes = {name: tensor.shape for name, tensor in caches[0].items()}
        for position in range(tgt.size(1)):
            step = model.decode_step(tgt[:, position], memory, src_mask, caches, torch.tensor(position))
            torch.testing.assert_close(step, full[:, position], atol=1e-5, rtol=1e-5)
    assert {name: tensor.shape for name, tensor in caches[0].items()} == shapes
    assert shapes["self_k"] == (src.size(0), model.config.n_kv_heads, 16, 6)  # 11 slots, aligned to 8
    assert shapes["self_v"] == (src.size(0), model.config.n_kv_heads, 16, 11)


def test_fixed_size_cache_takes_autocasts_dtype_and_refuses_more_slots_than_positions():
    model = tiny_model()
    src = source_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory, _ = model.encode(src)
        caches = model.fixed_size_cache(memory, slots=4)
    assert caches[0]["self_k"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="exceeds model.max_len"):
        model.fixed_size_cache(memory.float(), slots=model.config.max_len + 1)


# --------------------------------------------------------------------------- weight tying, embeddings


def test_single_shared_embedding_matrix():
    model = tiny_model()
    c = model.config
    vocab_shaped = [(name, p) for name, p in model.named_parameters(remove_duplicate=False)
                    if c.vocab_size in p.shape]
    assert [name for name, _ in vocab_shaped] == ["embedding.weight"]
    # every parameter is distinct storage, and they add up to the closed form (no second matrix)
    params = list(model.parameters())
    assert len({p.data_ptr() for p in params}) == len(params)
    assert sum(p.numel() for p in params) == count_parameters(c)
    state = model.state_dict()
    assert {k for k, v in state.items() if c.vocab_size in v.shape} == {"embedding.weight"}

    src, tgt = source_batch(), target_batch()
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        hidden = model.decode(tgt, memory, src_mask)
        torch.testing.assert_close(model(src, tgt), hidden @ model.embedding.weight.T)


def test_gradient_of_shared_matrix_comes_from_encoder_decoder_and_softmax():
    model = tiny_model()
    src = torch.tensor([[10, 11, 12]])
    tgt = torch.tensor([[BOS, 20, 21]])
    model(src, tgt)[0, -1, 30].backward()
    grad = model.embedding.weight.grad
    for token in (10, 11, 12):  # encoder input rows
        assert grad[token].abs().sum() > 0
    for token in (BOS, 20, 21):  # decoder input rows
        assert grad[token].abs().sum() > 0
    assert grad[30].abs().sum() > 0  # output-projection row of the chosen logit
    untouched = [t for t in range(VOCAB) if t not in (10, 11, 12, BOS, 20, 21, 30)]
    assert grad[untouched].abs().sum() == 0


def independent_sinusoid(pos: int, dim: int, d_model: int) -> float:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    i = dim // 2
    angle = pos / 10000 ** (2 * i / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_embed_scales_by_sqrt_d_model_and_adds_positions(positional):
    model = tiny_model(positional=positional)
    c = model.config
    tokens = torch.tensor([[5, 17, 42, 8, PAD], [9, 9, 3, 2, 1]])
    with torch.no_grad():
        for side, positions in (("source", model.src_positions), ("target", model.tgt_positions)):
            if positional == "learned":
                pe = positions.table.weight[:5]
            else:
                pe = torch.tensor([[independent_sinusoid(p, d, c.d_model) for d in range(c.d_model)]
                                   for p in range(5)])
            expected = model.embedding.weight[tokens] * math.sqrt(c.d_model) + pe
            torch.testing.assert_close(model.embed(tokens, side), expected, atol=1e-5, rtol=1e-5)
        # with an offset (incremental decoding) the positions shift
        if positional == "sinusoidal":
            pe3 = torch.tensor([independent_sinusoid(3, d, c.d_model) for d in range(c.d_model)])
            expected = model.embedding.weight[tokens[:, :1]] * math.sqrt(c.d_model) + pe3
            torch.testing.assert_close(model.embed(tokens[:, :1], "target", offset=3),
                                       expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_len,d_model", [(60, 16), (30, 33), (200, 64)])
def test_sinusoidal_table_matches_paper_formula(max_len, d_model):
    table = sinusoidal_table(max_len, d_model)
    assert table.shape == (max_len, d_model)
    for pos in sorted({0, 1, 2, 7, max_len // 2, max_len - 1}):
        for dim in sorted({0, 1, 2, 3, d_model // 2, d_model - 2, d_model - 1}):
            assert table[pos, dim].item() == pytest.approx(independent_sinusoid(pos, dim, d_model),
                                                           abs=2e-4), (pos, dim)


# --------------------------------------------------------------------------- post-LN structure


def test_post_ln_layers_output_normalised_and_no_final_layer_norm():
    model = tiny_model(n_layers=3)
    layer_norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(layer_norms) == 3 * 2 + 3 * 3  # two per encoder layer, three per decoder layer

    outputs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out))
             for layer in list(model.encoder) + list(model.decoder)]
    src, tgt = source_batch(), target_batch()
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        hidden = model.decode(tgt, memory, src_mask)
    for hook in hooks:
        hook.remove()
    assert len(outputs) == 6
    for out in outputs:  # LayerNorm with weight 1 and bias 0 (default init): mean 0, std 1
        assert out.mean(-1).abs().max() < 1e-5
        assert (out.var(-1, unbiased=False).sqrt() - 1).abs().max() < 1e-3
    # the stacks return their last layer's output untouched
    torch.testing.assert_close(memory, outputs[2], atol=0, rtol=0)
    torch.testing.assert_close(hidden, outputs[5], atol=0, rtol=0)

    # A final LayerNorm would renormalise: change the last layers' affine and it must show through.
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            stack[-1].sublayers[-1].norm.weight.fill_(2.0)
            stack[-1].sublayers[-1].norm.bias.fill_(0.5)
        memory, src_mask = model.encode(src)
        hidden = model.decode(tgt, memory, src_mask)
    for out in (memory, hidden):
        torch.testing.assert_close(out.mean(-1), torch.full(out.shape[:-1], 0.5), atol=1e-4, rtol=0)
        torch.testing.assert_close(out.var(-1, unbiased=False).sqrt(), torch.full(out.shape[:-1], 2.0),
                                   atol=1e-2, rtol=0)


def test_encoder_layer_is_layernorm_of_residual_plus_sublayer():
    model = tiny_model()
    layer = model.encoder[0]
    src = source_batch()
    with torch.no_grad():
        x = model.embed(src, "source")
        mask = model.padding_mask(src)
        ln1, ln2 = (s.norm for s in layer.sublayers)
        a = F.layer_norm(x + layer.self_attn(x, x, mask), (x.size(-1),), ln1.weight, ln1.bias, ln1.eps)
        expected = F.layer_norm(a + layer.feed_forward(a), (x.size(-1),), ln2.weight, ln2.bias, ln2.eps)
        torch.testing.assert_close(layer(x, mask), expected)
        ffn = layer.feed_forward
        torch.testing.assert_close(ffn(a), torch.relu(a @ ffn.w_1.weight.T + ffn.w_1.bias)
                                   @ ffn.w_2.weight.T + ffn.w_2.bias)


# --------------------------------------------------------------------------- parameter count


def paper_formula_params(vocab: int, n: int, d: int, d_ff: int, h: int, d_k: int, d_v: int,
                         learned_positions: int = 0) -> int:
    """Parameters of the paper's Transformer, written out module by module.

    Linear(i, o) has i·o weights and o biases; LayerNorm(d) has 2d. An attention layer has
    projections W^Q (d -> h·d_k), W^K (d -> h·d_k), W^V (d -> h·d_v) and W^O (h·d_v -> d).
    """
    def linear(i: int, o: int) -> int:
        return i * o + o

    attention = linear(d, h * d_k) + linear(d, h * d_k) + linear(d, h * d_v) + linear(h * d_v, d)
    ffn = linear(d, d_ff) + linear(d_ff, d)
    layer_norm = 2 * d
    encoder = n * (attention + ffn + 2 * layer_norm)
    decoder = n * (2 * attention + ffn + 3 * layer_norm)
    shared_embedding = vocab * d
    return shared_embedding + 2 * learned_positions * d + encoder + decoder


def test_base_model_parameter_count():
    # 63,082,496 comes from the issue; it is derived from the closed form above (the base model,
    # vocabulary 37,000, shared embedding, biases everywhere): recomputed here independently.
    assert paper_formula_params(37000, 6, 512, 2048, 8, 64, 64) == 63_082_496
    c = TransformerConfig(vocab_size=37000)
    assert count_parameters(c) == 63_082_496
    with torch.device("meta"):  # the real module, without allocating its memory
        model = Transformer(c)
    assert sum(p.numel() for p in model.parameters()) == 63_082_496


ODD_CONFIGS = [
    dict(n_layers=1, d_model=30, d_ff=37, n_heads=4, d_k=7, d_v=11),
    dict(n_layers=2, d_model=33, d_ff=17, n_heads=3, positional="learned", max_len=29),
    dict(n_layers=3, d_model=16, d_ff=64, n_heads=1, d_k=40, d_v=3),
    dict(n_layers=2, d_model=24, d_ff=24, n_heads=6, d_k=2, positional="learned", max_len=7),
]


@pytest.mark.parametrize("settings", ODD_CONFIGS)
def test_count_parameters_matches_module_for_odd_configs(settings):
    c = TransformerConfig(vocab_size=53, dropout=0.0, **{"max_len": 50, **settings})
    model = Transformer(c)
    actual = sum(p.numel() for p in model.parameters())
    assert actual == count_parameters(c)
    learned = c.max_len if c.positional == "learned" else 0
    assert actual == paper_formula_params(53, c.n_layers, c.d_model, c.d_ff, c.n_heads, c.d_k, c.d_v,
                                          learned)


KNOB_VALUES = dict(norm_position=["post", "pre"], norm=["layernorm", "rmsnorm"],
                   activation=["relu", "gelu", "swiglu", "geglu"], positional=["sinusoidal", "learned", "rope"],
                   tie_embeddings=["all", "decoder", "none"], scale_embeddings=[True, False], n_kv_heads=[6, 3, 1],
                   fused_qkv=[False, True])


@pytest.mark.parametrize("knob", list(KNOB_VALUES))
def test_count_parameters_matches_module_for_every_knob_combination(knob):
    # every combination of this knob's values with every value of each other knob, odd sizes
    # (d_k != d_v, h·d_k != d_model, d_ff != 4·d_model)
    for value in KNOB_VALUES[knob]:
        for other, values in KNOB_VALUES.items():
            for other_value in values if other != knob else values[:1]:
                settings = {knob: value, other: other_value} if other != knob else {knob: value}
                c = TransformerConfig(n_layers=2, d_model=24, d_ff=20, n_heads=6, d_k=2, d_v=5,
                                      vocab_size=53, max_len=19, **settings)
                model = Transformer(c)
                params = list(model.parameters())
                assert len({p.data_ptr() for p in params}) == len(params)
                assert sum(p.numel() for p in params) == count_parameters(c), settings


def test_count_parameters_matches_module_for_every_modifications_row():
    spec = load_spec("ablations/modifications.yaml")
    for row in spec:
        for scale, vocab, device in ((ScaleConfig(width=1 / 16, depth=1 / 3), 70, "cpu"),
                                     (ScaleConfig(), 37000, "meta")):
            c = TransformerConfig(**{**row_settings(row, spec, scale)["model"], "vocab_size": vocab, "max_len": 64})
            with torch.device(device):
                model = Transformer(c)
            assert sum(p.numel() for p in model.parameters()) == count_parameters(c), (row, device)


def test_count_parameters_matches_module_for_every_table3_row():
    spec = load_spec()
    assert len(spec) == 20
    small = ScaleConfig(width=1 / 16, depth=1 / 3)  # real (allocated) models, small
    for row in spec:
        for scale, vocab, device in ((small, 70, "cpu"), (ScaleConfig(), 37000, "meta")):
            model_settings = row_settings(row, spec, scale)["model"]
            c = TransformerConfig(**{**model_settings, "vocab_size": vocab, "max_len": 64})
            with torch.device(device):
                model = Transformer(c)
            actual = sum(p.numel() for p in model.parameters())
            assert actual == count_parameters(c), (row, device)
            learned = c.max_len if c.positional == "learned" else 0
            assert actual == paper_formula_params(vocab, c.n_layers, c.d_model, c.d_ff, c.n_heads,
                                                  c.d_k, c.d_v, learned), (row, device)


# --------------------------------------------------------------------------- it can learn


def test_tiny_model_overfits_fixed_pairs_and_greedy_reproduces_them():
    torch.manual_seed(0)
    model = Transformer(tiny_config(n_layers=2, d_model=32, d_ff=64, n_heads=4, vocab_size=50))
    g = torch.Generator().manual_seed(1)
    pairs = []
    for _ in range(8):
        src_len, tgt_len = torch.randint(3, 8, (2,), generator=g).tolist()
        pairs.append((torch.randint(4, 50, (src_len,), generator=g).tolist(),
                      torch.randint(4, 50, (tgt_len,), generator=g).tolist()))
    src = pad_batch([s for s, _ in pairs])
    tgt_in = pad_batch([[BOS] + t for _, t in pairs])
    tgt_out = pad_batch([t + [EOS] for _, t in pairs])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        nll = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
    assert nll.item() < 0.05
    hyps = greedy_search(model, src, BOS, EOS, max_len_offset=10)
    assert [h.tokens for h in hyps] == [t for _, t in pairs]


def test_padding_mask_is_an_additive_bias_whose_rows_lie_a_multiple_of_eight_apart():
    # SDPA's CUDA kernels want this layout; without it torch.compile guards on S % 8 and builds
    # the step twice (tests/test_gpu.py checks the graph count on a GPU).
    model = tiny_model()
    for s in range(1, 18):
        src = torch.randint(4, model.config.vocab_size, (3, s))
        src[1, s // 2:] = model.config.pad_id
        mask = model.padding_mask(src)
        assert mask.shape == (3, 1, 1, s) and mask.dtype == torch.float32
        real = (src != model.config.pad_id)[:, None, None, :]
        assert torch.equal(mask == 0, real) and torch.equal(mask == float("-inf"), ~real)
        assert mask.stride(0) % 8 == 0 and mask.stride(-1) == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the dtype attention computes in
        assert model.padding_mask(src).dtype == torch.bfloat16


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16 autocast"])
def test_the_compiled_step_hands_sdpa_a_bias_aligned_for_every_source_length(autocast, traced_graphs):
    """What Inductor checks before its CUDA SDPA kernels (`is_aligned_realized_tensor`): every
    stride but the last of the bias a multiple of 8. With the source length S symbolic, a bias
    with row stride S makes that a guard on S % 8, and the step compiles again for the first
    length of the other kind (on a GPU; CPU kernels skip the check). Here the traced graph, on a
    CPU: the bias SDPA receives must be aligned whatever S is, with no guard."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    from lightning_modules.compiling import compile_dynamic

    backend, graphs = traced_graphs
    # One layer of each attention shows it (tracing time grows with depth). Flash named: "auto" is
    # math for bf16 on a CPU, which Dynamo traces as its parts, not as the one SDPA call a GPU makes.
    model = tiny_model(n_layers=1, attention_backend="flash")
    compiled = compile_dynamic(model, backend=backend)
    src = torch.randint(4, model.config.vocab_size, (3, 13))
    src[0, -3:] = model.config.pad_id
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        compiled(src, torch.randint(4, model.config.vocab_size, (3, 9))).float().sum().backward()
    biases = [node.kwargs["attn_mask"].meta["val"] for node in graphs[0].graph.nodes
              if "scaled_dot_product" in str(node.target) and isinstance(node.kwargs.get("attn_mask"), torch.fx.Node)]
    assert len(biases) == 2 * model.config.n_layers  # encoder self-attention and cross-attention
    for bias in biases:
        assert bias.dtype == (torch.bfloat16 if autocast else torch.float32)
        assert isinstance(bias.size(-1), torch.SymInt)  # S is symbolic: one graph for every length
        assert all(statically_known_true(stride % 8 == 0) for stride in bias.stride()[:-1]), bias.stride()


@pytest.mark.parametrize("settings", [{}, dict(n_kv_heads=2, positional="rope")], ids=["paper", "gqa,rope"])
def test_fused_qkv_is_the_unfused_model_with_w_q_and_w_kv_stacked(settings):
    unfused, fused = tiny_model(seed=3, **settings), tiny_model(seed=3, fused_qkv=True, **settings)
    plain = unfused.state_dict()
    for i, layer in enumerate([*fused.encoder, *fused.decoder]):  # the same initial weights, stacked
        side, index = ("encoder", i) if i < len(fused.encoder) else ("decoder", i - len(fused.encoder))
        prefix = f"{side}.{index}.self_attn."
        for kind in ("weight", "bias"):
            stacked = torch.cat([plain[f"{prefix}w_q.{kind}"], plain[f"{prefix}w_kv.{kind}"]])
            assert torch.equal(getattr(layer.self_attn.w_qkv, kind), stacked)
    assert all("w_qkv" not in key for key in plain) and any("w_qkv" in key for key in fused.state_dict())
    src, tgt = source_batch(), source_batch(seed=2)
    calls = []
    for layer in [*fused.encoder, *fused.decoder]:  # each self-attention projects once, in one matmul
        layer.self_attn.w_qkv.register_forward_hook(lambda *args: calls.append(1))
    torch.testing.assert_close(fused(src, tgt), unfused(src, tgt), rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 * fused.config.n_layers
    # state_dicts load across the two layouts (an older checkpoint into a fused model, and back)
    other = tiny_model(seed=4, fused_qkv=True, **settings)
    other.load_state_dict(unfused.state_dict())
    torch.testing.assert_close(other(src, tgt), unfused(src, tgt), rtol=1e-5, atol=1e-5)
    back = tiny_model(seed=5, **settings)
    back.load_state_dict(fused.state_dict())
    assert all(torch.equal(v, plain[k]) for k, v in back.state_dict().items())
    assert count_parameters(fused.config) == sum(p.numel() for p in fused.parameters()) \
        == sum(p.numel() for p in unfused.parameters())


def sdpa_kernels_run(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, bf16: bool = False) -> set[str]:
    """The SDPA kernels a forward pass of `model` ran on this CPU (the profiler's op names)."""
    from torch.profiler import profile

    with profile() as prof, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model(src, tgt)
    return {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product_")}


@pytest.mark.parametrize("backend", ["math", "flash", "efficient", "cudnn"])
def test_attention_backend_runs_its_kernel_where_it_can_and_keeps_the_function(backend):
    """The named kernel first, the others in PyTorch's order behind it; on a CPU (flash and math
    only) "math" runs math although PyTorch's CPU dispatch ignores the priority, "flash" runs
    flash, and "efficient" and "cudnn" (no CPU kernel) fall back to flash; the outputs stay."""
    from torch.nn.attention import SDPBackend

    from lightning_modules.transformer import SDPA_BACKENDS

    default, chosen = tiny_model(seed=6), tiny_model(seed=6, attention_backend=backend)
    src, tgt = source_batch(), source_batch(seed=2)
    torch.testing.assert_close(chosen(src, tgt), default(src, tgt), rtol=1e-5, atol=1e-5)
    assert SDPA_BACKENDS[backend][0] == {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                                         "efficient": SDPBackend.EFFICIENT_ATTENTION,
                                         "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    ran = sdpa_kernels_run(chosen, src, tgt)
    assert ran == ({"aten::_scaled_dot_product_attention_math"} if backend == "math"
                   else {"aten::_scaled_dot_product_flash_attention_for_cpu"}), ran


def test_auto_attention_runs_math_for_bf16_on_a_cpu_and_flash_in_fp32():
    """"auto" is PyTorch's choice (flash on a CPU) but for bf16 on a CPU, where flash trains
    several times slower than math (docs/configuration.md); the bf16 outputs agree with fp32's."""
    model, src, tgt = tiny_model(seed=6), source_batch(), source_batch(seed=2)
    assert sdpa_kernels_run(model, src, tgt) == {"aten::_scaled_dot_product_flash_attention_for_cpu"}
    assert sdpa_kernels_run(model, src, tgt, bf16=True) == {"aten::_scaled_dot_product_attention_math"}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(src, tgt).float()
    torch.testing.assert_close(low, model(src, tgt), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_residual_bf16_keeps_the_stream_in_bf16_under_autocast_and_changes_nothing_without(norm_position):
    """model.residual_bf16: without autocast the model's outputs bit for bit; under bf16 autocast
    (on the CPU here) the embeddings and every sub-layer's output in bf16 where the default keeps
    them in fp32, and a few Adam steps whose losses stay within the GPU round's bf16 tolerance of
    the default's (2e-2 relative), gradients finite."""
    from lightning_modules.transformer import SublayerConnection

    plain, low = (tiny_model(seed=3, norm_position=norm_position, residual_bf16=flag) for flag in (False, True))
    src, tgt = source_batch(), target_batch()
    with torch.no_grad():
        assert torch.equal(low(src, tgt), plain(src, tgt))

    def stream_dtypes(model: Transformer) -> set[torch.dtype]:
        seen: set[torch.dtype] = set()
        hooks = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
                 for m in model.modules() if isinstance(m, SublayerConnection)]
        hooks.append(model.dropout.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype)))  # the embeddings
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(src, tgt)
        for hook in hooks:
            hook.remove()
        return seen

    assert stream_dtypes(plain) == {torch.float32} and stream_dtypes(low) == {torch.bfloat16}
    losses = {}
    for name, model in (("plain", plain), ("low", low)):
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses[name] = []
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(src, tgt[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
            optimizer.step()
            losses[name].append(loss.item())
    assert losses["low"] != losses["plain"]  # the stream was rounded
    assert losses["low"] == pytest.approx(losses["plain"], rel=2e-2)
    assert losses["low"][-1] < losses["low"][0]  # it trains
