"""Table 3 in one home: `ablate table3` from plan to report.

`plan` (what to run, as one Optuna study: `make_plan`, `queue`, `run_table3`), `schedule` (the
order runs start in), `cost` (what a table will cost: the dry run), `progress` (where a table
stands), `archive` (its runs kept for a sitting on another machine), `redo` (finished runs trained
again) and `make` (`make_table3`: run the table, then write its report; the one entry point of
the CLI and of a notebook).

Why here, above `reports` and `sweeps`: making the table runs a study on the generic sweep
machinery (`sweeps`: study, workers, storage) and then writes its report (`reports.build`), so
its home must see both, and only the top of the house does (ablate -> reports -> sweeps ->
ablations -> lightning_modules). What a layer below needs of a table lives in that layer: a
redo's `redo_of` is a trial attribute of `sweeps.study` (the workers and the queue skip a trial a
redo replaces), and the names a Table 3 study is stored under (its kind, a run's name, a replaced
run's name) are `reports.collect`'s, which reads them back. Nothing below imports this package.
"""
