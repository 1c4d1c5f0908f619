"""`ablate`: the command line (argparse in, library calls out: `ablate.cli`) and Table 3 (`table3/`).

Imports run one way only: ablate -> reports -> sweeps -> ablations -> lightning_modules
(tests/test_architecture.py checks it). Nothing here is imported by the library.
"""
