"""The configurable Transformer of "Attention Is All You Need", its data and its Lightning module.

No knowledge of Table 3, sweeps or the command line. Modules: `config` (dataclasses),
`transformer` (the model), `search` and `evaluate` (decoding, BLEU), `translation` (the Lightning
module), `callbacks`, `compiling`, `data/` and `run/` (one training run). Nothing is imported
here, so `import lightning_modules.errors` does not load torch.
"""
