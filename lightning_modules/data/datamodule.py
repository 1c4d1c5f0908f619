"""The Lightning DataModule: a prepared corpus (`prepared.TranslationData`) served as
token-budget batches."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_modules.data.batching import TokenBucketBatchSampler, collate
from lightning_modules.data.prepared import EncodedPairs, TranslationData
from lightning_modules.resume import ResumableLoader


class TranslationDataModule(TranslationData, pl.LightningDataModule):
    """`TranslationData` with Lightning's hooks: training batches shuffled and sharded over the ranks."""

    def prepare_data(self) -> None:
        """Download the corpus and train the BPE model once (Lightning: local rank 0 only)."""
        self._tokenizer(self._load())

    def _shards(self) -> tuple[int | None, int | None]:
        """(num_replicas, rank) from the attached trainer, else torch.distributed's defaults."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return None, None
        return trainer.world_size, trainer.global_rank

    def _loader(self, dataset: EncodedPairs, sampler: TokenBucketBatchSampler,
                kind: type[DataLoader] = DataLoader) -> DataLoader:
        """Batches of `sampler`'s indices, collated as it cut them (its shape buckets, if any)."""
        workers = self.cfg.num_workers
        # Its own generator: each pass would otherwise draw its workers' base seed from torch's
        # global one, which dropout uses, and a resumed run starts one more pass than the original.
        return kind(dataset, batch_sampler=sampler, num_workers=workers,
                    collate_fn=functools.partial(collate, pad_id=self.pad_id, pad_multiple=self.pad_multiple,
                                                 buckets=sampler.buckets),
                    pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
                    generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        """Training batches, reshuffled by `set_epoch` (needs `use_distributed_sampler=False`)."""
        self.setup()
        replicas, rank = self._shards()
        self.train_sampler = TokenBucketBatchSampler(
            self.train_set.src_lengths, self.train_set.tgt_lengths, self.batch_tokens,
            shuffle=True, seed=self.seed, num_replicas=replicas, rank=rank,
            pad_multiple=self.pad_multiple, buckets=self.buckets)
        return self._loader(self.train_set, self.train_sampler, ResumableLoader)  # resumes mid-epoch

    def val_dataloader(self) -> DataLoader:
        """Dev-set batches in a fixed order (the training batches' budget), for perplexity."""
        self.setup()
        replicas, rank = self._shards()
        sampler = TokenBucketBatchSampler(
            self.valid_set.src_lengths, self.valid_set.tgt_lengths, self.batch_tokens,
            shuffle=False, seed=self.seed, num_replicas=replicas, rank=rank,
            pad_multiple=self.pad_multiple)
        return self._loader(self.valid_set, sampler)
