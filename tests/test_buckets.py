"""Static shape buckets (`data.shape_buckets`) and `train.compile_mode`: the token budget, the
padding bound on WMT-like lengths, every pair once per epoch, resumable order, the same loss as
exact batches, and a compiled CUDA-graph-mode step on CPU that matches the eager one."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lightning_modules.compiling import INDUCTOR_PATCHES, known
from lightning_modules.config import DataConfig, RunConfig, TrainConfig, TransformerConfig
from lightning_modules.data.batching import (ShapeBuckets, TokenBucketBatchSampler, batch_shapes, bucket_lengths, collate,
                                             padding_share)
from lightning_modules.data.tokenizer import EOS_ID, PAD_ID
from foundation.errors import UserError
from lightning_modules.loss import label_smoothed_nll
from lightning_modules.transformer import Transformer

BUDGET = 500


def wmt_like(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source lengths lognormal (mean 27, sigma 0.6: WMT14's long tail), capped at 255; targets
    the source length times exp(N(0.05, 0.15)) (German a little longer, each pair its own ratio)."""
    rng = np.random.default_rng(seed)
    sigma = 0.6
    src = np.clip(np.rint(rng.lognormal(np.log(27) - sigma ** 2 / 2, sigma, n)), 1, 255).astype(np.int64)
    tgt = np.clip(np.rint(src * np.exp(rng.normal(0.05, 0.15, n))), 1, 255).astype(np.int64)
    return src, tgt


def small_corpus(n: int = 3000, seed: int = 4) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [max(1, int(rng.lognormvariate(2.8, 0.6))) % 120 + 1 for _ in range(n)]
    return src, [max(1, s + rng.randint(-4, 6)) for s in src]


def examples_of(src: list[int], tgt: list[int]) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(1)
    return [([rng.randint(4, 99) for _ in range(s)], [rng.randint(4, 99) for _ in range(t)])
            for s, t in zip(src, tgt)]


def test_bucket_lengths_are_the_least_padding_choice():
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 14, 400) * 2  # 13 distinct values, as multiples of 2
    values = np.unique(lengths)

    def padding(edges) -> int:
        edges = np.asarray(sorted(edges))
        return int((edges[np.searchsorted(edges, lengths)] - lengths).sum())

    for count in (1, 2, 3, 4):
        best = min(padding((*rest, values[-1])) for rest in itertools.combinations(values[:-1], count - 1))
        edges = bucket_lengths(lengths, count)
        assert len(edges) == count and edges[-1] == values[-1] and padding(edges) == best
    assert bucket_lengths(lengths, 20) == tuple(values.tolist())  # fewer lengths than buckets: all
    assert all(e % 4 == 0 for e in bucket_lengths(lengths, 3, multiple=4))


@pytest.mark.parametrize("count", [3, 6])
def test_buckets_keep_the_budget_a_few_shapes_and_every_pair_once(count):
    src, tgt = small_corpus()
    examples = examples_of(src, tgt)
    buckets = ShapeBuckets.fit(src, tgt, count, BUDGET)
    sampler = TokenBucketBatchSampler(src, tgt, BUDGET, seed=3, buckets=buckets)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(src)))  # each pair once
    slots = real = 0
    shapes = set()
    for batch in batches:
        tensors = collate([examples[i] for i in batch], buckets=sampler.buckets)
        rows, s_len = tensors["src"].shape
        t_len = tensors["tgt_out"].size(1)
        assert s_len in buckets.src and t_len in buckets.tgt
        assert rows * s_len <= BUDGET and rows * t_len <= BUDGET  # padding and empty rows included
        assert rows == BUDGET // max(s_len, t_len) >= len(batch)
        empty = tensors["tgt_out"][len(batch):]
        assert (empty == PAD_ID).all() and (tensors["src"][len(batch):, 0] == EOS_ID).all()
        assert tensors["n_tokens"] == int((tensors["tgt_out"] != PAD_ID).sum())
        shapes.add((rows, s_len, t_len))
        slots += rows * (s_len + t_len)
        real += sum(len(examples[i][0]) + len(examples[i][1]) + 2 for i in batch)
    assert len(shapes) <= count ** 2
    assert set(batch_shapes(batches, src, tgt, buckets=sampler.buckets)) == shapes
    assert padding_share(batches, src, tgt, buckets=sampler.buckets) == pytest.approx((slots - real) / slots)
    # partial batches are the exception: a cell's leftovers fill a larger cell's batches
    assert sum(len(b) < BUDGET // max(s, t) for b, (_, s, t) in
               zip(batches, batch_shapes(batches, src, tgt, buckets=sampler.buckets))) <= 2


def test_buckets_pad_wmt_like_lengths_by_at_most_5_percent_at_25k_tokens():
    src, tgt = wmt_like(1_000_000)
    exact = TokenBucketBatchSampler(src, tgt, 25_000, seed=1, num_replicas=1, rank=0).global_batches()
    shares = {}
    for count in (8, 32):
        buckets = ShapeBuckets.fit(src, tgt, count, 25_000)
        batches = TokenBucketBatchSampler(src, tgt, 25_000, seed=1, num_replicas=1, rank=0,
                                          buckets=buckets).global_batches()
        shares[count] = padding_share(batches, src, tgt, buckets=buckets)
        assert len(set(batch_shapes(batches, src, tgt, buckets=buckets))) <= count ** 2
    assert shares[32] <= 0.05
    assert shares[32] < shares[8]  # more buckets, less padding
    assert padding_share(exact, src, tgt) < shares[32]  # exact lengths stay the least padding


def test_bucketed_order_is_reproducible_reshuffled_per_epoch_and_resumable():
    src, tgt = small_corpus()
    buckets = ShapeBuckets.fit(src, tgt, 5, BUDGET)

    def sampler(**kw) -> TokenBucketBatchSampler:
        return TokenBucketBatchSampler(src, tgt, BUDGET, seed=7, buckets=buckets, **kw)

    first, again = sampler(), sampler()
    assert list(first) == list(again)
    whole = list(first)
    first.set_epoch(1)
    assert list(first) != whole and len(list(first)) == len(whole)
    resumed = sampler()
    resumed.resume_at(0, 5)
    assert list(resumed) == whole[5:]
    shards = [list(sampler(num_replicas=2, rank=r)) for r in range(2)]
    assert {i for s in shards for b in s for i in b} == set(range(len(src)))


def test_a_bucketed_batch_gives_the_loss_and_gradients_of_the_exact_batch():
    torch.manual_seed(0)
    src, tgt = small_corpus(40)
    examples = examples_of(src, tgt)[:9]
    buckets = ShapeBuckets.fit(src, tgt, 3, 5000)  # room for all 9 rows
    with pytest.raises(ValueError, match="do not fit"):
        collate(examples, buckets=buckets.with_budget(200))
    model = Transformer(TransformerConfig(n_layers=2, d_model=32, d_ff=64, n_heads=4, vocab_size=100,
                                          dropout=0.0)).eval()

    def loss_and_grads(batch):
        model.zero_grad()
        loss, nll, n = label_smoothed_nll(model(batch["src"], batch["tgt_in"]), batch["tgt_out"], PAD_ID, 0.1)
        (loss / n).backward()
        return (loss / n).item(), (nll / n).item(), int(n), [p.grad.clone() for p in model.parameters()]

    exact, bucketed = collate(examples), collate(examples, buckets=buckets)
    assert bucketed["src"].numel() > exact["src"].numel()  # more rows and longer ones
    a, b = loss_and_grads(exact), loss_and_grads(bucketed)
    assert a[2] == b[2] == bucketed["n_tokens"]
    assert b[0] == pytest.approx(a[0], rel=1e-6) and b[1] == pytest.approx(a[1], rel=1e-6)
    for ga, gb in zip(a[3], b[3]):
        torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6)


def test_datamodule_serves_bucketed_training_batches_and_exact_dev_batches(tmp_path: Path):
    from lightning_modules.data.datamodule import TranslationDataModule

    rng = random.Random(0)
    words = [f"w{i}" for i in range(200)]
    files = {}
    for split, n in (("train", 600), ("valid", 50)):
        for side in ("src", "tgt"):
            path = tmp_path / f"{split}.{side}"
            path.write_text("\n".join(" ".join(rng.choices(words, k=rng.randint(2, 25))) for _ in range(n)) + "\n")
            files[f"{split}_{side}"] = str(path)
    dm = TranslationDataModule(DataConfig(corpus="files", vocab_size=150, max_tokens=600, shape_buckets=4,
                                          **files), tmp_path / "run")
    dm.setup("fit")
    assert dm.stats["shape_buckets"] == 4 and dm.stats["train_shapes"] <= 16
    shapes = {(b["src"].shape, b["tgt_out"].shape) for b in dm.train_dataloader()}
    assert {(s[1], t[1]) for s, t in shapes} <= set(itertools.product(dm.buckets.src, dm.buckets.tgt))
    assert len(shapes) == dm.stats["train_shapes"]
    dev = next(iter(dm.val_dataloader()))
    assert dev["src"][:, -1].ne(PAD_ID).any()  # exact: the longest source fills its row


def test_compile_mode_settings_are_checked_and_old_configs_load():
    with pytest.raises(UserError, match="compile_mode must be one of"):
        TrainConfig(compile_mode="max-autotune-please")
    with pytest.raises(UserError, match="needs static shapes, data.shape_buckets"):
        RunConfig(train=TrainConfig(compile_mode="reduce-overhead"))
    with pytest.raises(UserError, match="shape_buckets must be >= 0"):
        DataConfig(shape_buckets=-1)
    with pytest.raises(UserError, match="add train.compile=true"):  # a mode without compiling: never ignored
        RunConfig(data=DataConfig(shape_buckets=24), train=TrainConfig(compile_mode="reduce-overhead"))
    with pytest.raises(UserError, match="add train.compile=true"):
        RunConfig(train=TrainConfig(compile_mode="max-autotune-no-cudagraphs"))
    RunConfig(data=DataConfig(shape_buckets=24), train=TrainConfig(compile=True, compile_mode="reduce-overhead"))
    old = yaml.safe_load("data: {pad_multiple: 8, max_tokens: 4000}\ntrain: {compile: true}\n")
    cfg = RunConfig(data=DataConfig(**old["data"]), train=TrainConfig(**old["train"]))
    assert (cfg.data.shape_buckets, cfg.data.pad_multiple, cfg.train.compile_mode) == (0, 8, "default")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compiled_bucketed_steps_match_eager_on_cpu(mode):
    _compiled_matches_eager(mode, steps=4)


def test_compiled_bucketed_step_matches_eager_on_cpu_fast():
    """Inductor's one compilation of the training step in make test (tests/test_step_speed.py's
    default-mode one merged here: on a CPU the two modes give Inductor the same code to generate,
    CUDA graphs being skipped; the default mode's torch.compile path runs in test_benchmarks.py's
    GPU round, compiled without Inductor): exact-length batches of several shapes, the first with
    as many source as target positions (duck sizing would guard on that), then bucketed ones."""
    _compiled_matches_eager("reduce-overhead", steps=2, exact=2)


def _compiled_matches_eager(mode: str, steps: int, exact: int = 0) -> None:
    """A few Adam steps on bucketed batches (after `exact` batches of exact lengths, each of its own
    shape), compiled by Inductor in `mode` and eager from the same weights: the same losses to fp32
    tolerance, and one compiled graph for all the shapes seen."""
    from lightning_modules.compiling import compiled_graphs, graph_traces
    from lightning_modules.translation import TranslationModule

    src, tgt = small_corpus(400)
    examples = examples_of(src, tgt)
    sampler = TokenBucketBatchSampler(src, tgt, BUDGET, seed=2, buckets=ShapeBuckets.fit(src, tgt, 3, BUDGET))
    every = [collate([examples[i] for i in b], buckets=sampler.buckets) for b in sampler]
    # the first batch, then one of another source shape first (so even 2 steps meet 2 shapes)
    other = next(i for i, b in enumerate(every) if b["src"].shape != every[0]["src"].shape)
    batches = ([every[0], every[other]] + [b for i, b in enumerate(every) if i not in (0, other)])[:steps]
    assert len({b["src"].shape for b in batches}) > 1
    if exact:  # first a batch whose source and target widths are equal, then ones of other shapes
        plain = [collate([examples[i] for i in b]) for b in TokenBucketBatchSampler(src, tgt, BUDGET, seed=2)]
        square = next(b for b in plain if b["src"].shape[1] == b["tgt_in"].shape[1])
        others = [b for b in plain if b["src"].shape[1] != b["tgt_in"].shape[1]
                  and b["src"].shape[1] != square["src"].shape[1]]
        batches = [square, *others[:exact - 1], *batches]
        assert len({(b["src"].shape, b["tgt_in"].shape) for b in batches[:exact]}) == exact
    losses = {}
    torch.compiler.reset()  # a fresh compilation, not one cached by another test
    graphs, traces = compiled_graphs(), graph_traces()
    for compiled in (False, True):
        torch.manual_seed(0)
        module = TranslationModule.from_configs(
            TransformerConfig(n_layers=1, d_model=32, d_ff=64, n_heads=4, vocab_size=100, dropout=0.0),
            TrainConfig(compile_mode=mode))
        if compiled:
            module.compile_step()
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
        losses[compiled] = []
        for batch in batches:
            loss, _, n = module._forward_loss_fn(batch["src"], batch["tgt_in"], batch["tgt_out"], 0.1)
            optimizer.zero_grad()
            (loss / n).backward()
            optimizer.step()
            losses[compiled].append((loss / n).item())
        # the first batch again, after every step: lower, if it trains (with grad, as the step ran:
        # the same compiled graph)
        loss, _, n = module._forward_loss_fn(batches[0]["src"], batches[0]["tgt_in"], batches[0]["tgt_out"], 0.1)
        losses[compiled].append((loss / n).item())
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
    assert losses[False][-1] < losses[False][0]  # it trains
    assert compiled_graphs() - graphs == 1  # one graph for every shape, exact and bucketed
    assert graph_traces() - traces == 1  # traced once: no float traced as a symbol, then fixed


@pytest.mark.slow
def test_a_bucketed_run_killed_mid_epoch_resumes_with_the_losses_of_an_uninterrupted_one(tmp_path, small_corpus):
    """`ablate train` with shape buckets, SIGKILLed after step 7 (its checkpoint: step 6, mid-epoch),
    then the same command: every step's loss bit for bit as the uninterrupted run's."""
    from test_reproducibility import losses, train

    buckets = ["data.shape_buckets=4", "data.max_tokens=4000"]
    whole = train(tmp_path / "whole", small_corpus, None, *buckets)
    assert whole.returncode == 0, whole.stderr[-3000:]
    results = json.loads((tmp_path / "whole" / "results.json").read_text())
    # the step-6 checkpoint the kill leaves lies inside an epoch (TINY's 300 pairs: epochs of a few batches)
    assert results["data"]["shape_buckets"] == 4 and 6 % results["data"]["train_batches"] != 0
    assert results["data"]["train_shapes"] <= 16
    stopped = train(tmp_path / "run", small_corpus, "train_step@7", *buckets)
    assert stopped.returncode == -9, stopped.stderr[-3000:]
    again = train(tmp_path / "run", small_corpus, None, *buckets)
    assert again.returncode == 0 and "not resumable" not in again.stderr, again.stderr[-3000:]
    assert len(losses(tmp_path / "whole")) == 16
    assert losses(tmp_path / "run") == losses(tmp_path / "whole")


def test_inductor_patches_this_torch_lacks_are_left_out():
    """The GPU machines run another torch than the pinned one: a config patch it lacks is dropped
    (Inductor would refuse it and fail every compilation), one it has is kept."""
    import torch._inductor.config as inductor_config

    assert known({"triton.no_such_patch": True, "no_such_group.patch": 1}) == {}
    assert known({"max_autotune": False, "triton.cudagraphs": False}) == {"max_autotune": False,
                                                                          "triton.cudagraphs": False}
    for key in known(INDUCTOR_PATCHES):  # what the pinned torch has is really there
        group, name = key.split(".")
        assert hasattr(getattr(inductor_config, group), name)
