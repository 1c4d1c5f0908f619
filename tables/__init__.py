"""A table from plan to report: an ablation spec's rows (Table 3's, or your own) at a preset's
scale, each (row, seed) a queued trial of one study, trained by the generic sweep workers under the
table's policy (`policy.TablePolicy`), then its report; `make.make_table3` is the one entry point of
the command line and of a notebook. Above `reports` and `sweeps`: making a table runs a study on
the sweep machinery and then writes its report. What a lower layer reads of a table lives there:
its names and record in `ablations.record`, a redo's `redo_of` in `sweeps.study`.
"""
