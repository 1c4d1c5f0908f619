"""The configurable Transformer of "Attention Is All You Need", its data and its Lightning module.

No knowledge of Table 3, sweeps or the command line. Modules: `config` (dataclasses),
`transformer` (the model), `search` and `evaluate` (decoding, BLEU), `translation` (the Lightning
module), `callbacks`, `compiling`, `data/`, `run/` (one training run); its plumbing is the package
`foundation`. Nothing is imported here: importing a light module loads no torch.
"""
