"""The probe timer's command line (fdl_join_worker's vars): the devices a worker offers decide how it is judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

ROLE = REPO / "roles/fdl_join_worker"
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the role's defaults and vars the way the role does
      ansible.builtin.include_vars: {{file: "{defaults}"}}
    - name: Read the private vars
      ansible.builtin.include_vars: {{file: "{vars}"}}
    - name: Print the probe's argv
      ansible.builtin.debug:
        msg: "ARGV={{{{ _fdl_join_worker_probe_argv | to_json }}}}"
"""


def argv(tmp_path: Path, devices: str) -> list[str]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(defaults=ROLE / "defaults/main.yml", vars=ROLE / "vars/main.yml"))
    bindir = Path(sys.executable).parent
    done = subprocess.run([str(bindir / "ansible-playbook"), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}",
                           "-e", json.dumps({"fdl_join_worker_devices": devices}), str(play)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "ARGV=" in x)
    return json.loads(line.split("ARGV=", 1)[1].rstrip('"').replace('\\"', '"'))


@pytest.mark.parametrize(("devices", "before", "after"), [
    ("", [], []),
    ("0,1", ["--gpus", "0,1"], []),
    ("cpu:2", [], ["--devices", "cpu:2"]),
])
def test_the_timer_judges_the_host_by_what_it_offers(tmp_path, devices, before, after):
    got = argv(tmp_path, devices)
    probe = got.index("probe")
    assert got[1:probe] == before
    assert got[probe + 1:probe + 1 + len(after)] == after
    assert "--textfile" in got
