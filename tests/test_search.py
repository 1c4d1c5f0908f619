"""Greedy and beam search: agreement with references, scores, batching, length caps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.config import TransformerConfig
from lightning_modules.search import Hypothesis, beam_search, greedy_search, length_penalty
from lightning_modules.transformer import Transformer

# Tiny models are fastest single-threaded; the default thread pool oversubscribes a busy 2-core box.
torch.set_num_threads(1)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB = 40
ALPHA = 0.6


def pad_batch(seqs: list[list[int]]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])


def make_model(seed: int = 0, max_len: int = 64, **knobs) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0,
                                         label_smoothing=0.0, vocab_size=VOCAB, max_len=max_len, **knobs))


def random_pairs(g: torch.Generator, n: int) -> tuple[list[list[int]], list[list[int]]]:
    """Sources of 2..8 tokens; the target is the source reversed with a fixed token mapping."""
    sources = [torch.randint(4, VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    targets = [[(x * 7) % (VOCAB - 4) + 4 for x in reversed(s)] for s in sources]
    return sources, targets


@pytest.fixture(scope="module")
def trained() -> Transformer:
    """A slightly trained model (100 Adam steps): peaked but imperfect distributions."""
    model = make_model()
    g = torch.Generator().manual_seed(1)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(100):
        sources, targets = random_pairs(g, 16)
        logits = model(pad_batch(sources), pad_batch([[BOS] + t for t in targets]))
        loss = F.cross_entropy(logits.flatten(0, 1), pad_batch([t + [EOS] for t in targets]).flatten(),
                               ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    return random_pairs(torch.Generator().manual_seed(7), 24)[0]


def rescore(model: Transformer, source: list[int], tokens: list[int]) -> tuple[float, float]:
    """(sum of log-probs of tokens + EOS, that / ((5 + len) / 6)^alpha) from one full forward pass."""
    with torch.no_grad():
        logp = model(torch.tensor([source]), torch.tensor([[BOS] + tokens])).log_softmax(-1)[0]
    targets = tokens + [EOS]
    total = float(sum(logp[i, t] for i, t in enumerate(targets)))
    return total, total / ((5 + len(targets)) / 6) ** ALPHA


def naive_greedy(model: Transformer, source: list[int], max_out: int) -> list[int]:
    """Greedy decoding by re-running the full model on the whole prefix (no cache)."""
    prefix = [BOS]
    with torch.no_grad():
        for _ in range(max_out):
            logits = model(torch.tensor([source]), torch.tensor([prefix]))[0, -1]
            token = int(logits.argmax())
            if token == EOS:
                break
            prefix.append(token)
    return prefix[1:]


def test_length_penalty_formula():
    for length in (1, 2, 7, 30):
        for alpha in (0.0, 0.6, 1.0, 2.0):
            assert length_penalty(length, alpha) == pytest.approx(((5 + length) / 6) ** alpha)
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(10, 0.0) == pytest.approx(1.0)
    lengths = torch.tensor([1.0, 4.0, 11.0])
    torch.testing.assert_close(length_penalty(lengths, 0.6), ((5 + lengths) / 6) ** 0.6)


def test_greedy_matches_naive_full_forward_decoding(trained, sources):
    hyps = greedy_search(trained, pad_batch(sources), BOS, EOS, max_len_offset=50, alpha=ALPHA)
    for source, hyp in zip(sources, hyps):
        # at most len + 50 output tokens with EOS, so at most len + 49 before it
        assert hyp.tokens == naive_greedy(trained, source, len(source) + 49)


@pytest.mark.parametrize("model_kind", ["random", "trained"])
def test_beam_size_one_equals_greedy(model_kind, trained, sources):
    model = trained if model_kind == "trained" else make_model(seed=3).eval()
    src = pad_batch(sources)
    greedy = greedy_search(model, src, BOS, EOS, max_len_offset=5, alpha=ALPHA)
    beam = beam_search(model, src, BOS, EOS, beam_size=1, alpha=ALPHA, max_len_offset=5)
    assert [h.tokens for h in beam] == [h.tokens for h in greedy]
    for b, g in zip(beam, greedy):
        assert b.score == pytest.approx(g.score, abs=1e-5)
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-5)


def test_hypothesis_scores_match_full_forward_rescoring(trained, sources):
    src = pad_batch(sources)
    for hyps in (greedy_search(trained, src, BOS, EOS, max_len_offset=50, alpha=ALPHA),
                 beam_search(trained, src, BOS, EOS, beam_size=4, alpha=ALPHA, max_len_offset=50)):
        natural = 0
        for source, hyp in zip(sources, hyps):
            assert isinstance(hyp, Hypothesis)
            assert EOS not in hyp.tokens and PAD not in hyp.tokens and BOS not in hyp.tokens
            if len(hyp.tokens) + 1 >= len(source) + 50:
                continue  # cut at the cap: see test_scores_at_the_length_cap_...
            natural += 1
            log_prob, score = rescore(trained, source, hyp.tokens)
            assert hyp.log_prob == pytest.approx(log_prob, abs=1e-4)
            assert hyp.score == pytest.approx(score, abs=1e-4)
        assert natural >= 0.75 * len(sources)


@pytest.mark.parametrize("knobs", [dict(positional="rope"), dict(n_kv_heads=1), dict(n_kv_heads=2),
                                   dict(tie_embeddings="none", scale_embeddings=False),
                                   dict(norm_position="pre", norm="rmsnorm", activation="swiglu", positional="rope")],
                         ids=["rope", "mqa", "gqa", "untied-unscaled", "modern"])
def test_search_with_the_cache_equals_full_recomputation_for_the_modifications(knobs, sources):
    # the cache reordered across beams holds n_kv_heads heads; rotary needs each step's position
    model = make_model(seed=5, **knobs).eval()
    src = pad_batch(sources[:8])
    for source, hyp in zip(sources, greedy_search(model, src, BOS, EOS, max_len_offset=6, alpha=ALPHA)):
        assert hyp.tokens == naive_greedy(model, source, len(source) + 5)
    for source, hyp in zip(sources, beam_search(model, src, BOS, EOS, beam_size=4, alpha=ALPHA, max_len_offset=6)):
        log_prob, score = rescore(model, source, hyp.tokens)
        assert hyp.log_prob == pytest.approx(log_prob, abs=1e-4)
        assert hyp.score == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("knobs", [{}, dict(positional="rope"), dict(n_kv_heads=2), dict(positional="learned"),
                                   dict(norm_position="pre", norm="rmsnorm", activation="swiglu", positional="rope")],
                         ids=["paper", "rope", "gqa", "learned", "modern"])
def test_fixed_size_search_equals_the_growing_one(knobs, sources):
    """`cuda_graphs=True` decodes through fixed-size buffers in which finished sentences' rows
    stay (on a CPU without the graph): the same hypotheses as the growing caches that drop them."""
    model = make_model(seed=7, **knobs).eval()
    src = pad_batch(sources)
    for beam_size in (1, 4):
        growing = beam_search(model, src, BOS, EOS, beam_size=beam_size, alpha=ALPHA, max_len_offset=6)
        fixed = beam_search(model, src, BOS, EOS, beam_size=beam_size, alpha=ALPHA, max_len_offset=6,
                            cuda_graphs=True)
        assert [h.tokens for h in fixed] == [h.tokens for h in growing]
        for f, g in zip(fixed, growing):
            assert f.score == pytest.approx(g.score, abs=1e-4) and f.log_prob == pytest.approx(g.log_prob, abs=1e-4)
    assert len({len(h.tokens) for h in growing}) > 1  # sentences ended at different steps


def test_fixed_size_search_of_a_trained_model_as_sentences_leave(trained, sources):
    growing = beam_search(trained, pad_batch(sources), BOS, EOS, beam_size=4, alpha=ALPHA, max_len_offset=50)
    fixed = beam_search(trained, pad_batch(sources), BOS, EOS, beam_size=4, alpha=ALPHA, max_len_offset=50,
                        cuda_graphs=True)
    assert [h.tokens for h in fixed] == [h.tokens for h in growing]
    assert len({len(h.tokens) for h in growing}) > 1


def test_beam_four_scores_at_least_greedy_on_average(trained, sources):
    src = pad_batch(sources)
    greedy = greedy_search(trained, src, BOS, EOS, max_len_offset=50, alpha=ALPHA)
    beam = beam_search(trained, src, BOS, EOS, beam_size=4, alpha=ALPHA, max_len_offset=50)
    greedy_scores = [rescore(trained, s, h.tokens)[1] for s, h in zip(sources, greedy)]
    beam_scores = [rescore(trained, s, h.tokens)[1] for s, h in zip(sources, beam)]
    assert sum(beam_scores) / len(beam_scores) >= sum(greedy_scores) / len(greedy_scores)
    # and beam search actually explores: it finds something different for some sentences
    assert any(b.tokens != g.tokens for b, g in zip(beam, greedy))


@pytest.mark.parametrize("max_len_offset", [50, 2])
def test_batched_beam_search_equals_one_sentence_at_a_time(trained, sources, max_len_offset):
    batched = beam_search(trained, pad_batch(sources), BOS, EOS, beam_size=4, alpha=ALPHA,
                          max_len_offset=max_len_offset)
    assert len(batched) == len(sources)
    lengths = set()
    for source, hyp in zip(sources, batched):
        alone = beam_search(trained, torch.tensor([source]), BOS, EOS, beam_size=4, alpha=ALPHA,
                            max_len_offset=max_len_offset)[0]
        assert hyp.tokens == alone.tokens
        assert hyp.score == pytest.approx(alone.score, abs=1e-4)
        assert hyp.log_prob == pytest.approx(alone.log_prob, abs=1e-4)
        lengths.add(len(hyp.tokens))
    assert len(lengths) > 1  # sentences finish at different steps, so the batch shrinks


@pytest.mark.parametrize("max_len_offset", [0, 1, 3])
@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_output_never_exceeds_source_length_plus_offset(beam_size, max_len_offset, sources):
    model = make_model(seed=5).eval()  # untrained: rarely says EOS, so the cap binds
    hyps = beam_search(model, pad_batch(sources), BOS, EOS, beam_size=beam_size, alpha=ALPHA,
                       max_len_offset=max_len_offset)
    at_cap = 0
    for source, hyp in zip(sources, hyps):
        assert len(hyp.tokens) + 1 <= len(source) + max_len_offset  # EOS included
        at_cap += len(hyp.tokens) + 1 == len(source) + max_len_offset
    assert at_cap > 0  # the cap was exercised


@pytest.mark.parametrize("beam_size", [1, 4])
def test_output_length_is_capped_by_model_max_len(beam_size):
    model = make_model(seed=5, max_len=6).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, PAD, PAD, PAD]])
    hyps = beam_search(model, src, BOS, EOS, beam_size=beam_size, alpha=ALPHA, max_len_offset=50)
    assert all(len(h.tokens) + 1 <= 6 for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_scores_at_the_length_cap_include_the_real_eos_log_prob(beam_size, trained, sources):
    hyps = beam_search(trained, pad_batch(sources), BOS, EOS, beam_size=beam_size, alpha=ALPHA,
                       max_len_offset=0)
    for source, hyp in zip(sources, hyps):
        log_prob, score = rescore(trained, source, hyp.tokens)
        assert hyp.log_prob == pytest.approx(log_prob, abs=1e-4)
        assert hyp.score == pytest.approx(score, abs=1e-4)


def test_final_choice_uses_length_normalised_score(trained, sources):
    """A larger alpha favours longer hypotheses; the winner maximises log_prob / lp(len, alpha)."""
    src = pad_batch(sources)
    plain = beam_search(trained, src, BOS, EOS, beam_size=4, alpha=0.0)
    strong = beam_search(trained, src, BOS, EOS, beam_size=4, alpha=2.0)

    def score(source, tokens, alpha):
        return rescore(trained, source, tokens)[0] / ((5 + len(tokens) + 1) / 6) ** alpha

    for source, p, s in zip(sources, plain, strong):
        assert p.score == pytest.approx(p.log_prob, abs=1e-5)  # alpha 0: no normalisation
        assert s.score == pytest.approx(s.log_prob / ((5 + len(s.tokens) + 1) / 6) ** 2.0, abs=1e-5)
        assert len(s.tokens) >= len(p.tokens)
        assert score(source, s.tokens, 2.0) >= score(source, p.tokens, 2.0) - 1e-5
        assert p.log_prob >= s.log_prob - 1e-5
    assert any(len(s.tokens) > len(p.tokens) for p, s in zip(plain, strong))
