"""Benchmark 4: our batched greedy and beam search against Hugging Face `generate`.

Both decode with the same network: our demo-size model, trained briefly on Ding here (or
loaded with `--checkpoint`), and a `MarianMTModel` holding the same weights (`peers.port_to_marian`,
verified on logits). Both decode the same length-bucketed batches of Ding dev sentences:

* greedy: ours vs `generate(num_beams=1, do_sample=False)`: the same algorithm, so the same
  tokens are expected (a sentence that reaches its own length cap, source + 50, stops there in
  ours while HF caps the whole batch at its longest source; such a sentence agrees when HF's
  output starts with ours);
* beam 4: ours (GNMT length penalty ((5 + |Y|)/6)^α, α 0.6, early termination) vs
  `generate(num_beams=4, length_penalty=0.6, early_stopping=True)`, whose penalty is |Y|^α:
  the same search with a different final ranking, so the outputs may differ; we report the share
  that agree.

With `--precision fp32,bf16` our greedy and beam search also decode in each further precision (the
model and HF in the first): `same output as peer` is then the share identical to ours in the first,
`vs fp32` sentences/s over the same search's in fp32.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from benchmarks.common import (
    Section,
    Settings,
    alternate,
    data_module,
    median,
    on_device,
    over_fp32,
    spread,
    stopwatch,
    token_batches,
)
from benchmarks.peers import logits_error, port_to_marian
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from lightning_modules.evaluate import length_batches
from lightning_modules.search import beam_search, greedy_search
from lightning_modules.transformer import Transformer
from lightning_modules.loss import label_smoothed_nll
from lightning_modules.run.use import read_run_config
from lightning_modules.translation import TranslationModule

TARGET_SPEEDUP = 3.0
PORT_TOLERANCE = 1e-4
BEAM, ALPHA, OFFSET = 4, 0.6, 50


def train_demo_model(settings: Settings, steps: int, n_layers: int = 3
                     ) -> tuple[Transformer, Any, dict[str, Any]]:
    """The demo preset's base model trained `steps` steps on Ding (1,500-token batches, the
    demo preset's lr_scale 0.5 and warmup 200): enough to emit EOS at realistic lengths."""
    config = TransformerConfig(n_layers=n_layers, d_model=64, d_ff=256, n_heads=8,
                               vocab_size=2000, max_len=256)
    dm = data_module(settings, config.vocab_size)
    torch.manual_seed(settings.seed)
    module = TranslationModule.from_configs(
        config, TrainConfig(max_steps=steps, warmup_steps=min(200, max(steps // 2, 1)),
                            lr_scale=0.5, wandb="off"))
    module.to(settings.device).train()
    configured = module.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    batches = token_batches(dm, 1500, 10**9, seed=settings.seed)  # one shuffled epoch
    start, loss_value = time.perf_counter(), float("nan")
    for step in range(steps):
        batch = on_device(batches[step % len(batches)], settings.device)
        with settings.autocast():
            logits = module(batch["src"], batch["tgt_in"])
        loss, nll, n = label_smoothed_nll(logits, batch["tgt_out"], PAD_ID, 0.1)
        optimizer.zero_grad(set_to_none=True)
        (loss / n).backward()
        optimizer.step()
        scheduler.step()
        if step == steps - 1:
            loss_value = float(nll / n)
    info = {"source": "trained here", "steps": steps, "train_seconds": time.perf_counter() - start,
            "last_batch_nll": loss_value}
    return module.model.eval(), dm, info


def load_checkpoint(settings: Settings, path: Path) -> tuple[Transformer, Any, dict[str, Any]]:
    """A model from an `ablate train` checkpoint, with its run's BPE model and corpus."""
    run_dir = path.resolve().parent.parent  # RUN/checkpoints/last.ckpt
    cfg = read_run_config(run_dir)
    module = TranslationModule.load_from_checkpoint(str(path), map_location="cpu",
                                                    weights_only=True)
    data = {k: v for k, v in cfg["data"].items()
            if k not in ("corpus", "vocab_size", "max_tokens", "num_workers")}
    dm = data_module(settings, cfg["data"]["vocab_size"], corpus=cfg["data"]["corpus"],
                     run_dir=run_dir, max_len=module.model_config.max_len, **data)
    return module.model.to(settings.device).eval(), dm, {"source": str(path)}


def _hf_tokens(sequences: torch.Tensor) -> list[list[int]]:
    """`generate` output rows -> ids after the start token, up to (without) EOS, no padding."""
    out = []
    for row in sequences[:, 1:].tolist():
        row = row[: row.index(EOS_ID)] if EOS_ID in row else row
        out.append([t for t in row if t != PAD_ID])
    return out


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def host_work(fn: Callable[[], Any], cuda: bool, sentences: int) -> dict[str, float | None]:
    """What one call of `fn` asks of the host per sentence, under torch.profiler (outside any
    timing): the PyTorch operators it dispatches (aten calls not made by another aten call) and, on
    CUDA, the kernels and CUDA graphs it launches. Counts, not times: they do not depend on the load."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
    events = prof.events()
    operators = sum(e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))
                    for e in events)
    return {"operators": operators / sentences,
            "kernel launches": sum(e.name in LAUNCHES for e in events) / sentences if cuda else None,
            "graph launches": sum(e.name == "cudaGraphLaunch" for e in events) / sentences if cuda else None}


def run(settings: Settings) -> Section:
    section = Section("generation", "4. Generation: batched search vs Hugging Face generate",
                      ["decoder", "sentences/s", "ms/sentence", "ours/HF", "vs fp32", "same output as peer",
                       "mean length", "hit length cap", "spread", "operators", "kernel launches",
                       "graph launches"],
                      formats={"same output as peer": "{:.1%}", "hit length cap": "{:.1%}", "operators": "{:,.0f}",
                               "kernel launches": "{:,.0f}", "graph launches": "{:,.1f}"})
    try:
        import transformers
    except ImportError:
        section.notes.append("Skipped: `transformers` is not installed (pip install -e '.[bench]').")
        return section
    transformers.logging.set_verbosity_error()
    device = settings.device
    quick = settings.quick
    with stopwatch(section):
        if settings.checkpoint:
            model, dm, info = load_checkpoint(settings, settings.checkpoint)
        else:
            model, dm, info = train_demo_model(settings, *((60, 1) if quick else (400, 3)))
        c = model.config

        n_sentences = 24 if quick else 400
        sources = [ids[: c.max_len - 1] + [EOS_ID] for ids in dm.encode(dm.corpus.valid.src[:n_sentences])]
        batches = []
        for index in length_batches([len(s) for s in sources], 300 if quick else 1000):
            src = pad_sequence([torch.tensor(sources[i]) for i in index], batch_first=True, padding_value=PAD_ID)
            batches.append((index, src.to(device)))

        peer, position_gap = port_to_marian(model)
        marian = peer.marian
        probe = batches[len(batches) // 2][1]
        tgt_in = torch.cat([torch.full((probe.size(0), 1), BOS_ID, device=device), probe[:, :-1]], 1)
        error = logits_error(model, peer, probe, tgt_in)
        print(f"[generation] model: {info['source']}; Marian port: max |Δlogits| = {error:.2e}, "
              f"Marian's own sinusoid table vs ours (permuted): {position_gap:.1e}", flush=True)
        if not error <= PORT_TOLERANCE:
            raise RuntimeError(f"the Marian port does not compute our function: max |Δlogits| = "
                               f"{error:.3g} > {PORT_TOLERANCE}")

        limits = [min(len(s) + OFFSET, c.max_len) for s in sources]
        outputs: dict[str, list[list[int]]] = {}

        def ours(beam: int, graphs: bool = False, precision: str | None = None) -> None:
            result: list[list[int]] = [[] for _ in sources]
            for index, src in batches:
                with settings.autocast(precision):
                    hyps = beam_search(model, src, BOS_ID, EOS_ID, beam, ALPHA, OFFSET, cuda_graphs=graphs)
                for i, hyp in zip(index, hyps):
                    result[i] = hyp.tokens
            outputs[f"ours {beam}" + (" graphs" if graphs else "") + (f" {precision}" if precision else "")] = result

        def hf(beam: int) -> None:
            result: list[list[int]] = [[] for _ in sources]
            for index, src in batches:
                options: dict[str, Any] = {"num_beams": beam, "do_sample": False}
                if beam > 1:
                    options.update(length_penalty=ALPHA, early_stopping=True)
                with settings.autocast(), torch.no_grad():
                    sequences = marian.generate(
                        input_ids=src, attention_mask=src != PAD_ID,
                        max_new_tokens=max(limits[i] for i in index), **options)
                for i, tokens in zip(index, _hf_tokens(sequences)):
                    result[i] = tokens
            outputs[f"HF {beam}"] = result

        first = batches[0]
        warm = {"ours greedy": lambda: greedy_search(model, first[1], BOS_ID, EOS_ID, OFFSET),
                "HF greedy": lambda: marian.generate(input_ids=first[1], max_new_tokens=8,
                                                     attention_mask=first[1] != PAD_ID),
                "ours beam 4": lambda: beam_search(model, first[1], BOS_ID, EOS_ID, BEAM, ALPHA, 8),
                "HF beam 4": lambda: marian.generate(input_ids=first[1], num_beams=BEAM,
                                                     max_new_tokens=8,
                                                     attention_mask=first[1] != PAD_ID)}
        runs = {"ours greedy": lambda: ours(1), "HF greedy": lambda: hf(1),
                "ours beam 4": lambda: ours(BEAM), "HF beam 4": lambda: hf(BEAM)}
        # eval.cuda_graphs: on a CPU the fixed-size step runs without a graph (slower, so timed
        # only in the quick smoke check, which runs its code)
        graphed = device.type == "cuda" or quick
        if graphed:
            warm |= {"ours greedy, CUDA graphs": lambda: greedy_search(model, first[1], BOS_ID, EOS_ID, OFFSET,
                                                                        cuda_graphs=True),
                     "ours beam 4, CUDA graphs": lambda: beam_search(model, first[1], BOS_ID, EOS_ID, BEAM, ALPHA, 8,
                                                                     cuda_graphs=True)}
            runs |= {"ours greedy, CUDA graphs": lambda: ours(1, True), "ours beam 4, CUDA graphs": lambda: ours(BEAM, True)}
        others = settings.compared[1:]  # further precisions: our searches again (warmed up by a whole pass)
        for p in others:
            runs |= {f"ours greedy, {p}": lambda p=p: ours(1, precision=p), f"ours beam 4, {p}": lambda p=p: ours(BEAM, precision=p)}
        times = alternate(runs, settings.reps_or(2 if quick else 3), device, warmup=warm)
        work = {name: host_work(runs[name], device.type == "cuda", len(sources)) for name in runs}  # one more pass each

        def capped(tokens: list[int], i: int) -> bool:
            return len(tokens) + 1 >= limits[i]

        def agreement(a: str, b: str, prefix_when_capped: bool) -> float:
            return sum(x == y or (prefix_when_capped and capped(x, i) and y[: len(x)] == x)
                       for i, (x, y) in enumerate(zip(outputs[a], outputs[b]))) / len(sources)

        agree = {"greedy": agreement("ours 1", "HF 1", True),
                 "beam 4": agreement("ours 4", "HF 4", False)}
        if graphed:  # the same search over other buffers: its peer is ours
            agree |= {"greedy, CUDA graphs": agreement("ours 1 graphs", "ours 1", False),
                      "beam 4, CUDA graphs": agreement("ours 4 graphs", "ours 4", False)}
        for p in others:  # the same search in another precision: its peer is ours in the first
            agree |= {f"greedy, {p}": agreement(f"ours 1 {p}", "ours 1", False),
                      f"beam 4, {p}": agreement(f"ours 4 {p}", "ours 4", False)}
        speed = {name: len(sources) / median(t) for name, t in times.items()}
        decoders = [("ours greedy", "ours 1"), ("HF greedy", "HF 1"), ("ours beam 4", "ours 4"), ("HF beam 4", "HF 4")]
        if graphed:
            decoders += [("ours greedy, CUDA graphs", "ours 1 graphs"), ("ours beam 4, CUDA graphs", "ours 4 graphs")]
        decoders += [(f"ours {kind}, {p}", f"ours {n} {p}") for p in others for kind, n in (("greedy", 1), ("beam 4", 4))]
        named = {(kind, p): f"ours {kind}" + (f", {p}" if p in others else "")
                 for kind in ("greedy", "beam 4") for p in settings.compared}
        vs_fp32 = {named[k]: r for k, r in over_fp32({k: speed[name] for k, name in named.items()}).items()}
        for name, key in decoders:
            kind = "greedy" if "greedy" in name else "beam 4"
            hyps = outputs[key]
            section.rows.append({
                "decoder": name, "sentences/s": speed[name], "ms/sentence": 1000 / speed[name],
                "ours/HF": speed[name] / speed[f"HF {kind}"] if name.startswith("ours") and key.split()[-1] not in others else None,
                "vs fp32": vs_fp32.get(name),
                "same output as peer": agree.get(name.replace("ours ", ""), agree[kind]),
                "mean length": sum(map(len, hyps)) / len(hyps),
                "hit length cap": sum(capped(h, i) for i, h in enumerate(hyps)) / len(hyps),
                "spread": spread(times[name]), **work[name]})
        beam_speedup = speed["ours beam 4"] / speed["HF beam 4"]
        section.target("beam 4: ours/HF generate sentences/s", beam_speedup,
                       f"≥ {TARGET_SPEEDUP}", beam_speedup >= TARGET_SPEEDUP)
        section.target("greedy: same tokens as HF greedy", agree["greedy"], "= 100%",
                       agree["greedy"] == 1.0)
        if graphed:
            graphs_speedup = speed["ours beam 4, CUDA graphs"] / speed["HF beam 4"]
            section.target("beam 4 with CUDA graphs: ours/HF generate sentences/s", graphs_speedup,
                           f"≥ {TARGET_SPEEDUP}", graphs_speedup >= TARGET_SPEEDUP)
        section.data = {"model": info, "config": vars(c).copy(), "sentences": len(sources),
                        "batches": len(batches), "port_max_abs_logit_error": error,
                        "marian_position_table_gap": position_gap, "times_s": times,
                        "sentences_per_s": speed, "agreement": agree, "host_work": work,
                        "greedy_speedup": speed["ours greedy"] / speed["HF greedy"],
                        "beam_speedup": beam_speedup}
    section.notes += [
        f"Model: {info['source']}" + (f" ({info['steps']} steps, {info['train_seconds']:.0f} s, "
                                      f"last batch NLL {info['last_batch_nll']:.2f})"
                                      if "steps" in info else "")
        + f"; N {c.n_layers}, d_model {c.d_model}, h {c.n_heads}, vocab {c.vocab_size:,}. "
        f"{len(sources)} Ding dev sentences in {len(batches)} length-bucketed batches, the same "
        "for both decoders.",
        f"Weights ported into MarianMTModel (residual coordinates permuted from our interleaved "
        f"sin/cos to Marian's sin-half/cos-half layout, K/V split, final_logits_bias 0): "
        f"max |Δlogits| {error:.1e} (checked ≤ {PORT_TOLERANCE:g}); Marian's own sinusoid table "
        f"differs from ours (permuted) by {position_gap:.1e} (float64 vs float32 formula), "
        f"positions start at 0 in both; ours is copied in.",
        "Beam: ours ranks finished hypotheses by log P / ((5 + |Y|)/6)^0.6 (GNMT, the paper), HF "
        "by log P / |Y|^0.6; same beam size, EOS handling and early stopping, so differences come "
        "from the ranking (and from HF capping the batch at its longest source + 50).",
        "operators, kernel launches, graph launches: per sentence, what one more pass of each "
        "decoder over all batches asks of the host, counted under torch.profiler outside the "
        "timing: PyTorch operators dispatched (aten calls not made by another), and on CUDA the "
        "kernels and CUDA graphs launched.",
        "CUDA graphs (`eval.cuda_graphs`): our search over fixed-size caches, each batch's step "
        "captured once and replayed (on a CPU without a graph: timed in the quick smoke check "
        "only); its peer is our own search over growing caches.",
    ]
    if settings.compared[1:]:
        section.notes.append(f"{', '.join(settings.compared[1:])}: our searches under that autocast, the model as trained "
                             f"(in {settings.precision}); their peer is the same search in {settings.precision}.")
    return section
