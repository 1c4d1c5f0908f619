"""GPU probe (not part of the project): bare training step variants on real Multi30k shapes."""
import json, os, sys, time, math, functools, traceback
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
from lightning_modules.config import TransformerConfig, DataConfig
from lightning_modules.transformer import Transformer
from lightning_modules.translation import label_smoothed_nll
from lightning_modules.data import TranslationDataModule
from lightning_modules.data.batching import TokenBucketBatchSampler

OUT = Path(os.environ.get("OUT", "/tmp/out"))
LOG = OUT / "probe.jsonl"
dev = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = True
PEAK = 989e12


def emit(**rec):
    print(json.dumps(rec), flush=True)
    with LOG.open("a") as f:
        f.write(json.dumps(rec) + "\n")


t0 = time.perf_counter()
dm = TranslationDataModule(DataConfig(corpus="multi30k", data_dir=".data/multi30k", vocab_size=8000),
                           "/tmp/probe_run", seed=1)
dm.setup("fit")
emit(what="setup", s=round(time.perf_counter() - t0, 1), stats={k: v for k, v in dm.stats.items()})
ds = dm.train_set
rng = np.random.default_rng(0)
idmap = np.concatenate([np.arange(4), rng.choice(np.arange(4, 37000), 8000 - 4, replace=False)])


def batches(max_tokens, mult=1, n=40, vocab=37000):
    s = TokenBucketBatchSampler(ds.src_lengths, ds.tgt_lengths, max_tokens, shuffle=True, seed=1,
                                num_replicas=1, rank=0)
    out = []
    for b in s.global_batches()[:n]:
        ex = [ds[i] for i in b]
        S = max(len(x) for x, _ in ex) + 1
        T = max(len(y) for _, y in ex) + 1
        S, T = -(-S // mult) * mult, -(-T // mult) * mult
        src = torch.zeros(len(ex), S, dtype=torch.long)
        ti = torch.zeros(len(ex), T, dtype=torch.long)
        to = torch.zeros(len(ex), T, dtype=torch.long)
        for r, (x, y) in enumerate(ex):
            m = lambda a: (idmap[np.asarray(a, dtype=np.int64)] if vocab == 37000 else np.asarray(a))
            src[r, :len(x) + 1] = torch.tensor([*m(x), 3])
            ti[r, :len(y) + 1] = torch.tensor([2, *m(y)])
            to[r, :len(y) + 1] = torch.tensor([*m(y), 3])
        out.append(tuple(t.to(dev) for t in (src, ti, to)))
    return out


def flops_per_batch(c, src, tgt):
    """matmul FLOPs fwd+bwd (3x fwd), attention scores in full, vocab projection included."""
    B, S = src.shape
    T = tgt.shape[1]
    d, h, dk, dv, ff, N = c.d_model, c.n_heads, c.d_k, c.d_v, c.d_ff, c.n_layers
    proj = lambda L: 2 * L * (d * h * dk + d * h * (dk + dv) + h * dv * d)
    attn = lambda Lq, Lk: 2 * Lq * Lk * h * (dk + dv)
    ffn = lambda L: 4 * L * d * ff
    enc = N * (proj(S) + attn(S, S) + ffn(S))
    cross = 2 * T * (d * h * dk + h * dv * d) + 2 * S * d * h * (dk + dv) + attn(T, S)
    dec = N * (proj(T) + attn(T, T) + cross + ffn(T))
    return 3 * B * (enc + dec + 2 * T * d * c.vocab_size)


def fwd_loss(model, src, ti, to, eps):
    logits = model(src, ti)
    return label_smoothed_nll(logits, to, 0, eps)


def run_variant(name, cfg, bs, compile_kw=None, fused=False, steps=None, reps=2):
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    model = Transformer(cfg).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                           fused=fused)
    fn = functools.partial(fwd_loss, model)
    if compile_kw is not None:
        torch._dynamo.reset()
        fn = torch.compile(fn, **compile_kw)

    def step(b):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, nll, n = fn(*b, cfg.label_smoothing)
        (loss / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    from torch._dynamo.utils import counters
    counters.clear()
    t = time.perf_counter()
    for b in bs:  # warm-up: every shape once (compiles)
        step(b)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t
    recompiles = sum(counters["stats"].values()) if compile_kw is not None else 0
    frames = dict(counters["stats"]) if compile_kw is not None else {}
    times = []
    tok = sum(int((b[2] != 0).sum()) for b in bs)
    fl = sum(flops_per_batch(cfg, b[0], b[1]) for b in bs)
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for b in bs:
            step(b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    best = min(times)
    emit(what="step", name=name, warm_s=round(warm, 1), s_per_step=round(best / len(bs), 5),
         tok_s=round(tok * reps / sum(times)), mfu=round(fl / best / PEAK, 3),
         mean_tokens=round(tok / len(bs)), shapes=len({(b[0].shape, b[1].shape) for b in bs}),
         frames=frames, mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1))
    torch.cuda.reset_peak_memory_stats()
    del model, opt
    return fn


base = TransformerConfig(vocab_size=37000)
big = TransformerConfig(vocab_size=37000, d_model=1024, d_ff=4096, n_heads=16, dropout=0.3)
plan = os.environ.get("PLAN", "all")
b25 = batches(25000, 1, n=16)
b25_8 = batches(25000, 8, n=16)
b4 = batches(4000, 1, n=40)
b4_8 = batches(4000, 8, n=40)
emit(what="shapes", b25=len({(b[0].shape, b[1].shape) for b in b25}),
     b25_8=len({(b[0].shape, b[1].shape) for b in b25_8}),
     b4=len({(b[0].shape, b[1].shape) for b in b4}), b4_8=len({(b[0].shape, b[1].shape) for b in b4_8}))

variants = [
    ("eager", base, b25, None, False),
    ("eager_fused", base, b25, None, True),
    ("compile_dyn_m8", base, b25_8, dict(dynamic=True), True),
    ("compile_auto_m8", base, b25_8, dict(), True),
    ("eager_4k", base, b4, None, True),
    ("compile_dyn_4k_m8", base, b4_8, dict(dynamic=True), True),
    ("big_eager", big, b25, None, True),
    ("big_compile_dyn_m8", big, b25_8, dict(dynamic=True), True),
]
for name, cfg, bs, ck, fused in variants:
    try:
        t = time.perf_counter()
        run_variant(name, cfg, bs, ck, fused)
    except Exception as e:
        emit(what="error", name=name, err=repr(e)[:500], tb=traceback.format_exc()[-1500:])
    emit(what="elapsed", name=name, s=round(time.perf_counter() - t, 1), total=round(time.perf_counter() - t0, 1))

# profile: compiled dynamic step at 25K, top kernels
try:
    from torch.profiler import profile, ProfilerActivity
    cfg = base
    model = Transformer(cfg).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    fn = torch.compile(functools.partial(fwd_loss, model), dynamic=True)
    def step(b):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, nll, n = fn(*b, cfg.label_smoothing)
        (loss / n).backward(); opt.step(); opt.zero_grad(set_to_none=True)
    for b in b25_8[:4]:
        step(b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for b in b25_8[:4]:
            step(b)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70)
    (OUT / "profile_compiled.txt").write_text(table)
    print(table[:6000])
except Exception as e:
    emit(what="error", name="profile", err=repr(e)[:500])
emit(what="done", total=round(time.perf_counter() - t0, 1))
