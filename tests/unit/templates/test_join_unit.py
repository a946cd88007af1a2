"""The systemd unit for `fdl join --persist`: rendered by Ansible's template module, checked by systemd itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TEMPLATE = REPO / "roles/fdl_join_worker/templates/fdl-join.service.j2"
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Render the join unit the way a role does
      ansible.builtin.template:
        src: {src}
        dest: {dest}
        mode: "0644"
"""

POWEROFF = ('+/bin/sh -c \'if [ "$$SERVICE_RESULT" = exit-code ] && [ "$$EXIT_STATUS" = 2 ]; then exec systemctl '
            '--no-block poweroff; fi\'')


def render(tmp_path: Path, **variables) -> dict[str, list[str]]:
    """Render with ansible-playbook; returns {section: [Key=Value lines]} and leaves the file at tmp/unit."""
    dest = tmp_path / "fdl-join.service"
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(src=TEMPLATE, dest=dest))
    extra = ["-e", json.dumps(variables)] if variables else []
    bindir = Path(sys.executable).parent
    done = subprocess.run([str(bindir / "ansible-playbook"), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}", *extra, str(play)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    sections: dict[str, list[str]] = {}
    current = ""
    for line in dest.read_text().splitlines():
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
        elif line and not line.startswith("#"):
            sections[current].append(line)
    return sections


def keys(sections: dict[str, list[str]]) -> dict[str, str]:
    return {line.split("=", 1)[0]: line.split("=", 1)[1] for lines in sections.values() for line in lines}


def test_the_persist_recipe_lines(tmp_path):
    unit = keys(render(tmp_path, fdl_join_exec="/usr/local/bin/fdl", fdl_join_user="daemon"))
    assert unit["Restart"] == "always"
    assert unit["RestartPreventExitStatus"] == "2"
    # exit 2 alone powers off: FailureAction= would fire on a restarted crash too (systemd < 254)
    assert "FailureAction" not in unit
    assert unit["ExecStopPost"] == POWEROFF
    assert unit["After"] == "network-online.target" and unit["Wants"] == "network-online.target"
    assert unit["ExecStart"].split() == ["/usr/local/bin/fdl", "join", "--persist"]
    assert "SuccessExitStatus" not in unit  # fdl dies of the SIGTERM a stop sends: clean to systemd as it is
    assert unit["StartLimitIntervalSec"] == "0"  # nor may a crash loop
    for breaks_the_job in ("NoNewPrivileges", "PrivateDevices", "ProtectHome", "MemoryDenyWriteExecute",
                           "RestrictAddressFamilies", "RestrictSUIDSGID"):
        assert breaks_the_job not in unit


def test_strict_mode_and_no_poweroff(tmp_path):
    unit = keys(render(tmp_path, fdl_join_strict=True, fdl_join_poweroff=False, fdl_join_args="--devices cpu:2"))
    assert "FailureAction" not in unit and "ExecStopPost" not in unit
    assert unit["RestrictAddressFamilies"] == "AF_INET AF_INET6 AF_UNIX AF_NETLINK"
    assert unit["ExecStart"].endswith("join --persist --devices cpu:2")


def test_systemd_accepts_the_unit(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze (package systemd) is needed to verify the unit")
    render(tmp_path, fdl_join_exec="/bin/true", fdl_join_user="daemon", fdl_join_group="daemon")
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "fdl-join.service")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "fdl-join.service" not in done.stderr, done.stderr  # no warning about any of its lines


def test_every_directive_is_explained_in_the_template_and_in_the_docs(tmp_path):
    lines = TEMPLATE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and line[:1].isupper():
            above = lines[max(0, i - 3):i]
            assert any(prev.startswith("#") for prev in above), f"no comment near {line!r}"
    docs = (REPO / "docs" / "join.md").read_text()
    for key in keys(render(tmp_path, fdl_join_strict=True)):
        assert f"`{key}" in docs, f"docs/join.md does not explain {key}="


def test_working_directory_outside_var_lib_is_not_a_state_directory(tmp_path):
    default = keys(render(tmp_path))
    assert default["WorkingDirectory"] == "/var/lib/fdl-join" and default["StateDirectory"] == "fdl-join"
    moved = keys(render(tmp_path, fdl_join_workdir="/srv/worker", fdl_join_args=""))
    assert moved["WorkingDirectory"] == "/srv/worker" and "StateDirectory" not in moved
    assert moved["ExecStart"] == "/usr/local/bin/fdl join --persist"  # no trailing blank without extra args
