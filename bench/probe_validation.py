"""What the fdl_probe role's argument validation costs a cluster probe, on the testbed, in one run.

    sudo python bench/probe_validation.py [--hosts 8] [--runs 25]

Builds a testbed of N hosts as bench/cluster_probe.py does (fake GPU, libtorch
with a bundled NCCL, the shared data mount, all through each worker's `env:`)
and runs the `flodl.fdl.probe` playbook through fdl's runner, as
`fdl @cluster probe` does, in three ways, sampled round-robin:

- validation on (the shipped playbook, as fdl runs it): Ansible's argument
  validation, a task of its own on every host before the probe;
- validation left out: a copy of the playbook whose `import_role` says
  `rolespec_validate: false`, which drops the task when the play is parsed
  (what fdl itself did before every run was validated: the cost it saved);
- validation skipped by `when:`: the same task written into a copy of the
  playbook with a false condition, to show what a condition would keep.

Prints medians of wall time and controller CPU (the process tree plus the
detached SSH masters' CPU, as bench/cluster_probe.py counts it), CPU per host,
and what leaving the validation out saves. Needs root (the testbed does);
FDL_TESTBED_PREFIX / FDL_TESTBED_NET pick the testbed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import yaml  # noqa: E402
from _timing import PY, compile_package, env_for_fdl  # noqa: E402
from cluster_probe import NET, PREFIX, close_masters, timed  # noqa: E402

from tests.fakes import FakeNvml, build_fake_nvml, make_libtorch  # noqa: E402
from tests.testbed import Testbed  # noqa: E402

# One probe through fdl's runner, with the extra variables fdl passes: argv[1] the playbook (a name or a path).
RUN = """
import sys
from pathlib import Path
from fdl.cluster.inventory import WORKERS_GROUP, inventory_from_file
from fdl.cluster.probe import ClusterProbeOptions, probe_extravars
from fdl.cluster.runner import OK, run_playbook
inventory, _ = inventory_from_file(Path("fdl.cluster.yml"))
result = run_playbook(sys.argv[1], inventory, extravars=probe_extravars(ClusterProbeOptions()),
                      limit=inventory.groups[WORKERS_GROUP], progress=False)
bad = {name: (host.status, host.message) for name, host in result.hosts.items() if host.status != OK}
sys.exit(f"hosts that did not pass: {bad}" if bad else 0)
"""


def variant_playbook(work: Path, env: dict, *, when: bool) -> Path:
    """A copy of the collection's probe playbook (naming the collection, so its short role name resolves there)
    without the role's validation; with `when`, the validation as a task of its own skipped by a false `when:`."""
    # the collection tree fdl builds in the cache that `env` names (the one the runner gives Ansible)
    done = subprocess.run([PY, "-c", "from fdl.resources import playbook; print(playbook('probe.yml'))"], env=env,
                          capture_output=True, text=True, check=True)
    original = Path(done.stdout.strip())
    play = yaml.safe_load(original.read_text())
    play[0]["collections"] = ["flodl.fdl"]
    tasks = play[0]["tasks"]
    tasks[0]["ansible.builtin.import_role"]["rolespec_validate"] = False
    if when:
        spec = "(lookup('ansible.builtin.file', '{}') | from_yaml).argument_specs.main.options"
        specs = original.parent.parent / "roles" / "fdl_probe" / "meta" / "argument_specs.yml"
        check = {"argument_spec": "{{ " + spec.format(specs) + " }}"}
        tasks.insert(0, {"name": "Check the probe's inputs against the role's argument spec",
                         "ansible.builtin.validate_argument_spec": check, "when": "false"})
    path = work / f"probe-{'when' if when else 'unvalidated'}.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=25)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/probe_validation.py needs root: it builds the network-namespace testbed", file=sys.stderr)
        return 2
    compile_package()
    with Testbed.up(args.hosts, prefix=PREFIX, net=NET) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdltb", dir="/tmp"))
        try:
            nvml = FakeNvml(build_fake_nvml(bed.shared / "nvml"))
            libtorch = make_libtorch(bed.shared / "libtorch", nccl="2.27.5")
            subprocess.run(["chmod", "-R", "a+rX", str(bed.shared)], check=True)
            workers = bed.workers(env={**nvml.env("H100:9.0:80G"), "LIBTORCH": str(libtorch)},
                                  data_path=str(bed.storage))
            project = work / "project"
            project.mkdir()
            (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
            (project / "fdl.cluster.yml").write_text(yaml.safe_dump(bed.cluster(workers), sort_keys=False))
            env = env_for_fdl(bed.home_env(work / "home"))
            variants = [variant_playbook(work, env, when=False), variant_playbook(work, env, when=True)]
            contenders = {
                "validation on": [PY, "-c", RUN, "probe.yml"],
                "validation left out": [PY, "-c", RUN, str(variants[0])],
                "validation skipped by when:": [PY, "-c", RUN, str(variants[1])],
            }
            for name, argv in contenders.items():  # each must work before it is timed (this warms the masters)
                _, _, done = timed(argv, project, env)
                assert done.returncode == 0, (name, done.stderr[-2000:])
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
            for _ in range(args.runs):
                for name, argv in contenders.items():
                    wall, cpu, done = timed(argv, project, env, masters=work)
                    assert done.returncode == 0, (name, done.stderr[-2000:])
                    samples[name].append((wall, cpu))
        finally:
            for cp in work.glob("**/cp"):
                close_masters(cp)
            shutil.rmtree(work, ignore_errors=True)
    medians = {name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
               for name, values in samples.items()}
    print(f"{args.hosts} hosts, medians of {args.runs} interleaved probes through fdl's runner")
    print(f"{'':<28} {'wall s':>7} {'cpu s':>7} {'cpu ms/host':>12}")
    for name, (wall, cpu) in medians.items():
        print(f"{name:<28} {wall:>7.3f} {cpu:>7.3f} {cpu / args.hosts * 1000:>12.1f}")
    (on_wall, on_cpu), (off_wall, off_cpu) = medians["validation on"], medians["validation left out"]
    print(f"the validation costs {on_wall - off_wall:.3f} s wall ({(on_wall - off_wall) / on_wall:.0%}) "
          f"and {on_cpu - off_cpu:.3f} s controller CPU ({(on_cpu - off_cpu) / on_cpu:.0%}) of a validated probe "
          f"(fdl runs it: the role's inputs are checked on every run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
