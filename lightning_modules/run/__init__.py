"""One training run, end to end: `train.train` (data, Trainer, resume, evaluation), the checks
before it (`preflight`), atomic files (`io`), fault injection for the reliability tests (`faults`)
and what a run reports (`results.RunResult`). Nothing is imported here: the modules are heavy.
"""
