"""`fdl @cluster CMD` across three network-namespace hosts: a gloo job of 3 x 2 CPU ranks, a rank failing
mid-run, Ctrl-C on the launcher, and the pre-flight per-host cargo build.

The launcher runs in this test process's namespace on the testbed's gateway; every worker is a real sshd
host reached as its own user. Ranks run as those users (a world-readable venv of /usr/bin/python3 sees
this suite's torch, helpers.torch_python). No process of a run may be left on any host once the launcher
has exited: checked per host user.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import IN_CI, fdl_env, run_fdl
from tests.integration.launch.helpers import (
    checksums,
    final_state,
    free_port,
    run_processes,
    train_script,
    write_project,
)

pytestmark = [pytest.mark.testbed(hosts=3), pytest.mark.slow]


@pytest.fixture
def testbed_home(bed, short_tmp: Path) -> dict:
    """A fresh HOME for the launcher, from this module's own bed: the plugin's default testbed is not needed,
    and building it beside `bed` would remove `bed`'s users whenever its prefix is a prefix of this one's."""
    return bed.home_env(short_tmp / "home")


def cluster_doc(bed, port: int, **per_host: dict) -> dict:
    workers = []
    for host in bed.hosts:
        entry = host.worker(local_devices="cpu:2", env={"GLOO_SOCKET_IFNAME": "eth0"})
        entry.update(per_host.get(host.name, {}))
        workers.append(entry)
    doc = bed.cluster(workers)
    doc["cluster"]["controller"] = {"host": bed.gateway, "port": port, "bind": bed.gateway}
    return doc


def demo_project(root: Path, bed, torchpy: Path, args: list[str]) -> Path:
    train_script(root, torchpy)
    return write_project(root, {"train": {"cluster": True, "bin": "train.py", "args": args}},
                         cluster_doc(bed, free_port(bed.gateway)))


def assert_no_leftovers(bed) -> None:
    left = {host.name: run_processes(host) for host in bed.hosts}
    assert not any(left.values()), f"processes of the run left behind: {left}"


def test_gloo_job_across_three_hosts_and_the_launchers_own(bed, torchpy, short_tmp, testbed_home):
    # the launcher's box is a worker too (its bridge address): its rank runs here, without ssh, and is rank 0
    root = short_tmp / "proj"
    train_script(root, torchpy)
    doc = cluster_doc(bed, free_port(bed.gateway))
    doc["cluster"]["workers"].insert(0, {"host": "ctl", "address": bed.gateway, "local_devices": "cpu:1",
                                         "env": {"GLOO_SOCKET_IFNAME": bed.bridge}})
    project = write_project(root, {"train": {"cluster": True, "bin": "train.py", "args": ["--steps", "5"]}}, doc)
    done = run_fdl("@cluster", "train", cwd=project, env=testbed_home, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    ranks = checksums(done.stdout)
    assert sorted(ranks) == list(range(7)), done.stdout
    assert len({r["sum"] for r in ranks.values()}) == 1  # every rank holds the same all-reduced weights
    assert {r["size"] for r in ranks.values()} == {7}
    assert [ranks[i]["host"] for i in range(7)] == ["ctl", "h1", "h1", "h2", "h2", "h3", "h3"]  # workers: order
    assert "world formed: 7 ranks on 4 host(s), backend gloo, master " + bed.gateway in done.stderr
    assert "staging on 3 remote host(s)" in done.stderr  # not on ctl
    assert "run done: 7 rank(s) on 4 host(s) exited 0" in done.stderr
    state = final_state(Path(testbed_home["HOME"]))
    assert state["phase"] == "done" and state["kind"] == "roster"
    assert {m["host"]: m["exit_code"] for m in state["roster"]} == {"ctl": 0, "h1": 0, "h2": 0, "h3": 0}
    for host in bed.hosts:  # one log per rank on each host, under the host user's home
        logs = sorted(p.name for p in (host.home / ".flodl" / "launch" / "runs").glob("*/logs/rank-*.log"))
        assert len(logs) == 2, (host.name, logs)
    assert len(list((Path(testbed_home["HOME"]) / ".flodl/launch/runs").glob("*/logs/rank-0.log"))) == 1
    assert_no_leftovers(bed)


def test_a_rank_failing_mid_run_fails_the_run_and_stops_every_host(bed, torchpy, short_tmp, testbed_home):
    # rank 3 (h2's second) exits 1 after step 2; the others sleep between steps, so it is the first to go
    project = demo_project(short_tmp / "proj", bed, torchpy,
                           ["--steps", "30", "--pause", "1", "--fail-rank", "3", "--fail-step", "2"])
    done = run_fdl("@cluster", "train", cwd=project, env=testbed_home, timeout=300)
    assert done.returncode == 1, done.stderr + done.stdout
    assert "fdl: error: the run failed: host h2, rank 3 exited 1 first" in done.stderr
    assert "[h2/3] rank 3: failing on purpose after step 2" in done.stdout
    assert "stopping the ranks on" in done.stderr
    assert not checksums(done.stdout)  # nobody finished: the other ranks were stopped, not left to train on
    state = final_state(Path(testbed_home["HOME"]))
    assert state["phase"] == "failed" and state["reason"].startswith("host h2 exited 1: rank 3 exited 1")
    codes = {m["host"]: m["exit_code"] for m in state["roster"]}
    assert codes["h2"] == 1 and codes["h1"] != 0 and codes["h3"] != 0, codes
    assert_no_leftovers(bed)


def test_ctrl_c_on_the_launcher_leaves_nothing_on_any_host(bed, torchpy, short_tmp, testbed_home):
    project = demo_project(short_tmp / "proj", bed, torchpy, ["--steps", "300", "--pause", "1"])
    proc = subprocess.Popen([sys.executable, "-m", "fdl", "@cluster", "train"], cwd=project,
                            env=fdl_env(testbed_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # all six ranks up on their hosts
            if sum(1 for h in bed.hosts for p in run_processes(h) if "train.py" in p) >= 6:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.3)
        else:
            raise AssertionError("the ranks did not start")
        time.sleep(2)  # inside init_process_group / training
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C at the terminal delivers to the launcher
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted after" in err and "every rank was stopped" in err
    state = final_state(Path(testbed_home["HOME"]))
    assert state["phase"] == "failed" and "Ctrl-C" in state["reason"]
    assert_no_leftovers(bed)


# --------------------------------------------------------------------------- staging is the dispatch playbook


def test_every_host_is_staged_by_the_dispatch_playbook_and_the_binary_travels_only_when_changed(
        bed, short_tmp, testbed_home):
    """`fdl @cluster CMD` stages through ansible-playbook (flodl.fdl.dispatch, role fdl_dispatch): the runner's
    artifacts name the playbook and its module, after the role's argument validation (fdl's runs are validated
    like anyone's); rsync runs only for a host whose binary differs."""
    from tests.runner_runs import runs_of

    root = short_tmp / "proj"
    root.mkdir(parents=True)
    rank = root / "rank.sh"
    rank.write_text('#!/bin/sh\necho "staged rank $RANK v1"\n')
    rank.chmod(0o755)
    doc = cluster_doc(bed, free_port(bed.gateway), **{h.name: {"local_devices": "cpu:1"} for h in bed.hosts})
    project = write_project(root, {"job": {"cluster": True, "bin": "rank.sh"}}, doc)
    cache = Path(testbed_home["XDG_CACHE_HOME"])
    names = {h.name for h in bed.hosts}

    def run_job() -> subprocess.CompletedProcess:
        done = run_fdl("@cluster", "job", cwd=project, env=testbed_home, timeout=300)
        assert done.returncode == 0, done.stderr + done.stdout
        return done

    first = run_job()
    assert sorted(line.split("] ", 1)[1] for line in first.stdout.splitlines() if "staged rank" in line) == \
        ["staged rank 0 v1", "staged rank 1 v1", "staged rank 2 v1"]
    stage, stop, ship = "flodl.fdl.fdl_dispatch_stage", "ansible.builtin.meta", "ansible.builtin.command"
    check = "ansible.builtin.validate_argument_spec"  # the role's inputs, checked on the controller
    (run,) = runs_of(cache, "dispatch.yml")
    assert run.command[0] == "ansible-playbook", run.command
    assert run.actions.count(check) == 1  # once per play: the ship step takes the same, checked, variables
    steps = lambda run: list(dict.fromkeys(run.actions))  # noqa: E731 - a meta task starts once per host
    assert steps(run) == [check, stage, stop, ship]  # checked inputs, layout, the controller's decision, rsync
    assert run.hosts("ok") == {name: 3 for name in names}  # a new binary: checked, laid out, sent by rsync
    assert run.hosts("failures") == {} and run.hosts("dark") == {}
    for host in bed.hosts:  # the staged copy is the binary itself
        shipped = host.home / ".flodl" / "launch" / "bin" / "job" / "rank.sh"
        assert shipped.read_bytes() == rank.read_bytes(), host.name

    run_job()  # unchanged: the module saw the same SHA-256 on every host, so no rsync task went anywhere
    unchanged = runs_of(cache, "dispatch.yml")[-1]
    assert steps(unchanged) == [check, stage, stop] and unchanged.hosts("ok") == {name: 2 for name in names}

    rank.write_text('#!/bin/sh\necho "staged rank $RANK v2"\n')
    changed = run_job()
    assert "staged rank 0 v2" in changed.stdout
    latest = runs_of(cache, "dispatch.yml")[-1]
    assert steps(latest) == [check, stage, stop, ship] and latest.hosts("ok") == {name: 3 for name in names}
    assert_no_leftovers(bed)


# --------------------------------------------------------------------------- the pre-flight build

CRATE_MAIN = r'''
fn main() {
    // what the build saw (compile time) and what the rank got (run time)
    println!("built feature={} libtorch={} rank={}",
             option_env!("FDL_GPU_FEATURE").unwrap_or("unset"),
             option_env!("LIBTORCH_PATH").unwrap_or("unset"),
             std::env::var("RANK").unwrap_or_default());
}
'''


def crate(root: Path, archs: dict[str, str | None], build: str | None = None, port: int | None = None,
          bed=None) -> Path:
    """A no-dependency Rust crate with libtorch variants in the project's libtorch/ tree."""
    from tests.fakes import make_libtorch

    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "Cargo.toml").write_text('[package]\nname = "tiny"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                     '[workspace]\n')
    (root / "src" / "main.rs").write_text(CRATE_MAIN)
    make_libtorch(root / "libtorch", "precompiled/cpu", cuda=None, archs=None)  # .active: hosts without arch:
    make_libtorch(root / "libtorch", "precompiled/cu128", activate=False)
    make_libtorch(root / "libtorch", "precompiled/rocm62", cuda=None, archs=None, activate=False)
    command = {"cluster": True, "bin": "target/release/tiny"}
    if build:
        command["build"] = build
    doc = cluster_doc(bed, port or free_port(bed.gateway),
                      **{h: ({"arch": a, "local_devices": "cpu:1"} if a else {"local_devices": "cpu:1"})
                         for h, a in archs.items()})
    for worker in doc["cluster"]["workers"]:
        if worker.get("arch") is None:
            worker.pop("arch", None)
    return write_project(root, {"train": command}, doc)


def cargo_env(home_env: dict) -> dict:
    """The test's own HOME, with this machine's Rust toolchain still found (rustup reads ~/.rustup by default)."""
    if shutil.which("cargo") is None:
        reason = "the pre-flight build tests need cargo (scripts/apt-test.txt lists it; scripts/test.sh installs it)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return {**home_env, "PATH": os.environ["PATH"],
            "CARGO_HOME": os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo")),
            "RUSTUP_HOME": os.environ.get("RUSTUP_HOME", os.path.expanduser("~/.rustup"))}


def built_lines(stdout: str) -> dict[str, str]:
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"^\[(h\d)/\d+\] built (.*)$", line.strip())
        if match:
            found[match[1]] = match[2]
    return found


def test_prebuild_per_host_target_dirs_and_a_changed_arch_rebuilds(bed, short_tmp, testbed_home):
    project = crate(short_tmp / "crate", {"h1": "precompiled/cpu", "h2": "precompiled/cu128", "h3": None}, bed=bed)
    env = cargo_env(testbed_home)
    done = run_fdl("@cluster", "train", cwd=project, env=env, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    target = project / "target" / "cluster"
    for path in ("h1/precompiled/cpu", "h2/precompiled/cu128", "h3/native"):
        assert (target / path / "release" / "tiny").is_file(), path
        assert (target / path / "fdl-build.log").is_file(), path
    assert not (project / "target" / "release").exists()  # every build went to its host's own dir
    lines = built_lines(done.stdout)
    lt = project / "libtorch" / "precompiled"
    assert lines["h1"] == f"feature= libtorch={lt / 'cpu'} rank=0"
    assert lines["h2"] == f"feature=cuda libtorch={lt / 'cu128'} rank=1"
    assert lines["h3"] == f"feature= libtorch={lt / 'cpu'} rank=2"  # no arch: this machine's active variant
    h1_cpu = (target / "h1/precompiled/cpu/release/tiny").stat().st_mtime_ns

    # h1 moves to the cu128 variant: a fresh build in its own directory; the old one is left as it was
    doc = yaml.safe_load((project / "fdl.cluster.yml").read_text())
    doc["cluster"]["workers"][0]["arch"] = "precompiled/cu128"
    (project / "fdl.cluster.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    again = run_fdl("@cluster", "train", cwd=project, env=env, timeout=600)
    assert again.returncode == 0, again.stderr + again.stdout
    assert (target / "h1/precompiled/cu128/release/tiny").is_file()
    assert (target / "h1/precompiled/cpu/release/tiny").stat().st_mtime_ns == h1_cpu
    assert built_lines(again.stdout)["h1"] == f"feature=cuda libtorch={lt / 'cu128'} rank=0"

    # --no-prebuild runs what is there
    skipped = run_fdl("@cluster", "train", "--no-prebuild", cwd=project, env=env, timeout=300)
    assert skipped.returncode == 0, skipped.stderr
    assert "--no-prebuild" in skipped.stderr and "pre-flight build:" not in skipped.stderr
    assert_no_leftovers(bed)


def test_a_build_failing_for_one_host_aborts_before_dispatch(bed, short_tmp, testbed_home):
    recipe = ('if [ "$FDL_GPU_FEATURE" = rocm ]; then echo "error: no ROCm toolchain on this box" >&2; exit 3; fi; '
              'cargo build --release')
    project = crate(short_tmp / "crate", {"h1": "precompiled/cpu", "h2": "precompiled/rocm62",
                                          "h3": "precompiled/cpu"}, build=recipe, bed=bed)
    before = {h.name: set((h.home / ".flodl" / "launch" / "runs").glob("*")) for h in bed.hosts}
    done = run_fdl("@cluster", "train", cwd=project, env=cargo_env(testbed_home), timeout=600)
    assert done.returncode == 1, done.stderr + done.stdout
    assert "the pre-flight build failed for host h2 (arch precompiled/rocm62)" in done.stderr, done.stderr
    assert "exited 3" in done.stderr and "Nothing was dispatched" in done.stderr
    assert "error: no ROCm toolchain on this box" in done.stderr  # the tail of h2's build log
    assert "staging on" not in done.stderr and "ranks started" not in done.stderr
    for host in bed.hosts:
        assert set((host.home / ".flodl" / "launch" / "runs").glob("*")) == before[host.name], host.name
    assert final_state(Path(testbed_home["HOME"]))["phase"] == "failed"
