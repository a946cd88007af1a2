"""Launcher mode: a `cluster: true` command run as a cluster (docs/launcher.md).

    plan.py      which hosts run how many ranks, the controller's policy, single-host promotion
    build.py     the pre-flight per-host build (playbooks/prebuild.yml through fdl.cluster.runner, every host's
                 build on this machine, local connection)
    dispatch.py  staging the run on every remote host (its docstring says how it travels) and the rank
                 sessions: one ssh per host to the staged supervisor, its output streamed back for the
                 whole run, or the supervisor in-process for this machine's own ranks
    printer.py   how a run speaks: rank lines to stdout, launcher notes to stderr (the all-reduce test hands in
                 its own streams)
    run.py       the launcher itself: controller, build, world, dispatch, supervision, exit code, and
                 the sweep of a canceled run (playbooks/reap.yml)
"""
