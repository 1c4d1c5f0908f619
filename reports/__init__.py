"""Reports built from stored results: the Table 3 replica, figures and dashboards."""
