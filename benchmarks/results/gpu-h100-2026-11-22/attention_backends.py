import os, sys, torch, time, json
sys.path.insert(0, os.getcwd())
from torch.nn.attention import sdpa_kernel, SDPBackend
from benchmarks.end_to_end import BASE, epoch_batches, bare_step
from lightning_modules.config import DataConfig, TransformerConfig
from lightning_modules.data import TranslationDataModule
dev = torch.device("cuda")
dm = TranslationDataModule(DataConfig(corpus="multi30k", data_dir=".data/multi30k", vocab_size=8000), "/tmp/ablate-e2e/eager", pad_multiple=8)
dm.setup("fit")
c = TransformerConfig(**BASE, vocab_size=8000)
for tok in (25000, 4000):
    bs = epoch_batches(dm, tok)[:16]
    for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]:
        try:
            with sdpa_kernel([be]):
                r = bare_step(c, bs, False, 2, dev)
            print(json.dumps({"tok": tok, "backend": name, **r}), flush=True)
        except Exception as e:
            print(tok, name, "error", repr(e)[:200], flush=True)
