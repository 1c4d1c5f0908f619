"""`ablate`, the command line: argparse in, library calls out (see `ablate.cli`).

Imports run one way only: ablate -> reports -> sweeps -> ablations -> lightning_modules
(tests/test_architecture.py checks it). Nothing here is imported by the library.
"""
