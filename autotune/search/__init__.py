"""The searcher: one Optuna study per tuning key, strategies that ask the probe for points,
and write-back of the tuned values into the bundles."""
