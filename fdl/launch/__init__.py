"""Launcher mode: a `cluster: true` command run as a cluster (docs/launcher.md).

    plan.py      which hosts run how many ranks, the controller's policy, single-host promotion
    build.py     the pre-flight per-host build (playbooks/prebuild.yml, run on this machine)
    dispatch.py  staging on remote hosts (playbooks/dispatch.yml) and the rank sessions
                 (ssh to the shipped supervisor, or the supervisor in-process for this machine)
    run.py       the launcher itself: controller, build, world, dispatch, supervision, exit code
"""
