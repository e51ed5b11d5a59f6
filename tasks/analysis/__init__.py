"""Pure judgement: the regression detector, change points, validity gates, fail-fast rules.
Data in, verdicts out; no I/O."""
