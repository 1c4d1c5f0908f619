"""One training run, end to end: `train.train` (data, Trainer, resume, evaluation), the checks
before it (`preflight`) and what a run reports (`results.RunResult`). Its plumbing (atomic files,
fault injection, stop requests, the run directory's marker and lock) is `lightning_modules.base`.
Nothing is imported here: the modules are heavy.
"""
