"""`ablate`, the command line: argparse in, library calls out (see `ablate.cli`); and Table 3 from
plan to report (`ablate.table3`), which `ablate table3` and a notebook call.

Imports run one way only: ablate -> reports -> sweeps -> ablations -> lightning_modules
(tests/test_architecture.py checks it). Nothing here is imported by the library.
"""
