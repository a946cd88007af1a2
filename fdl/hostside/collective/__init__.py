"""The all-reduce smoke test's host side: the rank program and what each host does to run its ranks.

allreduce.py  the rank program (standalone: PyTorch and the standard library only)
ranks.py      what a host offers, its ranks' place in the world, running them under the rank supervisor
"""
