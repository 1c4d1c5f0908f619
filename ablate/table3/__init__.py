"""Table 3 from plan to report, in one home; `make.make_table3` is the one entry point of the CLI
and of a notebook. Here, above `reports` and `sweeps`, because making the table runs a study on
the generic sweep machinery and then writes its report: only the top of the house sees both. What
a lower layer reads of a table lives there: a redo's `redo_of` in `sweeps.study`, and the names a
Table 3 study is stored under (its kind, its runs' names) in `reports.collect`, which reads them.
"""
