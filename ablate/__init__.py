"""`ablate`: the command line (argparse in, library calls out: `ablate.cli`).

Imports run one way only: ablate -> tables -> reports -> sweeps -> ablations -> lightning_modules
(tests/test_architecture.py checks it). Nothing here is imported by the library.
"""
