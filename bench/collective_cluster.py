"""`fdl @cluster probe --collective` across testbed hosts, and this machine's own worker, in one run.

    sudo python bench/collective_cluster.py [--hosts 3] [--runs 3] [--max-size 64K] [--against DIR] [--plain]

A testbed of N hosts (FDL_TESTBED_PREFIX/FDL_TESTBED_NET), each offering one CPU rank (gloo, over the
bridge) under a venv of /usr/bin/python3 that sees this environment's PyTorch, and this machine as one more
worker (at the bridge's gateway address: no ssh) with the same interpreter: N+1 ranks. Every command is
checked to pass first, then sampled round-robin: medians of whole-command wall time and controller CPU
(user+system of fdl and every process it waited for; the hosts' ranks and sshd are not counted).

With `--against DIR` (another checkout of fdl, e.g. `git worktree add` of an older revision), its fdl runs
the same command in the same rounds, with a cache of its own, so two revisions compare in one run.
`--plain` times the probe alone (no --collective) on the same cluster: remote hosts and this machine's own
worker in one command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench._timing import compile_package, env_for_fdl, fdl_command
from bench.launch import free_port_on, timed


def main() -> int:
    from tests.integration.launch.helpers import torch_python
    from tests.testbed import Testbed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-size", default="64K")
    parser.add_argument("--against", type=Path, default=None, help="another checkout of fdl, sampled alike")
    parser.add_argument("--plain", action="store_true", help="the probe alone, without the smoke test")
    args = parser.parse_args()
    against = args.against.resolve() if args.against is not None else None
    if against is not None and not (against / "fdl" / "__init__.py").is_file():
        raise SystemExit(f"--against {args.against}: no fdl package there")
    compile_package([against] if against is not None else [])
    started = time.monotonic()
    with Testbed.up(args.hosts) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdl-bench-coll-", dir="/tmp"))
        try:
            python = str(torch_python(bed.shared / "py"))
            workers = [h.worker(local_devices="cpu:1", python=python, env={"GLOO_SOCKET_IFNAME": "eth0"})
                       for h in bed.hosts]
            workers.append({"host": "here", "address": bed.gateway, "local_devices": "cpu:1", "python": python,
                            "env": {"GLOO_SOCKET_IFNAME": bed.bridge}})
            doc = bed.cluster(workers)
            doc["cluster"]["controller"] = {"host": bed.gateway, "port": free_port_on(bed.gateway),
                                            "bind": bed.gateway}
            (work / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
            (work / "fdl.cluster.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
            argv = [*fdl_command(), "@cluster", "probe", "--json", "--skip-mount"]
            if not args.plain:
                argv += ["--collective", "--collective-max-size", args.max_size]
            envs = {"this": {**env_for_fdl(bed.home_env(work / "h")), "XDG_CACHE_HOME": str(work / "c-this")}}
            if against is not None:
                envs["against"] = {**envs["this"], "PYTHONPATH": str(against), "XDG_CACHE_HOME": str(work / "c-it")}
            for name, env in envs.items():  # each must pass, across every worker, before it is timed
                done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
                check = next((c for c in json.loads(done.stdout or "{}").get("cluster", [])
                              if c["name"] == "collective"), {})
                size = (check.get("data") or {}).get("world_size", len(workers) if args.plain else None)
                if done.returncode != 0 or size != len(workers):
                    print(f"{name}: exit {done.returncode}, world of {size} ranks (of {len(workers)}): "
                          f"{check.get('message')}", file=sys.stderr)
            samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in envs}
            for _ in range(args.runs):
                for name, env in envs.items():
                    samples[name].append(timed(argv, work, env))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    what = "" if args.plain else f" --collective --collective-max-size {args.max_size}"
    print(f"fdl @cluster probe{what}: {args.hosts} testbed hosts over ssh + this machine, 1 CPU rank each; "
          f"medians of {args.runs} (wall s / controller CPU s)")
    for name, values in samples.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        codes = sorted({v[2] for v in values})
        label = "this checkout" if name == "this" else str(against)
        print(f"  {label:<40} {wall:>8.3f} {cpu:>8.3f}   exit codes {codes}")
    print(f"(bench took {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
