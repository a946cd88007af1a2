"""The supported platforms, end to end (docs/ansible.md, "Supported platforms").

Controllers: for each combination of Python and ansible-core line (tests/platforms.py), fdl installed
from its wheel into a venv of that Python runs a smoke set: `fdl --version`, `fdl probe --json` on the
fake NVML, `fdl @cluster probe` over two testbed hosts, the inventory plugin through `ansible-inventory`,
and a launcher run of two CPU ranks (plain shell ranks, one per host). The default run covers the oldest
and the newest combination; `scripts/test.sh --matrix` (FDL_MATRIX=all) every one.

Targets: a worker whose `python:` is a Python 3.8 passes the probe and a launcher run (the dispatch
module stages it, the rank supervisor runs under 3.8); with ansible-core 2.20 or later, which no longer
runs modules on 3.8, the probe reports that host as failed and names the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_fdl
from tests.integration.launch.helpers import free_port
from tests.platforms import (
    NEWEST,
    build_wheel,
    installed_version,
    matrix_venv,
    portable_python,
    selected_combos,
)

pytestmark = [pytest.mark.testbed(hosts=2), pytest.mark.slow]

RANK = "#!/bin/sh\necho \"rank $RANK of $WORLD_SIZE on $(id -un) local $LOCAL_RANK master $MASTER_ADDR\"\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def clean_env(venv: Path | None, extra: dict) -> dict:
    """The environment of a command run from a matrix venv: nothing of this checkout or the suite's venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FDL_ENV", "FDL_DEBUG") and not k.startswith("ANSIBLE_")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


def run(venv: Path, argv: list[str], cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=clean_env(venv, env),
                          capture_output=True, text=True, timeout=timeout)


def launch_project(kit, root: Path, workers: list[dict]) -> Path:
    """A project whose `train` runs a shell rank on every worker (cpu:1 each) under a launcher."""
    kit.project(root, workers)
    (root / "rank.sh").write_text(RANK)
    (root / "rank.sh").chmod(0o755)
    (root / "fdl.yml").write_text(yaml.safe_dump({"commands": {"train": {"cluster": True, "bin": "rank.sh"}}}))
    doc = yaml.safe_load((root / "fdl.cluster.yml").read_text())
    bed = kit.bed
    doc["cluster"]["controller"] = {"host": bed.gateway, "port": free_port(bed.gateway), "bind": bed.gateway}
    (root / "fdl.cluster.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


def ranks_of(stdout: str) -> set[tuple[str, str]]:
    """(rank, user) of every rank line the launcher streamed back."""
    found = set()
    for line in stdout.splitlines():
        words = line.split("] ", 1)[-1].split()
        if words[:1] == ["rank"] and len(words) >= 6:
            found.add((words[1], words[5]))
    return found


def assert_probe_green(done: subprocess.CompletedProcess, hosts: list[str]) -> dict:
    assert done.returncode == 0, done.stderr + done.stdout
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and [h["host"] for h in doc["hosts"]] == hosts
    for host in doc["hosts"]:
        gpu = next(c for c in host["checks"] if c["name"] == "gpu")
        assert gpu["status"] == "ok" and gpu["data"]["devices"][0]["name"] == "H100", (host["host"], gpu)
    return doc


@pytest.mark.parametrize("combo", selected_combos(), ids=lambda c: c.id)
def test_controller_combination(combo, wheel, kit, fake_nvml, short_tmp, testbed_home):
    venv = matrix_venv(combo, wheel)
    core = installed_version(venv, "ansible-core")
    assert core.startswith(combo.ansible + "."), f"{combo.id}: ansible-core {core} installed"
    if NEWEST[combo.python] == combo.ansible:  # installed without constraints: what pip picks for this Python
        assert core.startswith(NEWEST[combo.python] + "."), f"pip chose ansible-core {core} on {combo.python}"
    assert installed_version(venv, "ansible-runner").startswith("2.4.")

    version = run(venv, ["fdl", "--version"], short_tmp, testbed_home)
    assert version.returncode == 0 and version.stdout.strip() == f"fdl {installed_version(venv, 'fdl')}", version
    where = run(venv, ["python", "-c", "import fdl, sys; print(fdl.__file__); print(sys.version_info[:2])"],
                short_tmp, testbed_home)
    assert where.stdout.startswith(str(venv)), where.stdout  # the wheel's fdl, not this checkout's
    assert where.stdout.splitlines()[1] == str(tuple(map(int, combo.python.split(".")))), where.stdout

    local = run(venv, ["fdl", "probe", "--json", "--skip-mount"], short_tmp,
                {**testbed_home, **fake_nvml.env("H100:9.0:80G")})
    gpu = next(c for c in json.loads(local.stdout)["checks"] if c["name"] == "gpu")
    assert gpu["status"] == "ok" and gpu["data"]["devices"][0]["name"] == "H100", local.stdout + local.stderr

    project = kit.project(short_tmp / "proj")
    assert_probe_green(run(venv, ["fdl", "@cluster", "probe", "--json"], project, testbed_home), ["h1", "h2"])

    collections = run(venv, ["python", "-m", "fdl.resources"], project, testbed_home).stdout.strip()
    assert collections.startswith(str(venv))
    cfg = run(venv, ["python", "-c", "from fdl.resources import ansible_cfg; print(ansible_cfg())"], project,
              testbed_home).stdout.strip()
    ansible_env = {**testbed_home, "ANSIBLE_CONFIG": cfg, "ANSIBLE_COLLECTIONS_PATH": collections}
    (project / "hosts.fdl.yml").write_text("plugin: flodl.fdl.cluster\n")  # read through Ansible's auto plugin
    listed = run(venv, ["ansible-inventory", "-i", "hosts.fdl.yml", "--list"], project, ansible_env)
    assert listed.returncode == 0, listed.stderr
    assert "__ansible_unsafe" not in listed.stdout and "[DEPRECATION WARNING]" not in listed.stderr, listed.stderr
    inventory = json.loads(listed.stdout)
    assert sorted(inventory["fdl_workers"]["hosts"]) == ["h1", "h2"]
    h2 = kit.bed.host("h2")
    assert inventory["_meta"]["hostvars"]["h2"]["ansible_host"] == h2.address
    assert inventory["_meta"]["hostvars"]["h2"]["ansible_user"] == h2.user

    # the shipped playbook straight from ansible-playbook, as Ansible users run it: green, nothing deprecated
    played = run(venv, ["ansible-playbook", "-i", "hosts.fdl.yml", "flodl.fdl.probe"], project, ansible_env)
    assert played.returncode == 0, played.stdout[-3000:] + played.stderr
    assert "DEPRECATION WARNING" not in played.stdout + played.stderr, played.stdout + played.stderr
    assert "[WARNING]" not in played.stdout + played.stderr, played.stdout + played.stderr

    launch = launch_project(kit, short_tmp / "launch", kit.workers(h1={"local_devices": "cpu:1"},
                                                                    h2={"local_devices": "cpu:1"}))
    done = run(venv, ["fdl", "@cluster", "train"], launch, testbed_home)
    assert done.returncode == 0, done.stderr + done.stdout
    assert ranks_of(done.stdout) == {("0", kit.bed.hosts[0].user), ("1", h2.user)}, done.stdout
    assert "run done: 2 rank(s) on 2 host(s) exited 0" in done.stderr


@pytest.fixture(scope="module")
def old_python(kit) -> Path:
    """A Python 3.8 the testbed's users can run (a copy of the interpreter behind a wrapper that logs each
    call to the shared storage, so the test sees what ran under it)."""
    wrapper = portable_python("3.8", kit.bed.shared / "py38")
    log = kit.bed.storage / "py38-calls.log"
    logged = wrapper.with_name("python3.8-logged")
    logged.write_text(f"#!/bin/sh\necho \"$(id -un) $*\" >> {log}\nexec {wrapper} \"$@\"\n")
    logged.chmod(0o755)
    return logged


def calls(kit) -> list[str]:
    log = kit.bed.storage / "py38-calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_python_3_8_target_passes_the_probe_and_a_launcher_run(kit, old_python, short_tmp, testbed_home):
    """This suite's controller (ansible-core 2.19): h2 runs everything under Python 3.8."""
    h2 = kit.bed.host("h2")
    project = kit.project(short_tmp / "proj", kit.workers(h2={"python": str(old_python)}))
    before = len(calls(kit))
    probe = run_fdl("@cluster", "probe", "--json", cwd=project, env=testbed_home, timeout=180)
    assert_probe_green(probe, ["h1", "h2"])
    probed = calls(kit)[before:]
    assert probed and all(line.startswith(h2.user + " ") for line in probed), probed  # h2's modules, on 3.8

    launch = launch_project(kit, short_tmp / "launch", kit.workers(h1={"local_devices": "cpu:1"},
                                                                    h2={"local_devices": "cpu:1",
                                                                        "python": str(old_python)}))
    before = len(calls(kit))
    done = run_fdl("@cluster", "train", cwd=launch, env=testbed_home, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    assert ranks_of(done.stdout) == {("0", kit.bed.hosts[0].user), ("1", h2.user)}, done.stdout
    launched = calls(kit)[before:]
    assert any("supervisor.py" in line for line in launched), launched  # the rank supervisor ran under 3.8
    assert len(launched) >= 2, launched  # and the dispatch module before it


def test_a_python_3_8_target_under_a_newer_ansible_core_is_named_as_the_failure(
        wheel, kit, old_python, short_tmp, testbed_home):
    """ansible-core 2.20+ runs modules on Python 3.9 or newer: the other host still passes, h2 fails."""
    combo = next(c for c in selected_combos() if c.ansible != "2.19")
    venv = matrix_venv(combo, wheel)
    project = kit.project(short_tmp / "proj", kit.workers(h2={"python": str(old_python)}))
    done = run(venv, ["fdl", "@cluster", "probe", "--json"], project, testbed_home)
    assert done.returncode == 1, done.stderr + done.stdout
    hosts = {h["host"]: h for h in json.loads(done.stdout)["hosts"]}
    assert all(c["status"] != "error" for c in hosts["h1"]["checks"])
    errors = [c for c in hosts["h2"]["checks"] if c["status"] == "error"]
    assert errors and "3.8" in json.dumps(errors), hosts["h2"]
