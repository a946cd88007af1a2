"""A clone used in place by an Ansible user: from the repository root, with the repository's ansible.cfg,
`ansible-playbook -i INVENTORY playbooks/probe.yml` finds the roles right there, and the flodl.fdl collection
their tasks call by FQCN (modules, module_utils: the clone's fdl package, and the inventory plugin) in the
clone's ansible_collections/, committed links to those directories: no build step and no other collection, on
a real testbed host over real SSH, and on this machine over the local connection."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fdl import collection
from tests.conftest import REPO

pytestmark = [pytest.mark.testbed(hosts=1), pytest.mark.slow]
BIN = Path(sys.executable).parent
MARK = " (from the clone)"


@pytest.fixture
def clone(short_tmp) -> Path:
    """A fresh clone of this checkout: its files (tracked, and new ones git does not ignore), nothing built.
    The verdict code is marked, so the output shows the module ran the clone's own fdl package."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    dest = short_tmp / "clone"
    for name in filter(None, files):
        if (REPO / name).is_symlink():  # the in-place collection's links, as git checks them out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(REPO / name), dest / name)
        elif (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    verdict = dest / "fdl" / "hostside" / "checks" / "verdict.py"
    verdict.write_text(verdict.read_text() + f"\n\n_verdict = verdict\n\n\ndef verdict(report):\n"
                                             f"    return _verdict(report) + {MARK!r}\n")
    return dest


def user_env(home: Path) -> dict:
    """An Ansible user's shell in the clone: Ansible on PATH, no ANSIBLE_* setting, a fresh home (no
    ~/.ansible/collections): the one flodl.fdl to find is the clone's (ansible.cfg's collections_path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "FDL_", "XDG_"))}
    home.mkdir(parents=True)
    # The suite's venv holds this checkout as an editable fdl, so its root is on sys.path, where Ansible would
    # also look for collections; a user's Python has no checkout there.
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", NO_COLOR="1",
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False")
    return env


def nothing_built(clone: Path) -> None:
    """The clone's ansible_collections/ holds its committed links and nothing else (no tree was assembled)."""
    found = []
    for root, dirs, files in os.walk(clone / "ansible_collections"):  # links are not followed
        found += [Path(root, name) for name in files + dirs if Path(root, name).is_symlink() or name in files]
    found = sorted(p.relative_to(clone).as_posix() for p in found)
    links = sorted(f"{collection.RELATIVE.as_posix()}/{path}" for path in collection.IN_PLACE)
    assert found == links, found


def playbook(clone: Path, env: dict, inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/probe.yml", *extra],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=300)


def verdicts(out: str) -> dict[str, str]:
    return dict(re.findall(r'"msg": "([\w.-]+): ((?:ready|NOT READY)[^"]*)"', out))


def test_a_static_inventory_probes_a_host_in_place(testbed, clone, short_tmp):
    host = testbed.hosts[0]
    inventory = short_tmp / "hosts.ini"
    inventory.write_text(f"[fdl_workers]\n{host.name} ansible_host={host.address} ansible_port={host.port} "
                         f"ansible_user={host.user} ansible_ssh_private_key_file={host.key} "
                         f"ansible_ssh_common_args='-o UserKnownHostsFile={testbed.known_hosts}'\n")
    env = user_env(short_tmp / "home")
    done = playbook(clone, env, inventory, "-e", "fdl_probe_skip_mount=true")
    out = done.stdout + done.stderr
    # a GPU-less host, probed over SSH: its verdict, then the host fails on it (fdl_probe_fail_on_error)
    assert done.returncode == 2, out[-4000:]
    said = verdicts(done.stdout)
    assert list(said) == [host.name], out[-4000:]
    assert said[host.name].startswith("NOT READY") and said[host.name].endswith(MARK), said
    assert "gpu: " in said[host.name] and "unreachable=0" in out
    assert "fdl_probe : Say whether the host is ready" in done.stdout
    nothing_built(clone)

    passed = playbook(clone, env, inventory, "-e", "fdl_probe_skip_mount=true", "-e", "fdl_probe_fail_on_error=false")
    assert passed.returncode == 0, (passed.stdout + passed.stderr)[-4000:]
    assert verdicts(passed.stdout)[host.name] == said[host.name]


def test_the_inventory_plugin_in_place_reaches_a_host_and_this_machine(testbed, clone, short_tmp):
    host = testbed.hosts[0]
    project = short_tmp / "project"
    project.mkdir()
    (project / "fdl.yml").write_text("commands:\n  test: {run: 'true'}\n")
    workers = [*testbed.workers()[:1], {"host": "here", "address": "127.0.0.1", "local_devices": "cpu:1"}]
    (project / "fdl.cluster.yml").write_text(yaml.safe_dump(testbed.cluster(workers), sort_keys=False))
    (project / "hosts.fdl.yml").write_text("plugin: flodl.fdl.cluster\n")  # the same file the collection reads
    env = user_env(short_tmp / "home")

    listed = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(project / "hosts.fdl.yml"), "--list"],
                            cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "[WARNING]" not in listed.stderr, listed.stderr
    hostvars = yaml.safe_load(listed.stdout)["_meta"]["hostvars"]
    assert hostvars["here"]["ansible_connection"] == "local"  # this machine, as fdl reaches it
    assert hostvars[host.name]["ansible_host"] == host.address and "ansible_connection" not in hostvars[host.name]

    done = playbook(clone, env, project / "hosts.fdl.yml", "-e", "fdl_probe_skip_mount=true",
                    "-e", "fdl_probe_fail_on_error=false")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    said = verdicts(done.stdout)
    assert sorted(said) == sorted([host.name, "here"]), out[-4000:]
    assert all(line.endswith(MARK) for line in said.values()), said
    recap = done.stdout[done.stdout.index("PLAY RECAP"):]
    assert re.search(r"here\s+: ok=\d+ .*unreachable=0", recap), recap
    nothing_built(clone)
