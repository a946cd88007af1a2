"""`fdl @cluster probe --json` against plain parallel ssh and stock Ansible, on the testbed, in one run.

    sudo python bench/cluster_probe.py [--sizes 4,16,32,64] [--runs 3] [--cold]

For each size N a testbed of N sshd hosts is built (network namespaces on a
bridge, tests/testbed), every host with a fake GPU, a libtorch tree with a
bundled NCCL, and the shared data mount, all reached through each worker's
`env:` as a real cluster would. Then, medians of whole-command wall time:

- fdl cold: `fdl @cluster probe --json` with an empty cache (no SSH masters,
  no module_utils directory, no runner directory);
- fdl warm: the same command again (SSH masters kept from the previous run);
- raw ssh: one `ssh host 'env ... python3 -'` per host, all at once from a
  shell, each fed the same check code (fdl/hostside/ and pynvml zipped into one
  script, as AnsiballZ ships them) and printing the same JSON report;
- stock Ansible: `ansible-playbook -i hosts.fdl.yml` of the same role with
  Ansible's defaults (forks 5, facts gathered, no pipelining).

The warm, raw and stock commands are sampled round-robin so machine noise
hits them alike. For each command it measures wall time and controller CPU:
user+system time of the command and every process it waited for (getrusage
of children), plus the CPU the persistent SSH masters it left running spent
meanwhile (they detach, so getrusage does not see them; read from /proc).
Prints the medians, the ratios to raw ssh, CPU per host, and a projection to
1,000 hosts from the measured per-host controller CPU. Targets: fdl <= 1.5x
raw ssh wall at every size, controller CPU <= 1.2x at N=16. Needs root (the
testbed does); FDL_TESTBED_PREFIX / FDL_TESTBED_NET pick the testbed.

    sudo python bench/cluster_probe.py --via [--sizes 16,32,64] [--nodes 1,2,4] [--runs 3]

Execution nodes instead (docs/ansible.md, "At fleet scale"): one testbed of the
largest size plus the largest node count (nodes are testbed hosts whose users
have their own ssh setup, prepared once by the flodl.fdl.execution_node
playbook from a wheelhouse), then, for every size N and node count k, the same
N workers probed directly and through k nodes (workers assigned round-robin),
all configurations sampled round-robin in one run. Per configuration: wall,
controller CPU (as above: fdl's process tree and its detached ssh masters) and
node CPU (every process in the nodes' network namespaces: user, system and
reaped children's time). Fits controller CPU through nodes to a + b*k + c*N,
direct to a0 + c0*N, node CPU per node to d + e*(its hosts), and projects a
10,000-host probe with 40 nodes. Goals: c <= c0/4 (controller CPU per host
through nodes at most a quarter of direct); the projection <= 60 s.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import resource
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

from fdl.collection import module_utils, pynvml_file  # noqa: E402
from fdl.resources import collections_path  # noqa: E402
from tests.fakes import FakeNvml, build_fake_nvml, make_libtorch  # noqa: E402
from tests.testbed import Testbed  # noqa: E402

TARGET = 1.5
CPU_TARGET = 1.2
PREFIX = os.environ.get("FDL_TESTBED_PREFIX", "fdltb")
NET = os.environ.get("FDL_TESTBED_NET", "10.231.3")
TICK = os.sysconf("SC_CLK_TCK")


def check_script() -> str:
    """The probe as one self-contained script: fdl/hostside/ + pynvml zipped in, options as argv JSON."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("fdl_host/__init__.py", "")
        for rel, source in module_utils().items():
            bundle.write(source, f"fdl_host/{rel}")
        bundle.write(pynvml_file(), "pynvml.py")
    payload = base64.b64encode(buf.getvalue()).decode()
    return (
        "import base64, json, os, sys, tempfile\n"
        "fd, path = tempfile.mkstemp(suffix='.zip')\n"
        f"os.write(fd, base64.b64decode({payload!r})); os.close(fd)\n"
        "sys.path.insert(0, path)\n"
        "from fdl_host.checks.probe import ProbeOptions, run_probe\n"
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


def master_cpu(under: Path) -> float:
    """CPU seconds used so far by the detached ssh masters whose control socket lies under `under`."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not cmdline.startswith("ssh: ") or str(under) not in cmdline:
                continue
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def timed(argv: list[str], cwd: Path, env: dict, masters: Path | None = None
          ) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, controller CPU seconds (the process tree plus the ssh masters under `masters`), result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    mbefore = master_cpu(masters) if masters else 0.0
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if masters:
        cpu += max(0.0, master_cpu(masters) - mbefore)
    return wall, cpu, done


def bench_size(n: int, runs: int, cold: bool) -> dict:
    with Testbed.up(n, prefix=PREFIX, net=NET) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdltb", dir="/tmp"))
        try:
            return _bench(bed, work, runs, cold)
        finally:
            for cp in work.glob("**/cp"):
                close_masters(cp)
            close_masters(work / "home" / ".ansible" / "cp")
            shutil.rmtree(work, ignore_errors=True)


def _setup(bed: Testbed, work: Path) -> tuple[Path, dict, dict[str, tuple[list[str], dict]]]:
    """The project, fdl's environment and the three contenders' commands, each checked to work once."""
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
    play[0]["collections"] = ["flodl.fdl"]  # the copy sits outside the collection: its short names resolve there
    (stock_dir / "probe.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    stock_env = {**env, "ANSIBLE_CONFIG": str(stock_dir / "ansible.cfg")}
    stock = [str(Path(PY).parent / "ansible-playbook"), "-i", "hosts.fdl.yml", str(stock_dir / "probe.yml")]

    # every contender must actually work before it is timed (this also warms fdl's SSH masters)
    _, _, done = timed(fdl, project, env)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stdout[-2000:] + done.stderr[-2000:]
    _, _, done = timed(raw, project, env)
    reports = [json.loads((raw_out / h.name).read_text()) for h in bed.hosts]
    assert done.returncode == 0 and all(r["ok"] for r in reports), done.stderr
    _, _, done = timed(stock, project, stock_env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project, env, {"fdl": (fdl, env), "raw ssh": (raw, env), "stock ansible": (stock, stock_env)}


def _bench(bed: Testbed, work: Path, runs: int, cold: bool) -> dict:
    project, env, commands = _setup(bed, work)
    fdl = commands["fdl"][0]
    samples: dict[str, list[tuple[float, float]]] = {"fdl cold": [], "fdl": [], "raw ssh": [], "stock ansible": []}
    for i in range(runs if cold else 0):
        cache = work / f"cold-{i}"
        wall, cpu, done = timed(fdl, project, {**env, "XDG_CACHE_HOME": str(cache)}, masters=cache)
        assert done.returncode == 0, done.stderr
        samples["fdl cold"].append((wall, cpu))
        close_masters(cache / "fdl" / "cp")
    for _ in range(runs):
        for name, (argv, run_env) in commands.items():
            wall, cpu, done = timed(argv, project, run_env, masters=work)
            assert done.returncode == 0, (name, done.stderr[-2000:])
            samples[name].append((wall, cpu))
    return {name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
            for name, values in samples.items() if values}


def profile_size(n: int, out: Path) -> list[str]:
    """Where one warm `fdl @cluster probe --json` spends its time: phases from the runner's event stream."""
    with Testbed.up(n, prefix=PREFIX, net=NET) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdltb", dir="/tmp"))
        try:
            project, env, commands = _setup(bed, work)
            fdl = commands["fdl"][0]
            timed(fdl, project, env)  # warm
            out.mkdir(parents=True, exist_ok=True)
            prof = out / f"fdl-{n}.prof"
            argv = [PY, "-m", "cProfile", "-o", str(prof), "-m", "fdl", *fdl[1:]] if fdl[0] != PY else \
                [PY, "-m", "cProfile", "-o", str(prof), *fdl[1:]]
            start = time.time()
            wall, cpu, done = timed(argv, project, env, masters=work)
            end = time.time()
            assert done.returncode == 0, done.stderr[-2000:]
            return _phases(n, work / "home" / ".cache" / "fdl" / "runner", start, end, wall, cpu)
        finally:
            for cp in work.glob("**/cp"):
                close_masters(cp)
            shutil.rmtree(work, ignore_errors=True)


def _phases(n: int, runner_dir: Path, start: float, end: float, wall: float, cpu: float) -> list[str]:
    from datetime import datetime

    jobs = sorted(runner_dir.glob("*/artifacts/*/job_events"), key=lambda p: p.stat().st_mtime)
    if not jobs:
        return [f"N={n}: no event files kept (fdl drops them); phases not available"]
    events = [json.loads(f.read_text()) for f in jobs[-1].glob("*.json")]
    events.sort(key=lambda e: e["counter"])

    def at(event: dict) -> float:
        return datetime.fromisoformat(event["created"]).timestamp()

    first = {e["event"]: at(e) for e in reversed(events)}
    last = {e["event"]: at(e) for e in events}
    marks = [("fdl start -> ansible-playbook's first event", start, first["playbook_on_start"]),
             ("playbook parsed -> play started", first["playbook_on_start"], first["playbook_on_play_start"]),
             ("play start -> first task started", first["playbook_on_play_start"],
              first["playbook_on_task_start"])]
    answers = [last[k] for k in ("runner_on_ok", "runner_on_failed") if k in last]
    if answers:  # per-host events kept (fdl before it stopped writing them)
        marks += [("first task start -> last host's module answer", first["playbook_on_task_start"], max(answers)),
                  ("last answer -> stats", max(answers), last["playbook_on_stats"])]
    else:
        marks += [("first task start -> every host answered (stats)", first["playbook_on_task_start"],
                   last["playbook_on_stats"])]
    marks += [("stats -> fdl exit", last["playbook_on_stats"], end)]
    lines = [f"N={n}: wall {wall:.2f} s, controller CPU {cpu:.2f} s, {len(events)} events, "
             f"{sum(1 for e in events if e['event'] == 'playbook_on_task_start')} task(s)"]
    lines += [f"  {label:<48} {b - a:6.2f} s" for label, a, b in marks]
    return lines


def projection(rows: dict[int, dict]) -> list[str]:
    """A paper projection to 1,000 hosts from the per-host controller CPU fdl was measured at."""
    sizes = sorted(rows)
    if len(sizes) < 2:
        return ["projection: needs two sizes or more"]
    lo, hi = sizes[0], sizes[-1]
    per_host = (rows[hi]["fdl"][1] - rows[lo]["fdl"][1]) / (hi - lo)
    fixed = rows[lo]["fdl"][1] - per_host * lo
    cores = os.cpu_count() or 1
    cpu_1000 = fixed + per_host * 1000
    raw_per_host = (rows[hi]["raw ssh"][1] - rows[lo]["raw ssh"][1]) / (hi - lo)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return [
        f"projection to 1,000 hosts (fdl's controller CPU fitted over N={lo}..{hi}: {fixed:.2f} s fixed + "
        f"{per_host * 1000:.1f} ms per host; raw ssh {raw_per_host * 1000:.1f} ms per host):",
        f"  controller CPU {cpu_1000:.0f} s per probe -> at least {cpu_1000 / cores:.0f} s wall on this machine's "
        f"{cores} cores, {cpu_1000 / 32:.1f} s on 32 cores: CPU runs out first.",
        f"  forks = hosts would mean 1,000 worker processes (the largest controller process measured here had "
        f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB resident, forks share most of "
        f"it copy-on-write) and 1,000 ssh masters (3 fds each + one per session; this shell's open-file limit "
        f"is {soft}); cap forks at "
        f"{max(8, cores * 8)} ({cores} cores x 8) and waves of hosts follow: about "
        f"{(1000 / max(8, cores * 8)):.0f} waves of one module run each.",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,32,64")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also time fdl with an empty cache (no SSH masters)")
    parser.add_argument("--profile", metavar="DIR", help="instead: one warm run per size under cProfile (written to "
                                                        "DIR) and its phases from the runner's event stream")
    parser.add_argument("--via", action="store_true", help="instead: direct against through execution nodes "
                                                           "(--sizes default 16,32,64, --nodes 1,2,4)")
    parser.add_argument("--nodes", default="1,2,4", help="with --via: the node counts")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/cluster_probe.py needs root: it builds the network-namespace testbed", file=sys.stderr)
        return 2
    compile_package()
    if args.via:
        sizes = [int(s) for s in (args.sizes if args.sizes != "4,16,32,64" else "16,32,64").split(",")]
        return via_main(sizes, [int(k) for k in args.nodes.split(",")], args.runs)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.profile:
        for n in sizes:
            for line in profile_size(n, Path(args.profile)):
                print(line, flush=True)
        return 0
    rows = {}
    for n in sizes:
        print(f"N={n}: building the testbed and measuring ({args.runs} runs each)...", file=sys.stderr, flush=True)
        rows[n] = bench_size(n, args.runs, args.cold)
    print("medians; wall in seconds, controller CPU in seconds (per host in ms)")
    print(f"{'N':>3} | {'fdl':>6} {'raw':>6} {'stock':>6} {'fdl/raw':>7} {'stk/raw':>7} | "
          f"{'fdl cpu':>7} {'raw cpu':>7} {'stk cpu':>7} {'fdl/raw':>7} | {'fdl ms/h':>8} {'raw ms/h':>8}"
          + ("  | cold  cold/raw" if args.cold else ""))
    for n, r in rows.items():
        (fw, fc), (rw, rc), (sw, sc) = r["fdl"], r["raw ssh"], r["stock ansible"]
        line = (f"{n:>3} | {fw:>6.2f} {rw:>6.2f} {sw:>6.2f} {fw / rw:>6.2f}x {sw / rw:>6.2f}x | "
                f"{fc:>7.2f} {rc:>7.2f} {sc:>7.2f} {fc / rc:>6.2f}x | {fc / n * 1000:>8.1f} {rc / n * 1000:>8.1f}")
        if "fdl cold" in r:
            line += f"  | {r['fdl cold'][0]:>5.2f} {r['fdl cold'][0] / rw:>6.2f}x"
        print(line)
    for n, r in rows.items():
        ratio = r["fdl"][0] / r["raw ssh"][0]
        print(f"target wall <= {TARGET}x raw ssh at N={n}: {ratio:.2f}x, {'met' if ratio <= TARGET else 'MISSED'}")
    if 16 in rows:
        ratio = rows[16]["fdl"][1] / rows[16]["raw ssh"][1]
        verdict = "met" if ratio <= CPU_TARGET else "MISSED"
        print(f"target CPU <= {CPU_TARGET}x raw ssh at N=16: {ratio:.2f}x, {verdict}")
    for line in projection(rows):
        print(line)
    return 0


# --------------------------------------------------------------------------- --via: through execution nodes


PROJECT_HOSTS = 10_000
PROJECT_NODES = 40
WALL_GOAL = 60.0


def wheelhouse() -> Path:
    """ansible-core and ansible-runner at fdl's releases (and their dependencies), downloaded once."""
    from fdl.cluster.nodes import pinned_packages

    pins = pinned_packages()
    name = "wheelhouse-" + "-".join(f"{k}{v}" for k, v in sorted(pins.items()))
    where = Path.home() / ".cache" / "fdl-bench" / name
    if not (where / ".complete").is_file():
        done = subprocess.run([PY, "-m", "pip", "download", "--quiet", "--dest", str(where), "--constraint",
                               str(REPO / "constraints.txt"), *(f"{k}=={v}" for k, v in pins.items())],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        (where / ".complete").write_text("")
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return where


PREPARE = """\
import sys
from pathlib import Path
from fdl.cluster.inventory import build_inventory
from fdl.cluster.runner import prepare_nodes
from fdl.config.project import EnvSelection, load_config
config = load_config(Path("."), EnvSelection("cluster", "bench"))
result = prepare_nodes(build_inventory(config.cluster, config.root), wheelhouse=Path(sys.argv[1]), progress=False)
bad = {n: h.message or h.status for n, h in result.hosts.items() if h.status != "ok"}
sys.exit(f"nodes not prepared: {bad}" if bad else 0)
"""


def netns_cpu(hosts: list) -> float:
    """CPU seconds of every process in the hosts' network namespaces so far: user + system, and what their reaped
    children used (a node's job runs under its sshd, its ssh masters detach inside the namespace)."""
    total = 0
    for host in hosts:
        for pid in host.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / TICK


def via_main(sizes: list[int], node_counts: list[int], runs: int) -> int:
    n_max, k_max = max(sizes), max(node_counts)
    print(f"--via: building a testbed of {n_max} workers and {k_max} execution nodes...", file=sys.stderr, flush=True)
    with Testbed.up(n_max, prefix=PREFIX, net=NET, nodes=k_max) as bed:
        work = Path(tempfile.mkdtemp(prefix="fdltb", dir="/tmp"))
        try:
            rows = _via_bench(bed, work, sizes, node_counts, runs)
        finally:
            for cp in work.glob("**/cp"):
                close_masters(cp)
            shutil.rmtree(work, ignore_errors=True)
    _via_report(rows, sizes, node_counts)
    return 0


def _via_bench(bed: Testbed, work: Path, sizes: list[int], node_counts: list[int], runs: int) -> dict:
    nvml = FakeNvml(build_fake_nvml(bed.shared / "nvml"))
    libtorch = make_libtorch(bed.shared / "libtorch", nccl="2.27.5")
    subprocess.run(["chmod", "-R", "a+rX", str(bed.shared)], check=True)
    entries = bed.workers(env={**nvml.env("H100:9.0:80G"), "LIBTORCH": str(libtorch)}, data_path=str(bed.storage))
    nodes = [n.execution_node() for n in bed.nodes]
    env = env_for_fdl(bed.home_env(work / "home"))
    fdl = [*fdl_command(), "@cluster", "probe", "--json"]

    def project(n: int, k: int) -> Path:
        root = work / f"p{n}-{k}"
        root.mkdir()
        (root / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
        workers = [dict(e, via=f"n{1 + i % k}") if k else dict(e) for i, e in enumerate(entries[:n])]
        for w in workers:
            if k:
                w.pop("identity")  # the node's own ssh setup reaches it
        (root / "fdl.cluster.yml").write_text(yaml.safe_dump(bed.cluster(workers, nodes=nodes[:k] or None),
                                                             sort_keys=False))
        return root

    configs = {(n, k): project(n, k) for n in sizes for k in [0, *node_counts]}
    start = time.perf_counter()
    done = subprocess.run([PY, "-c", PREPARE, str(wheelhouse())], cwd=configs[(sizes[-1], max(node_counts))],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    print(f"--via: {len(bed.nodes)} nodes prepared in {time.perf_counter() - start:.1f} s", file=sys.stderr,
          flush=True)
    for key, root in configs.items():  # every configuration works (and warms its masters) before it is timed
        _, _, done = timed(fdl, root, env)
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], (key, done.stdout[-2000:], done.stderr[-2000:])
    samples: dict[tuple[int, int], list[tuple[float, float, float]]] = {key: [] for key in configs}
    for i in range(runs):
        print(f"--via: round {i + 1} of {runs}", file=sys.stderr, flush=True)
        for key, root in configs.items():
            used = bed.nodes[:key[1]]
            before = netns_cpu(used)
            wall, cpu, done = timed(fdl, root, env, masters=work)
            node_cpu = netns_cpu(used) - before
            assert done.returncode == 0, (key, done.stderr[-2000:])
            samples[key].append((wall, cpu, node_cpu))
    return {key: tuple(statistics.median(s[j] for s in values) for j in range(3)) for key, values in samples.items()}


def _fit(points: list[tuple[list[float], float]]) -> list[float]:
    """Least squares: coefficients x with row . x ~ y for (row, y) points (normal equations, Gauss-Jordan)."""
    m = len(points[0][0])
    a = [[sum(r[i] * r[j] for r, _ in points) for j in range(m)] + [sum(r[i] * y for r, y in points)]
         for i in range(m)]
    for col in range(m):
        pivot = max(range(col, m), key=lambda row: abs(a[row][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for row in range(m):
            if row != col and a[col][col]:
                f = a[row][col] / a[col][col]
                a[row] = [x - f * y for x, y in zip(a[row], a[col], strict=True)]
    return [a[i][m] / a[i][i] if a[i][i] else 0.0 for i in range(m)]


def _via_report(rows: dict, sizes: list[int], node_counts: list[int]) -> None:
    cores = os.cpu_count() or 1
    print("medians; wall and CPU in seconds; per host in ms; k = execution nodes (0: direct)")
    print(f"{'N':>3} {'k':>2} | {'wall':>6} {'ctl cpu':>7} {'ctl/host':>8} {'vs direct':>9} | "
          f"{'node cpu':>8} {'node/host':>9}")
    for n in sizes:
        direct = rows[(n, 0)][1] / n
        for k in [0, *node_counts]:
            wall, cpu, node = rows[(n, k)]
            ratio = "" if k == 0 else f"{cpu / n / direct:>8.2f}x"
            node_cols = f"{'-':>8} {'-':>9}" if k == 0 else f"{node:>8.2f} {node / n * 1000:>9.1f}"
            print(f"{n:>3} {k:>2} | {wall:>6.2f} {cpu:>7.2f} {cpu / n * 1000:>8.1f} {ratio:>9} | {node_cols}")
    a0, c0 = _fit([([1.0, n], rows[(n, 0)][1]) for n in sizes])
    a, b, c = _fit([([1.0, k, n], rows[(n, k)][1]) for n in sizes for k in node_counts])
    d, e = _fit([([1.0, n / k], rows[(n, k)][2] / k) for n in sizes for k in node_counts])
    print(f"fitted controller CPU: direct {a0:.2f} s + {c0 * 1000:.1f} ms per host; through nodes {a:.2f} s + "
          f"{b * 1000:.0f} ms per node + {c * 1000:.2f} ms per host")
    print(f"fitted node CPU: {d:.2f} s per node and job + {e * 1000:.1f} ms per host it drives")
    verdict = "met" if c <= c0 / 4 else "MISSED"
    print(f"goal: controller CPU per host through nodes <= 1/4 of direct: {c * 1000:.2f} against "
          f"{c0 * 1000:.1f} ms ({c / c0:.3f}x), {verdict}")
    for n in sizes:
        per = [rows[(n, k)][1] / rows[(n, 0)][1] for k in node_counts]
        print(f"  at N={n}, whole-command controller CPU through {'/'.join(map(str, node_counts))} node(s) against "
              f"direct: {' / '.join(f'{r:.2f}x' for r in per)}")
    hosts_per_node = PROJECT_HOSTS / PROJECT_NODES
    ctl = a + b * PROJECT_NODES + c * PROJECT_HOSTS
    node = d + e * hosts_per_node
    print(f"projection to {PROJECT_HOSTS:,} hosts with {PROJECT_NODES} nodes ({hosts_per_node:.0f} hosts each):")
    print(f"  controller CPU {ctl:.1f} s (fdl's one process: its events are parsed under one interpreter lock, so "
          f"this much wall at least; direct it would be {a0 + c0 * PROJECT_HOSTS:.0f} s)")
    for node_cores in sorted({cores, 8}):
        wall = a + max(ctl - a, node / node_cores)
        verdict = "met" if wall <= WALL_GOAL else "MISSED"
        print(f"  each node {node:.1f} s of CPU -> {node / node_cores:.1f} s on {node_cores} cores; the probe "
              f"~{wall:.1f} s (fdl's start, then the slower of the event stream and the nodes): goal <= "
              f"{WALL_GOAL:.0f} s {verdict}")


if __name__ == "__main__":
    sys.exit(main())
