"""The all-reduce smoke test's host side: the rank program and what each host does before and while it runs.

allreduce.py  the rank program (standalone: PyTorch and the standard library only)
offer.py      what a host offers the test (its ranks, whether its Python imports PyTorch): the probe's part
ranks.py      a host's ranks' place in the world, and running them under the rank supervisor
"""
