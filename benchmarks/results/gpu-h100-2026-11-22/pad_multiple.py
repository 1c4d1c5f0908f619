import os, sys, torch, json
sys.path.insert(0, os.getcwd())
from benchmarks.end_to_end import BASE, epoch_batches, bare_step
from lightning_modules.config import DataConfig, TransformerConfig
from lightning_modules.data import TranslationDataModule
dev = torch.device("cuda")
c = TransformerConfig(**BASE, vocab_size=8000)
for rep in range(2):
  for pm in (1, 8):
    dm = TranslationDataModule(DataConfig(corpus="multi30k", data_dir=".data/multi30k", vocab_size=8000), "/tmp/pad", pad_multiple=pm)
    dm.setup("fit")
    for tok in (25000, 4000):
        bs = epoch_batches(dm, tok)[:16]
        r = bare_step(c, bs, False, 2, dev)
        print(json.dumps({"rep": rep, "pad_multiple": pm, "tok": tok, "padding": round(dm.stats["train_padding_share"], 4) if tok == 25000 else None, **r}), flush=True)
