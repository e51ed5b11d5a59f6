"""Pure judgement: the regression detector (detector, with its policy, nights, noise and
thresholds), the broker's figures across stages, change points, covariates, tails,
validity gates, fail-fast rules. Data in, verdicts out; no I/O."""
