"""fdl: the cluster and hardware command line of the flodl framework."""

__version__ = "0.1.0"
