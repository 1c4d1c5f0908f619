"""Data pipeline: corpora, shared BPE tokenizer, token-budget batching and the DataModule. Import
each name from its module: this package imports none, so the light ones load without torch."""
