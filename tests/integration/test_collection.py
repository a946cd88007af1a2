"""The flodl.fdl collection the way Ansible users get it: the built tarball installed with ansible-galaxy, no
ansible.cfg, everything by fully qualified name, on a real testbed host over real SSH.

- A new user: a fresh virtual environment holding ansible-core and nothing else (no fdl: it is not on the
  package index), the tarball in an empty collections path, an empty directory holding an fdl project and a
  hosts.fdl.yml: ansible-doc lists every role and module, ansible-inventory shows the workers with composed
  variables, and a play using the probe role probes a testbed host over SSH and this machine, a worker at
  127.0.0.1, over the local connection.
- Every ansible-core line that runs on Python 3.11 (2.17, 2.18, 2.19), each in its own virtual environment
  holding only ansible-core: install, `ansible-inventory --graph` through the auto plugin, and the probe role
  converging on both hosts.

The tarball is what `scripts/build-collection` builds (tests/conftest.py's collection_tarball), installed with
`ansible-galaxy collection install`: docs/ansible.md's recipes for both are run here.

The ansible-core virtual environments are cached outside the repository, in $FDL_TEST_CACHE or
~/.cache/fdl-test/, one per ansible-core line and Python, so only the first run needs the package index.
The ecosystem's own checks of the same tarball (ansible-test sanity, ansible-lint, galaxy-importer) are
tests/integration/test_ecosystem.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml

from fdl.collection import pynvml_file
from tests.conftest import REPO, install_collection, real_cache

pytestmark = [pytest.mark.testbed(hosts=1), pytest.mark.slow]

ROLES = ("fdl_dispatch", "fdl_execution_node", "fdl_join_door", "fdl_join_worker", "fdl_nccl", "fdl_prebuild",
         "fdl_probe", "fdl_reap")
MODULES = ("fdl_authorized_key", "fdl_dispatch_stage", "fdl_join_door_plan", "fdl_nccl_install", "fdl_probe",
           "fdl_reap")
CORE_LINES = ("2.17", "2.18", "2.19")
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
SOURCE = """\
plugin: flodl.fdl.cluster
compose:
  fdl_reach: ansible_host ~ ':' ~ ansible_port
  fdl_probe_skip_mount: "true"
keyed_groups:
  - key: ansible_user
    prefix: login
"""
PLAY = """\
- name: Probe the workers with the collection's role
  hosts: fdl_workers
  gather_facts: false
  roles:
    - role: flodl.fdl.fdl_probe
      vars:
        fdl_probe_fail_on_error: false
        fdl_probe_devices: cpu:1
  post_tasks:
    - name: Show the report
      ansible.builtin.debug:
        msg: "REPORT {{ fdl_probe_report.report | to_json }}"
"""
LOCAL_WORKER = {"host": "here", "address": "127.0.0.1", "local_devices": "cpu:1"}  # this machine


def cache_root() -> Path:
    root = Path(os.environ.get("FDL_TEST_CACHE") or real_cache() / "fdl-test")
    root.mkdir(parents=True, exist_ok=True)
    return root


def core_venv(line: str) -> Path:
    """A virtual environment holding ansible-core `line` (cached); returns its python."""
    venv = cache_root() / f"ansible-core-{line}-py{PY}"
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    major, minor = (int(part) for part in line.split("."))
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", f"ansible-core>={line},<{major}.{minor + 1}"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"installing ansible-core {line}: {done.stderr[-3000:]}"
    (venv / ".complete").write_text(line + "\n")
    return python


def user_env(home: Path, bin_dir: Path, pythonpath: Path, **extra: str) -> dict:
    """A user's shell: a fresh home, no ANSIBLE_* setting but one (below), the venv's tools first."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "FDL_", "XDG_"))}
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(pythonpath),
               NO_COLOR="1", **extra)
    # The one exception to "no ANSIBLE_* setting": the test venv holds fdl as an editable install, which puts this
    # clone, and so its collection source, on sys.path; a user's Python has no clone there.
    env["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] = "False"
    return env


def project(path: Path, testbed) -> Path:
    """An fdl project with two workers, the testbed's first host and this machine (127.0.0.1), and its
    hosts.fdl.yml."""
    path.mkdir(parents=True)
    (path / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    workers = [*testbed.workers()[:1], LOCAL_WORKER]
    (path / "fdl.cluster.yml").write_text(yaml.safe_dump(testbed.cluster(workers), sort_keys=False))
    (path / "hosts.fdl.yml").write_text(SOURCE)
    (path / "play.yml").write_text(PLAY)
    return path


def run(argv: list[str], cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def probed_reports(play: subprocess.CompletedProcess, *hosts: str) -> dict:
    """{host: report} from the play's REPORT lines; each host's verdict line was printed."""
    out = play.stdout + play.stderr
    assert play.returncode == 0, out[-4000:]
    reports = {}
    for line in play.stdout.splitlines():
        if '"msg": "REPORT ' in line:
            report = json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("REPORT "):])
            reports[report["host"]] = report
    assert sorted(reports) == sorted(hosts), out[-4000:]
    for host in hosts:  # the role's one-line verdict per host
        assert re.search(rf'"msg": "{re.escape(host)}: (ready|NOT READY)', play.stdout), play.stdout[-4000:]
    recap = play.stdout[play.stdout.index("PLAY RECAP"):]
    assert "unreachable=0" in recap and "unreachable=1" not in recap, recap
    return reports


def assert_ansible_core_alone(bin_dir: Path, cwd: Path, env: dict) -> None:
    """The environment holds ansible-core and no fdl (the plugin reads the project with the collection's
    own reader)."""
    done = run([str(bin_dir / "python"), "-c", "import fdl"], cwd, env)
    assert done.returncode != 0 and "No module named 'fdl'" in done.stderr, done.stdout + done.stderr
    listed = run([str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"], cwd, env).stdout
    assert "ansible-core==" in listed and "fdl==" not in listed.lower(), listed


def assert_local_worker(bin_dir: Path, cwd: Path, env: dict) -> None:
    """The worker at 127.0.0.1 is this machine: the plugin gives it the local connection, as fdl does."""
    listed = run([str(bin_dir / "ansible-inventory"), "-i", "hosts.fdl.yml", "--list"], cwd, env)
    assert listed.returncode == 0, listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert hostvars["here"]["ansible_connection"] == "local", hostvars["here"]
    assert [name for name, values in hostvars.items() if "ansible_connection" in values] == ["here"], hostvars


def test_a_new_user_installs_the_tarball_and_probes_a_host(testbed, short_tmp, collection_tarball):
    host = testbed.hosts[0]
    home = short_tmp / "home"
    python = core_venv("2.19")  # a virtual environment holding ansible-core alone
    bin_dir = python.parent
    env = user_env(home, bin_dir, Path(os.devnull))
    # the default collections path of a fresh home: empty until the tarball goes in
    collections = home / ".ansible" / "collections"
    assert not collections.exists()
    install_collection(collection_tarball, collections, python=str(python))
    assert sorted(p.name for p in (collections / "ansible_collections").iterdir()) == ["flodl"]
    # self-contained: the check library, the supervisor and pynvml (with its licence) are real files in it
    utils = collections / "ansible_collections" / "flodl" / "fdl" / "plugins" / "module_utils"
    host_side = REPO / "fdl" / "hostside"  # module_utils is fdl/hostside/, file for file
    for name in ("checks/probe.py", "supervisor.py", "hoststage.py", "fsio.py", "farm/doors.py",
                 "libtorch/resolve.py"):
        assert (utils / name).read_bytes() == (host_side / name).read_bytes(), name
    packed: dict = {}
    exec((utils / "pynvml_packed.py").read_text(), packed)  # the packed pynvml is the environment's, unchanged
    assert zlib.decompress(base64.b64decode("".join(packed["_PACKED"]))) == pynvml_file().read_bytes()
    assert "NVIDIA Corporation" in (utils / "pynvml.LICENSE.txt").read_text()
    assert not any(path.is_symlink() for path in utils.rglob("*"))
    work = project(short_tmp / "work", testbed)
    assert not (work / "ansible.cfg").exists() and not (home / ".ansible.cfg").exists()
    assert_ansible_core_alone(bin_dir, work, env)

    roles = run([str(bin_dir / "ansible-doc"), "-t", "role", "-l", "flodl.fdl"], work, env)
    assert roles.returncode == 0, roles.stderr
    for role in ROLES:
        assert f"flodl.fdl.{role}" in roles.stdout, roles.stdout
    modules = run([str(bin_dir / "ansible-doc"), "-t", "module", "-l", "flodl.fdl"], work, env)
    assert modules.returncode == 0, modules.stderr
    for module in MODULES:
        assert f"flodl.fdl.{module}" in modules.stdout, modules.stdout

    listed = run([str(bin_dir / "ansible-inventory"), "-i", "hosts.fdl.yml", "--list"], work, env)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["fdl_workers"]["hosts"] == [host.name, "here"]
    hostvars = data["_meta"]["hostvars"][host.name]
    assert hostvars["fdl_reach"] == f"{host.address}:{host.port}"  # composed from the plugin's own variables
    assert hostvars["fdl_probe_skip_mount"] is True
    assert data[f"login_{host.user}"]["hosts"] == [host.name]  # keyed_groups

    assert_local_worker(bin_dir, work, env)
    play = run([str(bin_dir / "ansible-playbook"), "-i", "hosts.fdl.yml", "play.yml"], work, env)
    reports = probed_reports(play, host.name, "here")
    checks = {check["name"]: check for check in reports[host.name]["checks"]}
    # declared cpu:1, so the module judged a CPU host: nothing GPU-only counts, only what it lacks (a libtorch)
    assert checks["gpu"]["status"] == "skipped" and checks["gpu"]["data"]["cpu_host"] is True, checks["gpu"]
    assert [name for name, check in checks.items() if check["status"] == "error"] == ["libtorch"], checks
    assert "data" not in checks or checks["data"]["status"] == "skipped"  # the composed skip reached the role
    # the role's entry point validated its arguments first (the task name is shortened in the display)
    assert "TASK [flodl.fdl.fdl_probe : Validating arguments against arg spec" in play.stdout, play.stdout


@pytest.mark.parametrize("line", CORE_LINES)
def test_the_collection_under_each_ansible_core_line(line, testbed, short_tmp, collection_tarball):
    host = testbed.hosts[0]
    python = core_venv(line)
    bin_dir = python.parent
    version = run([str(bin_dir / "ansible"), "--version"], short_tmp,
                  user_env(short_tmp / "v", bin_dir, Path(os.devnull)))
    assert f"[core {line}." in version.stdout, version.stdout
    collections = install_collection(collection_tarball, short_tmp / "collections", python=str(python))
    env = user_env(short_tmp / "home", bin_dir, Path(os.devnull), ANSIBLE_COLLECTIONS_PATH=str(collections))
    work = project(short_tmp / "work", testbed)

    assert_ansible_core_alone(bin_dir, work, env)
    graph = run([str(bin_dir / "ansible-inventory"), "-i", "hosts.fdl.yml", "--graph"], work, env)
    assert graph.returncode == 0, graph.stderr
    assert "@fdl_workers:" in graph.stdout and f"|--{host.name}" in graph.stdout, graph.stdout
    assert "|--here" in graph.stdout, graph.stdout

    assert_local_worker(bin_dir, work, env)
    play = run([str(bin_dir / "ansible-playbook"), "-i", "hosts.fdl.yml", "play.yml"], work, env)
    probed_reports(play, host.name, "here")
