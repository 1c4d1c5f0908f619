"""The ground floor: the plumbing every layer uses, below everything that drives a run. `errors`,
`names` (names that become paths), `yaml_input`, `io` (atomic writes), `rundir` (a folder's marker
and lock), `stop` (stop requests) and `faults` (fault injection); importing them loads no torch.
"""
