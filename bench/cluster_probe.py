"""`fdl @cluster probe --json` against plain parallel ssh and stock Ansible, on the testbed, in one run.

    sudo python bench/cluster_probe.py [--sizes 4,16,32] [--runs 3]

For each size N a testbed of N sshd hosts is built (network namespaces on a
bridge, tests/testbed), every host with a fake GPU, a libtorch tree with a
bundled NCCL, and the shared data mount, all reached through each worker's
`env:` as a real cluster would. Then, medians of whole-command wall time:

- fdl cold: `fdl @cluster probe --json` with an empty cache (no SSH masters,
  no module_utils directory, no runner directory);
- fdl warm: the same command again (SSH masters kept from the previous run);
- raw ssh: one `ssh host 'env ... python3 -'` per host, all at once from a
  shell, each fed the same check code (fdl/checks and pynvml zipped into one
  script, as AnsiballZ ships them) and printing the same JSON report;
- stock Ansible: `ansible-playbook -i hosts.fdl.yml` of the same role with
  Ansible's defaults (forks 5, facts gathered, no pipelining).

The warm, raw and stock commands are sampled round-robin so machine noise
hits them alike. Prints the medians and the ratios to raw ssh. Target: warm
fdl <= 1.5x raw ssh at N=16. Needs root (the testbed does).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
import yaml  # noqa: E402
from _timing import PY, compile_package, env_for_fdl, fdl_command  # noqa: E402

from fdl.collection import PACKAGE_DIR, pynvml_file  # noqa: E402
from fdl.resources import collections_path  # noqa: E402
from tests.fakes import FakeNvml, build_fake_nvml, make_libtorch  # noqa: E402
from tests.testbed import Testbed  # noqa: E402

TARGET = 1.5
PREFIX, NET = "fdltb", "10.231.3"


def check_script() -> str:
    """The probe as one self-contained script: fdl/checks + pynvml zipped in, options as argv JSON."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as bundle:
        for source in sorted((PACKAGE_DIR / "checks").glob("*.py")):
            bundle.write(source, f"fdl_checks/{source.name}")
        bundle.write(pynvml_file(), "pynvml.py")
    payload = base64.b64encode(buf.getvalue()).decode()
    return (
        "import base64, json, os, sys, tempfile\n"
        "fd, path = tempfile.mkstemp(suffix='.zip')\n"
        f"os.write(fd, base64.b64decode({payload!r})); os.close(fd)\n"
        "sys.path.insert(0, path)\n"
        "from fdl_checks.probe import ProbeOptions, run_probe\n"
        "report = run_probe(ProbeOptions(**json.loads(sys.argv[2])), host=sys.argv[1])\n"
        "os.remove(path)\n"
        "print(json.dumps(report.to_dict()))\n"
    )


def raw_command(bed: Testbed, workers: list[dict], script: Path, out_dir: Path) -> list[str]:
    """A shell line starting one plain ssh per host in parallel, then waiting for all of them."""
    lines = []
    for worker in workers:
        host = bed.host(worker["host"])
        options = json.dumps({"data_path": worker["data_path"]})
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in worker["env"].items())
        remote = f"env {env} /usr/bin/python3 - {host.name} {shlex.quote(options)}"
        lines.append(f"{shlex.join(host.ssh_argv())} {shlex.quote(remote)} < {script} > {out_dir / host.name} &")
    return ["bash", "-c", "\n".join(lines) + "\nwait\n"]


def close_masters(cp_dir: Path) -> None:
    """Stop the persistent SSH masters a run left (by their control sockets)."""
    if not cp_dir.is_dir():
        return
    for sock in cp_dir.iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=10)


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, done


def bench_size(n: int, runs: int) -> dict:
    with Testbed.up(n, prefix=PREFIX, net=NET) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdltb", dir="/tmp"))
        try:
            return _bench(bed, work, runs)
        finally:
            for cp in work.glob("**/cp"):
                close_masters(cp)
            close_masters(work / "home" / ".ansible" / "cp")
            shutil.rmtree(work, ignore_errors=True)


def _bench(bed: Testbed, work: Path, runs: int) -> dict:
    nvml = FakeNvml(build_fake_nvml(bed.shared / "nvml"))
    libtorch = make_libtorch(bed.shared / "libtorch", nccl="2.27.5")
    subprocess.run(["chmod", "-R", "a+rX", str(bed.shared)], check=True)
    workers = bed.workers(env={**nvml.env("H100:9.0:80G"), "LIBTORCH": str(libtorch)}, data_path=str(bed.storage))
    project = work / "project"
    project.mkdir()
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    (project / "fdl.cluster.yml").write_text(yaml.safe_dump(bed.cluster(workers), sort_keys=False))
    home = work / "home"
    env = env_for_fdl(bed.home_env(home))
    fdl = [*fdl_command(), "@cluster", "probe", "--json"]

    script = work / "check.py"
    script.write_text(check_script())
    raw_out = work / "raw"
    raw_out.mkdir()
    raw = raw_command(bed, workers, script, raw_out)

    stock_dir = work / "stock"
    stock_dir.mkdir()
    (stock_dir / "ansible.cfg").write_text(
        "# Ansible's defaults, plus only what it takes to find the flodl.fdl collection.\n"
        f"[defaults]\ncollections_path = {collections_path()}\n")
    (project / "hosts.fdl.yml").write_text("plugin: flodl.fdl.cluster\n")
    play = yaml.safe_load((collections_path() / "ansible_collections/flodl/fdl/playbooks/probe.yml").read_text())
    play[0]["gather_facts"] = True  # Ansible's default
    (stock_dir / "probe.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    stock_env = {**env, "ANSIBLE_CONFIG": str(stock_dir / "ansible.cfg")}
    stock = [str(Path(PY).parent / "ansible-playbook"), "-i", "hosts.fdl.yml", str(stock_dir / "probe.yml")]

    # every contender must actually work before it is timed
    _, done = timed(fdl, project, env)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout[-2000:] + done.stderr[-2000:]
    _, done = timed(raw, project, env)
    reports = [json.loads((raw_out / h.name).read_text()) for h in bed.hosts]
    assert done.returncode == 0 and all(r["ok"] for r in reports), done.stderr
    _, done = timed(stock, project, stock_env)
    assert done.returncode == 0, done.stdout[-3000:]

    cold = []
    for i in range(runs):
        cache = work / f"cold-{i}"
        cold_env = {**env, "XDG_CACHE_HOME": str(cache)}
        seconds, done = timed(fdl, project, cold_env)
        assert done.returncode == 0, done.stderr
        cold.append(seconds)
        close_masters(cache / "fdl" / "cp")
    samples: dict[str, list[float]] = {"fdl warm": [], "raw ssh": [], "stock ansible": []}
    for _ in range(runs):
        for name, (argv, run_env) in (("fdl warm", (fdl, env)), ("raw ssh", (raw, env)),
                                      ("stock ansible", (stock, stock_env))):
            seconds, done = timed(argv, project, run_env)
            assert done.returncode == 0, (name, done.stderr[-2000:])
            samples[name].append(seconds)
    result = {"fdl cold": statistics.median(cold)}
    result.update({name: statistics.median(values) for name, values in samples.items()})
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,32")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/cluster_probe.py needs root: it builds the network-namespace testbed", file=sys.stderr)
        return 2
    compile_package()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = {}
    for n in sizes:
        print(f"N={n}: building the testbed and measuring ({args.runs} runs each)...", file=sys.stderr, flush=True)
        rows[n] = bench_size(n, args.runs)
    print(f"{'N':>3} {'fdl cold':>9} {'fdl warm':>9} {'raw ssh':>9} {'stock':>9}   "
          f"{'warm/raw':>8} {'cold/raw':>8} {'stock/raw':>9} {'stock/warm':>10}")
    for n, r in rows.items():
        raw = r["raw ssh"]
        print(f"{n:>3} {r['fdl cold']:>8.2f}s {r['fdl warm']:>8.2f}s {raw:>8.2f}s {r['stock ansible']:>8.2f}s   "
              f"{r['fdl warm'] / raw:>7.2f}x {r['fdl cold'] / raw:>7.2f}x {r['stock ansible'] / raw:>8.2f}x "
              f"{r['stock ansible'] / r['fdl warm']:>9.2f}x")
    if 16 in rows:
        ratio = rows[16]["fdl warm"] / rows[16]["raw ssh"]
        print(f"target: warm fdl <= {TARGET}x raw ssh at N=16: {ratio:.2f}x, {'met' if ratio <= TARGET else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
