"""Workers behind execution nodes, on the testbed: two nodes with a leg on this machine's bridge and one on a second
bridge this machine has no route to, four workers on that second bridge only, and two workers on the first.

The nodes are prepared by the flodl.fdl.execution_node playbook (a virtualenv with the ansible-core and
ansible-runner fdl runs with, from a wheelhouse: the nodes have no index), from Python and then by docs/ansible.md's
recipe as written (`pip download` into the wheelhouse, `ansible-playbook -i hosts.fdl.yml ...`); then
`fdl @cluster probe` reaches the workers behind them through ansible-runner's transmit | worker | process over ssh
to each node, and gives one report with every worker; a node killed while it runs leaves its workers "unreachable
through" it and the rest of the report standing; and a cluster of one direct worker and one behind a node trains
with CPU ranks (gloo), the second's rank session riding ProxyJump through its node.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO, fdl_env, real_cache, run_fdl

pytestmark = [pytest.mark.testbed(hosts=2, nodes=2, behind=4), pytest.mark.slow]

PROBE_TIMEOUT = 180  # the run's bound: a dead node must be reported well inside it


THIS = "tests/integration/cluster/test_execution_nodes.py"
DOCS_WHEELHOUSE = "/srv/wheels"  # the recipe's wheelhouse, replaced by the test's own


def documented_recipe() -> list[str]:
    """The command lines of docs/ansible.md's recipe that prepares execution nodes (the fence marked as tested by
    this file), continuations joined and comments left out: `pip download ...` and `... ansible-playbook ...`."""
    from tests.recipes import recipes

    mine = [r for r in recipes(REPO) if r.kind == "tested by" and r.detail == THIS]
    assert len(mine) == 1, f"docs/ansible.md has {len(mine)} recipes marked as tested by {THIS}, not one"
    lines, joined = [], ""
    for raw in mine[0].fence.text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        joined += raw[:-1] + " " if raw.endswith("\\") else raw
        if raw.endswith("\\"):
            continue
        if joined.strip():
            lines.append(" ".join(joined.split()))
        joined = ""
    assert [line.split()[0] for line in lines] == ["pip", "ANSIBLE_COLLECTIONS_PATH=\"$(python"], \
        f"{mine[0].where}: the recipe is no longer `pip download ...` then `ansible-playbook ...`: {lines}"
    assert all(DOCS_WHEELHOUSE in line for line in lines), lines
    return lines


def recipe_env(home: dict[str, str]) -> dict[str, str]:
    """A user's shell for the recipe: this environment's python, pip and ansible-playbook first on PATH, no
    ANSIBLE_*, FDL_* or PYTHON* setting, the given HOME and cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FDL_", "PYTHON", "XDG_"))}
    env.update(home, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', os.defpath)}", NO_COLOR="1")
    return env


def run_recipe_line(line: str, wheelhouse: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One command line of the recipe, as written but for its wheelhouse, under bash -euo pipefail."""
    line = line.replace(DOCS_WHEELHOUSE, shlex.quote(str(wheelhouse)))
    return subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """The wheels of ansible-core and ansible-runner at fdl's releases and their dependencies, downloaded once by
    docs/ansible.md's own `pip download` line, and again with fdl's constraints.txt (what
    fdl.cluster.runner.prepare_nodes holds the dependencies to), so both ways of preparing a node install from it."""
    from fdl.cluster.nodes import pinned_packages

    pip_line = documented_recipe()[0]
    pins = pinned_packages()
    documented = dict(word.split("==") for word in pip_line.split() if "==" in word)
    assert documented == pins, (f"docs/ansible.md's `pip download` line pins {documented}; fdl runs with {pins} "
                                f"(constraints.txt): make the page say so")
    key = hashlib.sha256((pip_line + (REPO / "constraints.txt").read_text()).encode()).hexdigest()[:16]
    where = real_cache() / "fdl-test" / f"wheelhouse-{key}"
    if not (where / ".complete").is_file():
        where.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=".partial-wheelhouse-", dir=where.parent))
        steps = [run_recipe_line(pip_line, fresh, fresh, recipe_env({})),
                 subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(fresh),
                                 "--constraint", str(REPO / "constraints.txt"),
                                 *(f"{k}=={v}" for k, v in pins.items())], capture_output=True, text=True)]
        failed = next((step for step in steps if step.returncode != 0), None)
        if failed is not None:
            shutil.rmtree(fresh, ignore_errors=True)
            reason = f"pip could not download the execution node's wheels: {failed.stderr.strip()[-500:]}"
            if IN_CI:
                pytest.fail(reason)
            pytest.skip(reason)
        (fresh / ".complete").write_text("")
        try:
            fresh.rename(where)  # whole or not at all: another run may have put it there meanwhile
        except OSError:
            shutil.rmtree(fresh, ignore_errors=True)
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return where


def workers(kit, *, behind: bool = True, direct: int = 2) -> list[dict]:
    """h1.. direct, then b1..b4 alternating between n1 and n2, every one a green worker (fake GPU, libtorch, data)."""
    out = [h.worker(env=kit.worker_env(), data_path=str(kit.data)) for h in kit.bed.hosts[:direct]]
    if behind:
        out += [b.worker(via=f"n{1 + i % 2}", env=kit.worker_env(), data_path=str(kit.data))
                for i, b in enumerate(kit.bed.behind)]
    return out


def node_entries(bed) -> list[dict]:
    return [n.execution_node() for n in bed.nodes]


@pytest.fixture(scope="module")
def prepared(testbed, kit, wheelhouse):
    """The two nodes prepared by their playbook, once for the module; the run's per-host results."""
    work = Path(tempfile.mkdtemp(prefix="fdln", dir="/tmp"))  # short: ssh control sockets live under it
    try:
        project = kit.project(work / "proj", workers(kit), execution_nodes=node_entries(testbed),
                              ssh={"known_hosts": str(testbed.known_hosts), "identity": str(testbed.key)})
        yield prepare(project, testbed.home_env(work / "home"), wheelhouse)
    finally:
        shutil.rmtree(work, ignore_errors=True)


PREPARE = """\
import json, sys
from pathlib import Path
from fdl.cluster.inventory import build_inventory
from fdl.cluster.runner import prepare_nodes
from fdl.config.project import EnvSelection, load_config
config = load_config(Path("."), EnvSelection("cluster", "test"))
result = prepare_nodes(build_inventory(config.cluster, config.root), wheelhouse=Path(sys.argv[1]), progress=False)
print(json.dumps({name: {"status": host.status, "message": host.message,
                         "changed": [t.task for t in host.tasks if (t.res or {}).get("changed")],
                         "said": (host.res or {}).get("msg")} for name, host in result.hosts.items()}))
"""


def prepare(project: Path, home: dict, wheelhouse: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PREPARE, str(wheelhouse)], cwd=project, env=fdl_env(home),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def probe(project: Path, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    done = run_fdl("@cluster", "probe", "--json", cwd=project, env=env, timeout=PROBE_TIMEOUT)
    return done, json.loads(done.stdout)


def by_host(doc: dict) -> dict:
    return {h["host"]: {c["name"]: c for c in h["checks"]} for h in doc["hosts"]}


def ready_line(node, pins: dict[str, str]) -> str:
    """What the playbook says of a node it prepared."""
    return (f"{node.name}: execution node ready: ansible-core {pins['ansible-core']}, "
            f"ansible-runner {pins['ansible-runner']} in {node.home}/.flodl/execution-node/venv")


RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """ansible-playbook's PLAY RECAP: {host: {ok: N, changed: N, unreachable: N, failed: N, ...}}."""
    return {m["host"]: {k: int(v) for k, v in (pair.split("=") for pair in m["counts"].split())}
            for m in RECAP.finditer(stdout)}


def prepare_as_documented(kit, wheelhouse: Path, where: Path) -> subprocess.CompletedProcess:
    """docs/ansible.md's `ansible-playbook -i hosts.fdl.yml flodl.fdl.execution_node ...` line, as written but for
    its wheelhouse, from a project directory holding fdl.yml, fdl.cluster.yml and the page's hosts.fdl.yml (the
    inventory source file of "An inventory source file"), in a user's shell with a fresh HOME."""
    from tests.recipes import file_from_fences, recipes

    recipe = next(r for r in recipes(REPO) if r.kind == "tested by" and r.detail == THIS)
    project = kit.project(where / "proj", workers(kit), execution_nodes=node_entries(kit.bed),
                          ssh={"known_hosts": str(kit.bed.known_hosts), "identity": str(kit.bed.key)})
    source = file_from_fences(recipe, "hosts.fdl.yml")
    assert source is not None and "plugin: flodl.fdl.cluster" in source, source
    (project / "hosts.fdl.yml").write_text(source)
    return run_recipe_line(documented_recipe()[1], wheelhouse, project, recipe_env(kit.bed.home_env(where / "home")))


def test_the_nodes_are_prepared_by_their_playbook_and_a_second_run_installs_nothing(testbed, kit, prepared,
                                                                                    wheelhouse, short_tmp):
    """The first preparation from Python (fdl.cluster.runner.prepare_nodes), the second by docs/ansible.md's recipe: the
    same playbook, hence the same releases, so the second finds them there and changes nothing."""
    from fdl.cluster.nodes import pinned_packages

    pins = pinned_packages()
    for node in testbed.nodes:
        outcome = prepared[node.name]
        assert outcome["status"] == "ok", outcome
        assert outcome["said"] == ready_line(node, pins)
        assert "Install the packages at their releases" in outcome["changed"]
        runner = node.home / ".flodl" / "execution-node" / "venv" / "bin" / "ansible-runner"
        assert runner.is_file() and runner.stat().st_uid == pwd.getpwnam(node.user).pw_uid
    again = prepare_as_documented(kit, wheelhouse, short_tmp)
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    counts = recap(again.stdout)
    assert {name: (c["unreachable"], c["failed"]) for name, c in counts.items()} == {"n1": (0, 0), "n2": (0, 0)}, \
        again.stdout[-3000:]
    assert all(c["changed"] == 0 for c in counts.values()), again.stdout[-3000:]  # idempotent: the releases are there
    for node in testbed.nodes:
        assert f'"msg": "{ready_line(node, pins)}"' in again.stdout, again.stdout[-3000:]


def test_the_documented_recipe_installs_from_the_wheelhouse_alone(testbed, kit, prepared, wheelhouse, short_tmp):
    """docs/ansible.md's recipe on a node whose virtualenv lost a package: it installs it again from the copied
    wheelhouse (the nodes have no index), and leaves the node that has everything as it is."""
    from fdl.cluster.nodes import pinned_packages

    n1, n2 = testbed.host("n1"), testbed.host("n2")
    venv = n2.home / ".flodl" / "execution-node" / "venv"
    n2.run(f"{venv}/bin/python -m pip uninstall --yes --quiet ansible-runner", timeout=120)
    assert not (venv / "bin" / "ansible-runner").exists()
    done = prepare_as_documented(kit, wheelhouse, short_tmp)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    counts = recap(done.stdout)
    assert counts["n1"]["changed"] == 0 and counts["n1"]["failed"] == 0, done.stdout[-3000:]
    assert counts["n2"]["changed"] >= 1 and counts["n2"]["failed"] == 0, done.stdout[-3000:]
    assert (venv / "bin" / "ansible-runner").is_file()
    for node in (n1, n2):
        assert f'"msg": "{ready_line(node, pinned_packages())}"' in done.stdout, done.stdout[-3000:]


def test_this_machine_has_no_route_to_the_workers_behind_the_nodes(testbed):
    for host in testbed.behind:
        route = subprocess.run(["ip", "route", "get", host.address], capture_output=True, text=True)
        assert route.returncode != 0, route.stdout  # "No route to host": not even the default route
        assert testbed.nodes[0].run(f"ssh -o BatchMode=yes {host.user}@{host.address} id -un").stdout.strip() \
            == host.user  # from a node, with its own ssh setup


def test_a_probe_through_two_nodes_reports_every_worker(kit, prepared, short_tmp, testbed_home):
    project = kit.project(short_tmp / "proj", workers(kit), execution_nodes=node_entries(kit.bed),
                          ssh={"known_hosts": str(kit.bed.known_hosts), "identity": str(kit.bed.key)})
    done, doc = probe(project, testbed_home)
    assert done.returncode == 0, done.stderr + done.stdout
    assert doc["ok"] is True
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2", "b1", "b2", "b3", "b4"]  # one report, roster order
    for host, checks in by_host(doc).items():
        assert "ssh" not in checks, (host, checks.get("ssh"))
        assert checks["gpu"]["status"] == "ok" and checks["gpu"]["data"]["devices"][0]["name"] == "H100", host
        assert checks["data"]["data"]["path"] == str(kit.data)  # each worker's env: and data_path reached it
    assert {c["name"]: c["status"] for c in doc["cluster"]}["nccl_match"] == "ok"
    # each worker behind a node was driven from the node its via: names: its logins came from there
    for i, host in enumerate(kit.bed.behind):
        node = kit.bed.host(f"n{1 + i % 2}")
        log = (host.sshd_dir / "sshd.log").read_text()
        assert f"Accepted publickey for {host.user} from {node.inner_address} " in log, (host.name, log[-2000:])
    human = run_fdl("@cluster", "probe", cwd=project, env=testbed_home, timeout=PROBE_TIMEOUT)
    assert human.returncode == 0, human.stderr
    assert "b3: ready:" in human.stdout


@pytest.mark.parametrize("moment", ["as_its_job_starts", "while_its_workers_are_inside_the_probe"])
def test_a_node_killed_mid_run_leaves_its_workers_unreachable_through_it(kit, prepared, short_tmp, testbed_home,
                                                                         moment):
    """n2 dies at two moments of its job: as soon as its ansible-playbook runs, and once both its workers are inside
    the probe module (the role's argument validation, which runs on the node itself, already passed for them: the
    moment of issue 40's CI failure, where they came out "ok" without a report). The workers behind n2 wait for the
    test before their Python starts, so n2's job cannot end before it dies, however loaded the machine."""
    bed = kit.bed
    b2, b4 = bed.host("b2"), bed.host("b4")
    slow = bed.shared / f"slowpython-{moment}"
    release = bed.shared / f"released-{moment}"
    release.unlink(missing_ok=True)
    slow.write_text(f"#!/bin/sh\ni=0\nwhile [ ! -e {release} ] && [ $i -lt {PROBE_TIMEOUT * 10} ]; do\n"
                    f"  sleep 0.1; i=$((i + 1))\ndone\nexec /usr/bin/python3 \"$@\"\n")
    slow.chmod(0o755)
    entries = workers(kit)
    for entry in entries:
        if entry.get("via") == "n2":
            entry["python"] = str(slow)
    project = kit.project(short_tmp / "proj", entries, execution_nodes=node_entries(bed),
                          ssh={"known_hosts": str(bed.known_hosts), "identity": str(bed.key)})
    n2 = bed.host("n2")
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "@cluster", "probe", "--json"], cwd=project,
                            env=fdl_env(testbed_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + PROBE_TIMEOUT

        def ready() -> bool:
            if moment == "as_its_job_starts":
                return _running(n2, "ansible-playbook")
            return _running(b2, slow.name) and _running(b4, slow.name)

        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"n2's job never reached the moment {moment}"
            time.sleep(0.1)
        n2.link_down()  # power gone: nothing leaves n2 any more...
        for pid in n2.user_pids():  # ...and nothing runs there
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate(timeout=PROBE_TIMEOUT)
    finally:
        release.write_text("")  # what still waits on b2 and b4 goes on (and ends: its ssh from n2 is gone)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        n2.link_up()
    assert proc.returncode == 1, err
    doc = json.loads(out)  # one JSON document, every worker in it
    assert doc["ok"] is False
    checks = by_host(doc)
    assert list(checks) == ["h1", "h2", "b1", "b2", "b3", "b4"]
    for name in ("b2", "b4"):  # behind n2
        assert set(checks[name]) == {"ssh"}, checks[name]
        message = checks[name]["ssh"]["message"]
        assert message.startswith(f"{name} ({bed.host(name).user}@{bed.host(name).address}) is unreachable through "
                                  f"n2: "), message
        assert checks[name]["ssh"]["data"]["via"] == "n2"
        assert "check execution node n2" in checks[name]["ssh"]["hint"]
    for name in ("h1", "h2", "b1", "b3"):  # the rest of the report stands
        assert "ssh" not in checks[name] and checks[name]["gpu"]["status"] == "ok", (name, checks[name])


def _running(host, program: str) -> bool:
    for pid in host.user_pids():
        try:
            if program in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return True
        except OSError:
            pass
    return False


# --------------------------------------------------------------------------- a run across a direct and a via worker


def test_a_mixed_cluster_trains_and_the_via_workers_session_goes_through_its_node(kit, prepared, short_tmp,
                                                                                   testbed_home):
    from tests.integration.launch.helpers import (
        checksums,
        free_port,
        run_processes,
        torch_python,
        train_script,
        write_project,
    )

    bed = kit.bed
    h1, h2, n1 = bed.host("h1"), bed.host("h2"), bed.host("n1")
    torchpy = torch_python(bed.shared / "py")
    root = short_tmp / "train"
    train_script(root, torchpy)
    gloo = {"GLOO_SOCKET_IFNAME": "eth0"}
    doc = bed.cluster([h1.worker(local_devices="cpu:1", env=gloo),
                       h2.worker(local_devices="cpu:1", env=gloo, via="n1")], nodes=[n1.execution_node()])
    port = free_port(bed.gateway)
    doc["cluster"]["controller"] = {"host": bed.gateway, "port": port, "bind": bed.gateway}
    project = write_project(root, {"train": {"cluster": True, "bin": "train.py", "args": ["--steps", "5"]}}, doc)
    keys = h2.home / ".ssh" / "authorized_keys"
    original = keys.read_text()
    keys.write_text(f'from="{n1.address}" {original}')  # h2 takes ssh from its node only
    try:
        refused = subprocess.run([*h2.ssh_argv(), "true"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 255  # this machine itself cannot log in to h2
        done = run_fdl("@cluster", "train", cwd=project, env=testbed_home, timeout=300)
    finally:
        keys.write_text(original)
    assert done.returncode == 0, done.stderr + done.stdout
    ranks = checksums(done.stdout)
    assert sorted(ranks) == [0, 1] and [ranks[i]["host"] for i in (0, 1)] == ["h1", "h2"]
    assert len({r["sum"] for r in ranks.values()}) == 1 and {r["size"] for r in ranks.values()} == {2}
    assert "run done: 2 rank(s) on 2 host(s) exited 0" in done.stderr
    staged = list((h2.home / ".flodl" / "launch" / "bin" / "train").glob("train.py"))
    assert staged, "the binary never reached h2"  # through the node's job stream, then rsync from the node
    assert not run_processes(h2) and not run_processes(h1)


def test_ctrl_c_on_a_mixed_run_leaves_nothing_on_the_worker_behind_the_node(kit, prepared, short_tmp,
                                                                            testbed_home):
    from tests.integration.launch.helpers import free_port, run_processes, torch_python, train_script, write_project

    bed = kit.bed
    h1, h2, n1 = bed.host("h1"), bed.host("h2"), bed.host("n1")
    root = short_tmp / "train"
    train_script(root, torch_python(bed.shared / "py"))
    gloo = {"GLOO_SOCKET_IFNAME": "eth0"}
    doc = bed.cluster([h1.worker(local_devices="cpu:1", env=gloo),
                       h2.worker(local_devices="cpu:1", env=gloo, via="n1")], nodes=[n1.execution_node()])
    doc["cluster"]["controller"] = {"host": bed.gateway, "port": free_port(bed.gateway), "bind": bed.gateway}
    project = write_project(root, {"train": {"cluster": True, "bin": "train.py",
                                             "args": ["--steps", "300", "--pause", "1"]}}, doc)
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "@cluster", "train"], cwd=project,
                            env=fdl_env(testbed_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not all(any("train.py" in p for p in run_processes(h)) for h in (h1, h2)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.3)
        time.sleep(2)
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C at the terminal delivers to the launcher
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert "every rank was stopped" in err
    assert not run_processes(h2) and not run_processes(h1)
    assert not [p for p in n1.user_pids() if _running_pid(p, "ansible-runner")]  # the node's worker is gone too


def _running_pid(pid: int, program: str) -> bool:
    try:
        return program in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
