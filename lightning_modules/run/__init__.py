"""One training run, end to end: `train.train` (data, Trainer, resume, evaluation), the checks
before it (`preflight`) and what a run reports (`results.RunResult`); its plumbing is in `foundation/`.
Nothing is imported here: the modules are heavy.
"""
