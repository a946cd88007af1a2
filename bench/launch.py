"""Launcher overhead: `fdl CMD` (launcher mode) against starting the same ranks directly, in one run.

    python bench/launch.py [--runs 5] [--ranks 2]            # single host (no root needed)
    sudo python bench/launch.py --hosts 3 [--runs 3]          # also across testbed hosts over SSH

Every rank runs the same trivial program (`python3 -c pass`), so the times are the launcher's own cost.

Single host, medians of whole-command wall time, sampled round-robin:
- direct: one shell starting the N ranks at once and waiting for them;
- fdl: `fdl job` of a `cluster: true` command with `local_devices: cpu:N` (controller on a free port,
  world, rank supervisor in-process, final state kept).

Across hosts (root: builds a testbed of N sshd hosts, 1 rank each):
- raw ssh: one `ssh host PROGRAM` per host, all at once (SSH masters warm);
- fdl warm: `fdl @cluster job` a second time (binary already on the hosts: rsync sends nothing; masters
  warm): controller, staging playbook, ssh sessions to the shipped supervisor, exit reports.

Prints medians, the overhead in seconds and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench._timing import PY, compile_package, env_for_fdl, fdl_command, interleaved

RANK = "python3 -c pass"
PORTS = range(26800, 26900)


def free_port() -> int:
    import socket

    for port in PORTS:
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair in 26800-26899")


def single_host(runs: int, ranks: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="fdll6-bench-"))
    try:
        (work / "fdl.yml").write_text(yaml.safe_dump({
            "cluster": {"controller": {"port": free_port()}},
            "commands": {"job": {"cluster": True, "run": RANK, "local_devices": f"cpu:{ranks}"}}}))
        env = env_for_fdl({"HOME": str(work / "home"), "PATH": f"{Path(PY).parent}:{os.environ['PATH']}"})
        direct = " & ".join([RANK] * ranks) + " & wait"
        times = interleaved({"direct": (["/bin/sh", "-c", direct], env), "fdl": ([*fdl_command(), "job"], env)},
                            runs=runs, cwd=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"single host, {ranks} ranks of `{RANK}`, median of {runs}:")
    print(f"  direct  {times['direct']:.3f}s")
    print(f"  fdl     {times['fdl']:.3f}s   overhead {times['fdl'] - times['direct']:+.3f}s, "
          f"ratio {times['fdl'] / times['direct']:.1f}x")


def across_hosts(runs: int, hosts: int) -> None:
    from tests.testbed import Testbed

    with Testbed.up(hosts, prefix="fdll6b", net="10.226.7") as bed:
        work = Path(tempfile.mkdtemp(prefix="fdll6b", dir="/tmp"))
        try:
            program = work / "rank.sh"
            program.write_text(f"#!/bin/sh\nexec /usr/bin/{RANK}\n")
            program.chmod(0o755)
            doc = bed.cluster([h.worker(local_devices="cpu:1") for h in bed.hosts])
            doc["cluster"]["controller"] = {"host": bed.gateway, "port": free_port_on(bed.gateway),
                                            "bind": bed.gateway}
            (work / "fdl.yml").write_text(yaml.safe_dump({"commands": {"job": {"cluster": True, "bin": "rank.sh"}}}))
            (work / "fdl.cluster.yml").write_text(yaml.safe_dump(doc))
            home = bed.home_env(work / "h")
            env = env_for_fdl(home)
            first = subprocess.run([*fdl_command(), "@cluster", "job"], cwd=work, env=env, capture_output=True,
                                   text=True, check=False)  # cold: ships the binary, opens the SSH masters
            if first.returncode != 0:
                raise SystemExit(f"fdl @cluster job failed: {first.stderr}")
            ssh = " & ".join(shlex.join([*h.ssh_argv(extra=("-o", "ControlMaster=auto", "-o",
                                                            f"ControlPath={work}/cp-%C", "-o",
                                                            "ControlPersist=60")), f"/usr/bin/{RANK}"])
                             for h in bed.hosts) + " & wait"
            subprocess.run(["/bin/sh", "-c", ssh], check=False)  # open the raw side's masters too
            bed.verify()
            times = interleaved({"raw ssh": (["/bin/sh", "-c", ssh], env),
                                 "fdl warm": ([*fdl_command(), "@cluster", "job"], env)}, runs=runs, cwd=work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{hosts} hosts over SSH, 1 rank each, median of {runs}:")
    print(f"  raw ssh   {times['raw ssh']:.3f}s")
    print(f"  fdl warm  {times['fdl warm']:.3f}s   overhead {times['fdl warm'] - times['raw ssh']:+.3f}s, "
          f"ratio {times['fdl warm'] / times['raw ssh']:.1f}x")


def free_port_on(host: str) -> int:
    import socket

    for port in PORTS:
        try:
            with socket.socket() as a:
                a.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=0, help="also run across this many testbed hosts (root)")
    opts = parser.parse_args()
    compile_package()
    started = time.monotonic()
    single_host(opts.runs, opts.ranks)
    if opts.hosts:
        across_hosts(opts.runs, opts.hosts)
    print(f"(bench took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()
