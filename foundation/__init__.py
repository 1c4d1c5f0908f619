"""The ground floor: the plumbing every layer uses, below everything that drives a run (docs/model.md
lists its modules); importing them loads no torch."""
