import os, sys, torch, time
sys.path.insert(0, os.getcwd())
from pathlib import Path
from benchmarks.end_to_end import BASE, epoch_batches
from lightning_modules.config import DataConfig, TrainConfig, TransformerConfig
from lightning_modules.data import TranslationDataModule
from lightning_modules.translation import TranslationModule
from torch.profiler import profile, ProfilerActivity
dev = torch.device("cuda")
dm = TranslationDataModule(DataConfig(corpus="multi30k", data_dir=".data/multi30k", vocab_size=8000), "/tmp/ablate-e2e/eager", pad_multiple=8)
dm.setup("fit")
bs = [{k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in b.items()} for b in epoch_batches(dm, 25000)[:6]]
c = TransformerConfig(**BASE, vocab_size=8000)
m = TranslationModule.from_configs(c, TrainConfig()).to(dev); m.compile_step()
opt = torch.optim.Adam(m.parameters(), lr=1e-4, fused=True)
def step(b):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _, n = m._forward_loss_fn(b["src"], b["tgt_in"], b["tgt_out"], 0.1)
    (loss / n).backward(); opt.step(); opt.zero_grad(set_to_none=True)
t=time.time()
for b in bs: step(b)
torch.cuda.synchronize(); print("warm", time.time()-t, flush=True)
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for b in bs: step(b)
    torch.cuda.synchronize()
t = prof.key_averages().table(sort_by="cuda_time_total", row_limit=35, max_name_column_width=60)
Path(os.environ["OUT"], "profile.txt").write_text(t); print(t)
