"""The interconnect smoke test: an all-reduce sweep across every rank (`fdl probe --collective`).

results.py    the ranks' events aggregated: bandwidth rows, slowest rank, stragglers, the `collective` check
run.py        the options; this host's one-host world; a cluster's per-host results combined

What runs on a host (the rank program, a host's ranks in the world, the supervised run) is
fdl/hostside/collective/, which the fdl_probe role's collective step runs on every cluster host at once.
"""
