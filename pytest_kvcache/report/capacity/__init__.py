"""The capacity probe in the report: each boot's search at each depth as one frame row (its capacity), the
capacity's bootstrap CI, the section (a capacity table, every trial, notes), one sentence per arm and a
goodput-vs-sessions plot per depth.

A level's verdict is taken over all its trials: the SLO's terms over every measured turn of the trials at that
level, pooled (the search judged it so when it tried the level again). The capacity is the knee the search
reads from those verdicts; its bracket is the last level that met the SLO and the first that broke it.

How the CI is built (docs/probes/capacity.md): a replicate resamples every trial's measured turns (with
replacement, as many as it had), judges each level over its resampled trials again and reads the knee from
those verdicts as the search did (the largest level such that it and every level below it met the SLO). A
replicate's knee is always a level that was tried (or 0): where the SLO broke between two levels is not
measured, and no replicate draws a value in between. The capacity's CI is the percentiles (nearest rank) of
the replicates' knees; a ratio between arms is the ratio of their knees in the same replicates. At one boot
the interval is printed only when the knee and the levels either side of it were tried at least
``MIN_TRIALS`` times each (``--kv-capacity-trials``): an older run's search, one trial a level, has no interval.
With several boots a replicate also resamples the boots (whole blocks, paired between arms, under
pytest-xdist), and the arm's knee is the mean over its boots.

The KV-residency knee (metric ``kv_residency``) is read the same way from each level's residency verdict (its
prefix-cache hit rate over all its trials at least half): its replicates resample the turns' cached tokens
(``Level.holds_many``), its ratio is the two arms' residency knees in the same replicates, and
:func:`knee_bound` reads from both knees what bound the SLO's.

Plain Python (numpy, pandas): reads records only.
"""
