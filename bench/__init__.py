"""sonicsite.bench: benchmarks run as `sonicsite bench ...`, each writing JSON with a
`summary` of ratios against a baseline measured in the same run (medians of repeats)."""
