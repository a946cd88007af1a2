"""Hosts behind execution nodes: the inventory as each node sees it, ssh through ProxyJump, the job directory, and
one node's part of a run through a real ansible-runner worker (here on this machine, in place of ssh to a node:
the testbed tests, tests/integration/cluster/test_execution_nodes.py, run it over ssh)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from fdl.cluster import nodes
from fdl.cluster.connection import ansible_bin_dir
from fdl.cluster.events import FAILED, OK, PENDING, UNREACHABLE, Collector
from fdl.cluster.inventory import ClusterInventory, InventoryHost, inventory_from_file, local_vars
from fdl.cluster.ssh import node_ssh_argv, rsync_rsh, ssh_argv, ssh_options
from fdl.collection import RELATIVE
from tests.conftest import REPO

CLUSTER = """\
cluster:
  controller: {host: 10.0.0.1, port: 1400}
  ssh: {user: op, identity: keys/ctl, known_hosts: keys/known_hosts}
  execution_nodes:
    - {host: rack-a, address: 10.0.0.5}
    - {host: rack-b, address: 10.1.0.5, via: rack-a, identity: ~/.ssh/hop}
  workers:
    - {host: direct, address: 10.0.0.11}
    - {host: far, address: 192.168.7.11, via: rack-b, identity: ~/.ssh/workers}
    - {host: near, address: 10.0.0.12, via: rack-a}
"""


@pytest.fixture
def inventory(project, monkeypatch, short_tmp):
    monkeypatch.setenv("XDG_CACHE_HOME", str(short_tmp / "cache"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp / "run"))
    (short_tmp / "run").mkdir(mode=0o700)
    inv, _ = inventory_from_file(project("fdl.cluster.yml", CLUSTER))
    inv.root = project.root
    return inv


def test_nodes_are_hosts_of_their_own_group_and_via_hosts_carry_the_nodes_view(inventory):
    root = inventory.root
    assert inventory.groups["fdl_workers"] == ["direct", "far", "near"]  # the roster, nodes not among them
    assert inventory.groups["fdl_execution_nodes"] == ["rack-a", "rack-b"]
    assert inventory.groups["fdl_via_rack_a"] == ["near", "rack-b"] and inventory.groups["fdl_via_rack_b"] == ["far"]
    far = inventory.hosts["far"]
    # the variables Ansible uses on rack-b: its identity is a path there, no known_hosts file of this machine's
    assert far.vars["ansible_ssh_private_key_file"] == "~/.ssh/workers"
    assert "ansible_ssh_common_args" not in far.vars and far.vars["fdl_via"] == "rack-b"
    assert inventory.hosts["near"].vars.get("ansible_ssh_private_key_file") is None  # the node's own ssh setup
    # this machine's own ssh to them, end to end (the rank session): cluster.ssh's settings, paths here
    assert far.session == {"ansible_ssh_private_key_file": str(root / "keys" / "ctl"),
                           "ansible_ssh_common_args": f"-o UserKnownHostsFile={root / 'keys' / 'known_hosts'}"}
    assert far.via is inventory.hosts["rack-b"] and inventory.hosts["rack-b"].via is inventory.hosts["rack-a"]
    rack_a = inventory.hosts["rack-a"].vars
    assert rack_a["ansible_ssh_private_key_file"] == str(root / "keys" / "ctl") and rack_a["ansible_user"] == "op"
    assert inventory.hosts["rack-b"].vars["ansible_ssh_private_key_file"] == "~/.ssh/hop"  # a path on rack-a
    assert inventory.hosts["direct"].via is None and "fdl_via" not in inventory.hosts["direct"].vars


def test_a_run_splits_into_direct_hosts_and_each_nodes_first_hop(inventory):
    direct, by_node = nodes.split(inventory, ["direct", "far", "near", "rack-b", "rack-a"])
    assert direct == ["direct", "rack-a"]
    assert by_node == {"rack-b": ["far"], "rack-a": ["near", "rack-b"]}  # rack-b itself is prepared from rack-a


def test_a_via_hosts_session_rides_proxyjump_through_fdls_own_node_configuration(inventory):
    argv = ssh_argv(inventory.hosts["far"])
    config = Path(argv[argv.index("-F") + 1])
    assert argv[argv.index("-J") + 1] == "fdl-node-rack-b"
    assert argv[-1] == "op@192.168.7.11"
    assert argv[argv.index("-i") + 1] == str(inventory.root / "keys" / "ctl")  # this machine's key, not the node's
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    blocks = {}
    for block in config.read_text().split("Host ")[1:]:
        lines = [line.strip() for line in block.strip().splitlines()]
        blocks[lines[0]] = dict(line.split(" ", 1) for line in lines[1:])
    assert set(blocks) == {"fdl-node-rack-b", "fdl-node-rack-a"}
    b, a = blocks["fdl-node-rack-b"], blocks["fdl-node-rack-a"]
    assert b["HostName"] == "10.1.0.5" and b["ProxyJump"] == "fdl-node-rack-a" and b["User"] == "op"
    assert b["IdentityFile"] == str(inventory.root / "keys" / "ctl")  # end to end through rack-a: this machine's
    assert a["HostName"] == "10.0.0.5" and "ProxyJump" not in a and a["IdentitiesOnly"] == "yes"
    # the hop reads this file alone (ssh -J passes only -F on), so it carries every option of fdl's ssh
    options = dict(o.split("=", 1) for o in ssh_options()[1::2])
    for key, value in options.items():
        assert a[key] == value and b[key] == value
    assert a["UserKnownHostsFile"] == str(inventory.root / "keys" / "known_hosts")
    assert ssh_argv(inventory.hosts["far"]) == argv  # written once, named by its content
    assert node_ssh_argv(inventory.hosts["rack-b"]) == ["ssh", "-F", str(config), "fdl-node-rack-b"]


def test_the_rsync_of_a_host_behind_a_node_is_the_nodes_own_ssh(inventory):
    words = rsync_rsh(inventory.hosts["far"]).split()
    assert "-J" not in words and "-F" not in words
    assert "'ControlPath=~/.cache/fdl/cp/%C'" in words  # the node's masters, which its Ansible opened
    assert words[words.index("-i") + 1] == "'~/.ssh/workers'" or words[words.index("-i") + 1] == "~/.ssh/workers"
    direct = rsync_rsh(inventory.hosts["direct"]).split()
    assert any(w.startswith("ControlPath=") and "~" not in w for w in direct)


def test_a_nodes_environment_names_the_jobs_own_files_and_keeps_the_pins(inventory):
    env = nodes.node_environment(3)
    assert "PATH" not in env  # the node's own, the virtualenv first (worker_command)
    assert env["ANSIBLE_CONFIG"] == "ansible.cfg" and env["ANSIBLE_COLLECTIONS_PATH"] == "collections"
    assert env["ANSIBLE_MODULE_UTILS"] == f"collections/{RELATIVE}/plugins/module_utils"
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"] == "~/.cache/fdl/cp"
    assert env["ANSIBLE_PIPELINING"] == "True" and env["ANSIBLE_FORKS"] == "3"
    assert not [k for k, v in env.items() if str(inventory.root) in v or os.environ.get("HOME", "/") in v]
    assert nodes.worker_command().startswith('PATH="$HOME/.flodl/execution-node/venv/bin:$PATH" exec ')


def test_the_job_directory_holds_the_playbook_the_collection_and_private_variables(tmp_path):
    pdd = tmp_path / "pdd"
    pdd.mkdir()
    binary = tmp_path / "train"
    binary.write_text("#!/bin/sh\n")
    from fdl.resources import playbook

    job, rel = nodes.job_dir(pdd, "r1", '{"all": {}}', '{"x": 1}', playbook("dispatch.yml"),
                             {"fdl-ship/abc/train": binary})
    project = job / "project"
    assert rel == f"collections/{RELATIVE}/playbooks/dispatch.yml" and (project / rel).is_file()
    assert (project / "ansible.cfg").read_text() == (REPO / "ansible.cfg").read_text()
    assert (project / "collections" / RELATIVE / "plugins" / "modules" / "fdl_dispatch_stage.py").is_file()
    assert (project / rel).parent.joinpath("fdl-ship/abc/train").read_text() == "#!/bin/sh\n"
    for path in (job / "env" / "extravars", job / "inventory" / "hosts.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    own = tmp_path / "own.yml"
    own.write_text("- hosts: all\n  tasks: []\n")
    job2, rel2 = nodes.job_dir(pdd, "r2", "{}", "{}", own, None)
    assert rel2 == "own.yml" and (job2 / "project" / "own.yml").is_file()


def test_the_roles_default_releases_are_fdls_pins():
    defaults = yaml.safe_load((REPO / "roles/fdl_execution_node/defaults/main.yml").read_text())
    spec = yaml.safe_load((REPO / "roles/fdl_execution_node/meta/argument_specs.yml").read_text())
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    wanted = {name: pins[name] for name in ("ansible-core", "ansible-runner")}
    assert defaults["fdl_execution_node_packages"] == wanted
    assert defaults["fdl_execution_node_venv"] == nodes.NODE_VENV  # where fdl runs the worker from
    assert spec["argument_specs"]["main"]["options"]["fdl_execution_node_packages"]["default"] == wanted
    assert nodes.pinned_packages() == wanted  # what fdl passes: the releases it runs with
    assert "ansible-core==" + wanted["ansible-core"] in nodes.constraint_lines()
    # docs/ansible.md's recipe that prepares nodes downloads these releases (and the playbook's defaults install them)
    page = (REPO / "docs" / "ansible.md").read_text()
    lines = [line for line in page.splitlines() if line.startswith("pip download ") and "ansible-runner==" in line]
    assert len(lines) == 1, lines
    assert dict(word.split("==") for word in lines[0].split() if "==" in word) == wanted, lines[0]


# --------------------------------------------------------------------------- a node's part, with a local worker


PLAY = """\
- name: What a node runs for its hosts
  hosts: all
  gather_facts: false
  tasks:
    - name: A module of the collection, with its module_utils
      flodl.fdl.fdl_reap:
        run_id: 0123456789abcdef0123456789abcdef
    - name: A file shipped in the job
      ansible.builtin.command: cat fdl-ship/note.txt
      changed_when: false
"""


def local_worker(tmp_path: Path) -> list[str]:
    """ansible-runner's worker on this machine, as ssh would start it on a node (its bin first on PATH)."""
    bindir = ansible_bin_dir()
    home = tmp_path / "nodehome"
    home.mkdir(exist_ok=True)
    return ["env", f"PATH={bindir}:{os.environ.get('PATH', '')}", f"HOME={home}", str(bindir / "ansible-runner"),
            "worker", "--keepalive-seconds", "1"]


def job(tmp_path: Path, hosts: list[str], text: str = PLAY) -> tuple[nodes.Part, Collector]:
    play = tmp_path / "play.yml"
    play.write_text(text)
    note = tmp_path / "note.txt"
    note.write_text("shipped in the stream\n")
    inv = ClusterInventory(hosts={h: InventoryHost(name=h, vars=local_vars(sys.executable)) for h in hosts})
    pdd = tmp_path / "pdd"
    pdd.mkdir(exist_ok=True)
    path, rel = nodes.job_dir(pdd, "r1", json.dumps(inv.to_ansible()), json.dumps({"fdl_run_id": "r1"}), play,
                              {"fdl-ship/note.txt": note})
    collector = Collector(hosts, None, None)
    return nodes.Part(name="node-x", hosts=hosts, argv=local_worker(tmp_path), job=path, rel_playbook=rel,
                      pdd=pdd), collector


def run(part: nodes.Part, collector: Collector, cancel=lambda: False, timeout=None) -> nodes.NodeRun:
    assert part.job is not None and part.pdd is not None
    return nodes.run_on_node(part.name, part.argv, part.job, part.rel_playbook, part.pdd, "r1", part.hosts,
                             collector, cancel, timeout, forks=len(part.hosts))


@pytest.mark.slow
def test_a_job_streams_through_ansible_runners_worker_and_comes_back_as_the_same_results(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    part, collector = job(tmp_path, ["w1", "w2"])
    collector.parts = 2  # another part of the run is still out: its stats are not in yet
    out = run(part, collector)
    assert out.problem is None and out.status == "successful" and out.rc == 0, (out, out.stderr)
    for name in ("w1", "w2"):
        host = collector.hosts[name]
        assert host.status == OK, host
        assert [t.task for t in host.tasks] == ["A module of the collection, with its module_utils",
                                                "A file shipped in the job"]
        assert host.tasks[0].res is not None and host.tasks[0].res.get("changed") is False
        assert host.res is not None and host.res["stdout"] == "shipped in the stream"
    assert not collector.stats.is_set()  # one part's stats of two
    collector.part_done()
    assert collector.stats.is_set()
    assert out.artifact_dir is not None and (out.artifact_dir / "rc").read_text().strip() == "0"
    kept = [json.loads(p.read_text())["event"] for p in (out.artifact_dir / "job_events").iterdir()]
    assert kept and all(e.startswith("playbook_on_") for e in kept)  # per-host events are read live, not written


def test_a_node_that_cannot_run_the_worker_leaves_its_hosts_unreachable_through_it(tmp_path):
    part, collector = job(tmp_path, ["w1", "w2"])
    part.argv = ["sh", "-c", "cat >/dev/null; echo 'ansible-runner: not found' >&2; exit 127"]
    out = run(part, collector)
    assert out.status == "failed"
    for name in ("w1", "w2"):
        host = collector.hosts[name]
        assert host.status == UNREACHABLE
        assert host.message is not None and host.message.startswith(
            "unreachable through node-x: the execution node cannot run ~/.flodl/execution-node/venv/bin/ansible-runner "
            "(exit 127: ansible-runner: not found)")
        assert "flodl.fdl.execution_node" in host.message
    assert collector.stats.is_set()  # the part is over: nobody waits for its stats


DIES = """\
- name: A node that dies while its hosts are inside a task
  hosts: all
  gather_facts: false
  tasks:
    - name: Answered by the node itself
      ansible.builtin.debug:
        msg: at once, as the probe role's argument validation is
    - name: Still running on the hosts
      ansible.builtin.command: sh -c 'for i in $(seq 1200); do [ -e {release} ] && exit 0; sleep 0.1; done'
      changed_when: false
"""


@pytest.mark.slow
def test_a_node_that_dies_after_its_hosts_passed_a_task_leaves_every_one_unreachable_through_it(tmp_path,
                                                                                               monkeypatch):
    """The CI failure of issue 40's testbed test: the node died after its hosts had passed the role's first task (so
    they were "ok" so far) and before its play's final stats; they stayed "ok" without a probe report, and the probe
    said "could not run: no result" instead of "unreachable through n2"."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    release = tmp_path / "release"
    part, collector = job(tmp_path, ["w1", "w2", "w3"], DIES.format(release=release))
    pidfile = tmp_path / "worker.pid"
    part.argv = ["sh", "-c", f'echo $$ > {pidfile}; exec "$@"', "sh", *part.argv]  # the node's session leader
    collector.hosts["w3"].status = FAILED  # Ansible's own verdict before the node died: final, it stands
    collector.hosts["w3"].message = "its own failure"
    killed: list[bool] = []

    def on_event(event) -> None:  # both hosts passed the first task and are inside the second: the node dies
        inside = [h for h in ("w1", "w2") if collector.hosts[h].current_task == "Still running on the hosts"]
        if len(inside) == 2 and not killed:
            killed.append(True)
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)

    collector.on_event = on_event
    try:
        out = run(part, collector)
    finally:
        release.write_text("")  # the hosts' commands end (ansible-playbook has a session of its own)
    assert killed, "the hosts never got inside the second task"
    assert out.status == "failed" and out.problem is not None
    for name in ("w1", "w2"):
        host = collector.hosts[name]
        assert [t.status for t in host.tasks] == [OK]  # passed the first task on the node...
        assert host.status == UNREACHABLE  # ...and have no answer: the node never sent its final stats
        assert host.message == f"unreachable through node-x: {out.problem}"
    assert (collector.hosts["w3"].status, collector.hosts["w3"].message) == (FAILED, "its own failure")
    assert collector.stats.is_set()


def _stream(tmp_path: Path, *lines: dict) -> list[str]:
    """A node whose worker takes the job and sends `lines` (ansible-runner's stream format), then exits."""
    script = tmp_path / "stream.sh"
    script.write_text("cat >/dev/null\n" + "".join(f"echo {shlex.quote(json.dumps(line))}\n" for line in lines))
    return ["sh", str(script)]


def _event(counter: int, kind: str, **data) -> dict:
    return {"event": kind, "uuid": f"u{counter}", "counter": counter, "event_data": data}


def test_after_the_final_stats_a_broken_stream_leaves_the_hosts_answers_standing(tmp_path):
    part, collector = job(tmp_path, ["w1"])
    part.argv = _stream(tmp_path, _event(1, "runner_on_ok", host="w1", task="t", res={"changed": False}),
                        _event(2, "playbook_on_stats"))  # then the link drops: no status, no end of stream
    out = run(part, collector)
    assert out.problem is not None  # the node's part failed...
    assert collector.hosts["w1"].status == OK  # ...after w1's answer was final


def test_the_nodes_failed_job_is_told_by_its_status_not_by_the_wording_of_its_output(tmp_path):
    """The node's ansible-runner says its ansible-playbook failed (a final status, no final stats): the job failed
    there, whatever the words it printed, which are quoted as they are."""
    part, collector = job(tmp_path, ["w1"])
    said = "the inventory could not be read, sorry"  # no `[ERROR]` or `ERROR!` in it
    part.argv = _stream(tmp_path, {"event": "verbose", "uuid": "u1", "counter": 1, "stdout": said},
                        {"status": "failed", "runner_ident": "r1"}, {"eof": True})
    out = run(part, collector)
    assert out.status == "failed"
    assert collector.hosts["w1"].status == UNREACHABLE
    assert collector.hosts["w1"].message == f"unreachable through node-x: the job failed on the execution node: {said}"


def test_a_stream_that_is_not_ansible_runners_is_the_nodes_failure(tmp_path):
    part, collector = job(tmp_path, ["w1"])
    part.argv = ["sh", "-c", "cat >/dev/null; echo 'Welcome to the bastion'"]
    run(part, collector)
    message = collector.hosts["w1"].message or ""
    assert collector.hosts["w1"].status == UNREACHABLE
    assert message.startswith("unreachable through node-x: the job failed on the execution node: Failed to JSON "
                              "parse a line from worker stream")


def test_a_node_that_goes_silent_is_cut_off_after_the_idle_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(nodes, "IDLE_LIMIT_S", 1.0)
    part, collector = job(tmp_path, ["w1"])
    part.argv = ["sh", "-c", "cat >/dev/null; exec sleep 60"]  # takes the job, then never says a word
    run(part, collector)
    assert collector.hosts["w1"].status == UNREACHABLE
    assert "sent nothing for 1 s" in (collector.hosts["w1"].message or "")


def test_cancel_cuts_the_stream_and_leaves_the_hosts_to_the_runs_verdict(tmp_path):
    part, collector = job(tmp_path, ["w1"])
    part.argv = ["sh", "-c", "cat >/dev/null; exec sleep 60"]
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    out = run(part, collector, cancel=cancel.is_set)
    assert out.status == "canceled" and out.problem is None
    assert collector.hosts["w1"].status == PENDING  # run_playbook calls it missing, as for a direct host


def test_the_workers_keepalive_is_no_event(tmp_path):
    """ansible-runner's worker sends a keepalive every second of quiet; the process side drops them, and they reset
    the idle clock: a slow task is not a dead node."""
    script = tmp_path / "slow.sh"
    script.write_text(textwrap.dedent("""\
        cat >/dev/null
        for i in 1 2 3; do echo '{"event": "keepalive", "counter": 0, "uuid": 0}'; sleep 0.6; done
        echo '{"status": "failed", "runner_ident": "r1"}'
        echo '{"eof": true}'
        """))
    part, collector = job(tmp_path, ["w1"])
    part.argv = ["sh", str(script)]
    seen: list[str] = []
    collector.on_event = lambda e: seen.append(e.kind)
    original = nodes.IDLE_LIMIT_S
    try:
        nodes.IDLE_LIMIT_S = 1.0
        out = run(part, collector)
    finally:
        nodes.IDLE_LIMIT_S = original
    assert "keepalive" not in seen
    assert "sent nothing" not in (out.problem or "")  # 1.8 s of quiet in all, never 1 s without a keepalive
    assert collector.hosts["w1"].status == UNREACHABLE  # no stats came: the node ended without a result
    assert "ended the job without a result" in (collector.hosts["w1"].message or "")


def test_ansible_playbooks_own_error_on_the_node_is_the_reason(tmp_path):
    """A job the node's ansible-playbook refuses (here: a playbook that does not parse) names ansible-playbook's
    error, not just "no result"."""
    part, collector = job(tmp_path, ["w1"])
    assert part.job is not None
    (part.job / "project" / part.rel_playbook).write_text("- hosts: all\n  tasks: [ {bad: yaml\n")
    out = run(part, collector)
    assert out.status == "failed"
    message = collector.hosts["w1"].message or ""
    assert collector.hosts["w1"].status == UNREACHABLE
    assert message.startswith("unreachable through node-x: the job failed on the execution node: [ERROR]: YAML "
                              "parsing failed"), message
