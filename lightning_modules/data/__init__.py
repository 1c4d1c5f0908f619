"""Data pipeline: corpora, shared BPE tokenizer, token-budget batching and the DataModule.

The names below are imported on first use (PEP 562), so importing `lightning_modules.data.X`
does not load every module (`TranslationData` loads torch, the DataModule Lightning too).
"""

from importlib import import_module

_WHERE = {
    "TokenBucketBatchSampler": "batching", "batch_shapes": "batching", "collate": "batching",
    "padding_share": "batching", "ShapeBuckets": "batching",
    "Corpus": "corpora", "ParallelText": "corpora", "extract_ding": "corpora", "load_corpus": "corpora",
    "read_parallel": "corpora", "TranslationData": "prepared", "TranslationDataModule": "datamodule",
    "BOS_ID": "tokenizer",
    "EOS_ID": "tokenizer", "PAD_ID": "tokenizer", "UNK_ID": "tokenizer", "train_or_load": "tokenizer",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
