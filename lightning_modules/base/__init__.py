"""The ground floor: the plumbing every layer uses, below everything that drives a run.

`errors` (one-line errors and exit statuses), `names` (names that become paths), `yaml_input` (the
one YAML loader), `io` (atomic writes and path checks), `rundir` (which folders are ours: the
marker, the lock), `stop` (stop requests from signals) and `faults` (fault injection for the
reliability tests). They import nothing of this project but each other, and importing them loads
neither torch nor Lightning: the model, the data, a run, the sweeps and the reports stand on them.
"""
