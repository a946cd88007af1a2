"""The testbed itself: hosts exist, answer over real SSH as their own users, and go away."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.testbed import Testbed
from tests.testbed.plugin import require_testbed

pytestmark = [pytest.mark.testbed(hosts=3), pytest.mark.slow]


def test_each_host_answers_as_its_own_user(testbed: Testbed):
    seen = set()
    for host in testbed.hosts:
        out = host.ssh("id -un; echo $HOME; cat /proc/net/fib_trie | grep -c " + host.address).stdout.split()
        assert out[0] == host.user
        assert out[1] == str(host.home)
        seen.add(out[0])
    assert len(seen) == 3


def test_run_executes_inside_the_namespace(testbed: Testbed):
    h2 = testbed.hosts[1]
    out = h2.run("ip -o -4 addr show dev eth0").stdout
    assert h2.address in out
    assert h2.run("id -un").stdout.strip() == h2.user


def test_a_key_no_host_trusts_is_refused(testbed: Testbed):
    other = testbed.new_key("stranger")
    h1 = testbed.hosts[0]
    proc = subprocess.run([*h1.ssh_argv(key=other), "true"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255
    assert "Permission denied" in proc.stderr


def test_link_down_cuts_the_host_off(testbed: Testbed):
    h3 = testbed.hosts[2]
    h3.link_down()
    try:
        proc = subprocess.run([*h3.ssh_argv(extra=("-o", "ConnectTimeout=1")), "true"], capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 255
    finally:
        h3.link_up()
    assert h3.ssh("true").returncode == 0


def test_teardown_removes_everything_even_after_a_crash(tmp_path):
    """A testbed abandoned mid-run (no teardown) is cleaned up by the next one, which then tears down fully."""
    require_testbed()
    crashed = Testbed(2, prefix="fdltx", net="10.231.2")
    crashed._lock()
    crashed._build()  # ... and the process "dies": no down()
    crashed._unlock()
    assert "fdltx-h1" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with Testbed.up(1, prefix="fdltx", net="10.231.2") as bed:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert "fdltx-h2" not in names
        assert bed.hosts[0].ssh("true").returncode == 0
    for host in crashed.hosts:  # the abandoned sshd processes were killed by the clean-up: reap them
        host.sshd.wait(5)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [n for n in names if n.startswith("fdltx-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "fdltx" not in links
    users = Path("/etc/passwd").read_text()
    assert "fdltx" not in users
