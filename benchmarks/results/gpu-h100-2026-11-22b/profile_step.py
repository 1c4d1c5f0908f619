"""Profile the bare training step (base dims, BPE 37,000, WMT-length newstest batches of 25K
tokens), eager or compiled: where the CUDA time goes. Usage: python profile_step.py eager|compiled"""
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import BASE, Settings, data_module, sync, token_batches
from benchmarks.end_to_end import newstest_files, train_step
from lightning_modules.config import TransformerConfig

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
settings = Settings(device=torch.device("cuda"), precision="bf16", reps=1, quick=False,
                    cache_dir=Path(tempfile.mkdtemp()), multi30k_dir=None)
work = Path(tempfile.mkdtemp())
dm = data_module(settings, 37000, "files", run_dir=work / "run",
                 **newstest_files(Path(".data/newstest"), work / "newstest"))
c = TransformerConfig(**BASE, vocab_size=dm.vocab_size, pad_id=dm.pad_id)
batches = [{k: v.cuda() if torch.is_tensor(v) else v for k, v in b.items()}
           for b in token_batches(dm, 25000, 12, 1)]
step = train_step(c, mode == "compiled", settings)
for b in batches:  # warm-up (compilation, cuDNN plans)
    step(b)
sync(settings.device)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for b in batches[:6]:
        step(b)
    sync(settings.device)
print(f"== {mode}: 6 steps, shapes {[tuple(b['src'].shape) + tuple(b['tgt_out'].shape[1:]) for b in batches[:6]]}")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=35, max_name_column_width=70))
