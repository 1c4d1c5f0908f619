"""Benchmark suite (scripts, not timed tests): `python -m benchmarks [--quick] [--only ...]`.

train (step throughput vs nn.Transformer and Marian), overhead (Lightning vs a plain loop),
padding (token bucketing vs random batching), generation (batched search vs HF generate) and
scaling (step time vs length and batch tokens); see benchmarks/README.md.
"""
