"""Launcher overhead: `fdl CMD` (launcher mode) against starting the same ranks directly, in one run.

    python bench/launch.py [--runs 5] [--ranks 2] [--baseline DIR]  # single host (no root needed)
    sudo python bench/launch.py --sizes 3,16,32,64 [--runs 3]       # also across testbed hosts over SSH

Every rank runs the same trivial program (`python3 -c pass`), so the times are the launcher's own cost.

Single host, medians of whole-command wall time, sampled round-robin:
- direct: one shell starting the N ranks at once and waiting for them;
- fdl: `fdl job` of a `cluster: true` command with `local_devices: cpu:N` (controller on a free port,
  world, rank supervisor in-process, final state kept).

Across hosts (root: one testbed of the largest size, FDL_TESTBED_PREFIX/FDL_TESTBED_NET; each size uses its
first N hosts, 1 rank each):
- parallel ssh: one `ssh host PROGRAM` per host, all at once (SSH masters warm), as pdsh would;
- fdl warm: `fdl @cluster job` a second time (binary already on the hosts, masters warm): controller,
  staging (the flodl.fdl.dispatch playbook), ssh sessions to the staged supervisor, exit reports;
- with `--against DIR`: the same command from another checkout of fdl (DIR, e.g. an older revision from
  `git worktree add` or `git archive`), sampled in the same round-robin, so two revisions compare in one run.

Per size: median wall, median controller CPU (user+system of the command and every child it waited for;
the hosts' sshd and ranks are not counted) and CPU per host, the overhead over parallel ssh, and a
projection of the controller CPU to 1,000 hosts from a least-squares line through the measured sizes.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench._timing import PY, compile_package, env_for_fdl, fdl_command, interleaved_timings, trees

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


def single_host(runs: int, ranks: int, baselines: list[Path]) -> None:
    work = Path(tempfile.mkdtemp(prefix="fdll6-bench-"))
    try:
        (work / "fdl.yml").write_text(yaml.safe_dump({
            "cluster": {"controller": {"port": free_port()}},
            "commands": {"job": {"cluster": True, "run": RANK, "local_devices": f"cpu:{ranks}"}}}))
        env = env_for_fdl({"HOME": str(work / "home"), "PATH": f"{Path(PY).parent}:{os.environ['PATH']}"})
        direct = " & ".join([RANK] * ranks) + " & wait"
        commands = {"direct": (["/bin/sh", "-c", direct], env)}
        for tag, tree_env in trees(env, baselines, work / "caches").items():
            commands[f"fdl{tag}"] = ([*fdl_command(), "job"], tree_env)
        times = interleaved_timings(commands, runs=runs, cwd=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    direct_wall = times["direct"].wall
    print(f"single host, {ranks} ranks of `{RANK}`, median of {runs} (wall; CPU of the command and its children):")
    for name, timing in times.items():
        line = f"  {name:<20} {timing.wall:.3f}s  cpu {timing.cpu:.3f}s"
        if name != "direct":
            line += f"   overhead {timing.wall - direct_wall:+.3f}s, ratio {timing.wall / direct_wall:.1f}x"
        print(line)


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, float, int]:
    """(wall seconds, controller CPU seconds of the command and its waited-for children, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def across_hosts(runs: int, sizes: list[int], against: Path | None = None) -> None:
    from tests.testbed import Testbed

    rows = []
    with Testbed.up(max(sizes)) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdl-bench-launch-", dir="/tmp"))
        try:
            program = work / "rank.sh"
            program.write_text(f"#!/bin/sh\nexec /usr/bin/{RANK}\n")
            program.chmod(0o755)
            env = env_for_fdl(bed.home_env(work / "h"))
            for size in sizes:
                rows.append(one_size(bed, work, env, size, runs, against))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nacross hosts over SSH, 1 rank of `{RANK}` each, medians of {runs} (wall s / controller CPU s):")
    print(f"{'hosts':>5} {'ssh wall':>9} {'fdl wall':>9} {'over':>7} {'ssh cpu':>8} {'fdl cpu':>8} "
          f"{'ssh cpu/h':>10} {'fdl cpu/h':>10}")
    for size, ssh, fdl, _ in rows:
        print(f"{size:>5} {ssh[0]:>9.3f} {fdl[0]:>9.3f} {fdl[0] - ssh[0]:>+7.3f} {ssh[1]:>8.3f} {fdl[1]:>8.3f} "
              f"{ssh[1] / size:>10.4f} {fdl[1] / size:>10.4f}")
    if against is not None:
        print(f"\nthe same samples against {against} (its fdl, interleaved with the above):")
        print(f"{'hosts':>5} {'it wall':>9} {'over ssh':>9} {'it cpu':>8} {'fdl - it wall':>14} {'fdl - it cpu':>13}")
        for size, ssh, fdl, other in rows:
            assert other is not None  # every size was sampled against it
            print(f"{size:>5} {other[0]:>9.3f} {other[0] - ssh[0]:>+9.3f} {other[1]:>8.3f} {fdl[0] - other[0]:>+14.3f} "
                  f"{fdl[1] - other[1]:>+13.3f}")
    project([(size, ssh, fdl) for size, ssh, fdl, _ in rows])


def one_size(bed, work: Path, env: dict, size: int, runs: int, against: Path | None = None
             ) -> tuple[int, tuple, tuple, tuple | None]:
    hosts = bed.hosts[:size]
    project_dir = work / f"n{size}"
    project_dir.mkdir()
    shutil.copy(work / "rank.sh", project_dir / "rank.sh")
    doc = bed.cluster([h.worker(local_devices="cpu:1") for h in hosts])
    doc["cluster"]["controller"] = {"host": bed.gateway, "port": free_port_on(bed.gateway), "bind": bed.gateway}
    (project_dir / "fdl.yml").write_text(yaml.safe_dump({"commands": {"job": {"cluster": True, "bin": "rank.sh"}}}))
    (project_dir / "fdl.cluster.yml").write_text(yaml.safe_dump(doc))
    fdl = [*fdl_command(), "@cluster", "job"]
    other_env = {**env, "PYTHONPATH": str(against)} if against is not None else None
    for which in (env, other_env):
        if which is None:
            continue
        first = subprocess.run(fdl, cwd=project_dir, env=which, capture_output=True, text=True, check=False)
        if first.returncode != 0:  # cold: ships the binary, opens the SSH masters
            raise SystemExit(f"fdl @cluster job on {size} hosts failed ({which['PYTHONPATH']}): {first.stderr}")
    ssh = " & ".join(shlex.join([*h.ssh_argv(extra=("-o", "ControlMaster=auto", "-o", f"ControlPath={work}/cp-%C",
                                                   "-o", "ControlPersist=120")), f"/usr/bin/{RANK}"])
                     for h in hosts) + " & wait"
    parallel = ["/bin/sh", "-c", ssh]
    subprocess.run(parallel, check=False)  # open the parallel side's masters too
    bed.verify()
    samples: dict[str, list[tuple[float, float, int]]] = {"ssh": [], "fdl": [], "other": []}
    for _ in range(runs):  # round-robin, so machine noise hits every command alike
        samples["ssh"].append(timed(parallel, project_dir, env))
        samples["fdl"].append(timed(fdl, project_dir, env))
        if other_env is not None:
            samples["other"].append(timed(fdl, project_dir, other_env))
    failed = [s for s in samples["fdl"] + samples["other"] if s[2] != 0]
    if failed:
        raise SystemExit(f"fdl @cluster job on {size} hosts failed {len(failed)} of {runs} times")
    medians = {k: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
               for k, v in samples.items() if v}
    other = medians.get("other")
    print(f"  {size} hosts: parallel ssh {medians['ssh'][0]:.3f}s, fdl {medians['fdl'][0]:.3f}s"
          + (f", {against} {other[0]:.3f}s" if other else ""), flush=True)
    return size, medians["ssh"], medians["fdl"], other


def project(rows: list[tuple[int, tuple, tuple]]) -> None:
    """Least-squares controller CPU = fixed + per_host * N, extrapolated to 1,000 hosts."""
    if len(rows) < 2:
        return
    xs = [r[0] for r in rows]
    print("\nprojection to 1,000 hosts (controller CPU = fixed + per-host x N, least squares over the sizes):")
    for label, idx in (("parallel ssh", 1), ("fdl", 2)):
        ys = [r[idx][1] for r in rows]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / \
            sum((x - mean_x) ** 2 for x in xs)
        fixed = mean_y - slope * mean_x
        total = fixed + slope * 1000
        print(f"  {label:<13} fixed {fixed:.3f}s + {slope * 1000:.1f} ms/host -> {total:.1f} CPU s at 1,000 hosts "
              f"({total / os.cpu_count():.1f} s wall on this machine's {os.cpu_count()} cores if CPU-bound)")
    print("  on paper, at 1,000 hosts: the launcher holds 3 pipes and 2 reader threads per host (about 3,000 "
          "descriptors, past the usual soft limit of 1,024, which it raises to the hard limit; 2,000 threads), and "
          "this machine runs one ssh client and one ControlMaster per host (2,000 processes); the controller CPU "
          "above is spent once, at dispatch, then the run costs only the ssh streams")


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
    parser.add_argument("--sizes", default="", help="testbed sizes to run across, e.g. 3,16,32,64 (root)")
    parser.add_argument("--hosts", type=int, default=0, help="the same as --sizes N")
    parser.add_argument("--no-single", action="store_true", help="skip the single-host case")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout of fdl to time in the same round-robin across hosts (its fdl/)")
    parser.add_argument("--baseline", type=Path, metavar="DIR", action="append", default=[],
                        help="another fdl checkout whose single-host launch runs in the same rounds (repeatable)")
    opts = parser.parse_args()
    sizes = [int(n) for n in opts.sizes.split(",") if n.strip()] + ([opts.hosts] if opts.hosts else [])
    compile_package(opts.baseline)
    started = time.monotonic()
    if not opts.no_single:
        single_host(opts.runs, opts.ranks, opts.baseline)
    if sizes:
        against = opts.against.resolve() if opts.against is not None else None
        if against is not None and not (against / "fdl" / "__init__.py").is_file():
            raise SystemExit(f"--against {opts.against}: no fdl package there")
        across_hosts(opts.runs, sorted(set(sizes)), against)
    print(f"(bench took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()
