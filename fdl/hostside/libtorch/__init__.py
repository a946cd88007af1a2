"""libtorch's host-side core: what a variant is (variants.py) and where variants live and which one ranks
link (resolve.py). Part of the one libtorch package, fdl/libtorch/ (its docstring has the whole map); it
lives here because the probe runs it on managed hosts."""
