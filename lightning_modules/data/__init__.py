"""Data pipeline: corpora, shared BPE tokenizer, token-budget batching and the DataModule."""

from lightning_modules.data.batching import (TokenBucketBatchSampler, batch_shapes, collate,
                                             padding_share)
from lightning_modules.data.corpora import (Corpus, ParallelText, extract_ding, load_corpus,
                                            read_parallel)
from lightning_modules.data.datamodule import TranslationDataModule
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_or_load

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Corpus", "ParallelText", "TokenBucketBatchSampler",
    "TranslationDataModule", "batch_shapes", "collate", "extract_ding", "load_corpus", "padding_share",
    "read_parallel", "train_or_load",
]
