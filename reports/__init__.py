"""Reports built from stored results: the Table 3 ablation, figures and dashboards."""
