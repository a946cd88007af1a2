"""The interconnect smoke test: an all-reduce sweep across every rank (`fdl probe --collective`).

allreduce.py  the rank script (standalone: PyTorch and the standard library only)
results.py    its JSON lines aggregated: bandwidth rows, slowest rank, stragglers
run.py        ranks started under the rank supervisor, bounded by a time limit
"""
