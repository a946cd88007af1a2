"""`fdl join --source`: fetched and built on the worker, classed failures, and runs published by `fdl publish`."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_fdl
from tests.integration.join.helpers import (
    JOIN_TOKEN,
    TRAIN,
    Lines,
    controller,
    finish,
    policy,
    results,
    spawn_join,
    terminate,
    wait_for,
)
from tests.join_util import write_program

pytestmark = pytest.mark.slow

# A "build" that needs no toolchain but the shell: the recipe copies the script into place.
COPY_BUILD = "mkdir -p out && cp train.py out/train && chmod +x out/train"


def source_tree(root: Path, *, broken: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(f"#!{sys.executable}\n{TRAIN}")
    (root / "main.c").write_text("int main(void) { return 0 }\n" if broken else "int main(void) { return 0; }\n")
    return root


def test_a_source_spec_that_does_not_parse_is_permanent(tmp_path):
    for extra in ((), ("--persist",)):
        proc = spawn_join("127.0.0.1:1", *extra, "--source", "ftp://example.org/tree", "--devices", "cpu:1",
                          home=tmp_path / "h")
        code, _, err = finish(proc, timeout=60)
        assert code == 2, err
        assert "source spec 'ftp://example.org/tree' does not parse" in err and "unknown scheme" in err


def test_a_source_that_does_not_compile_is_transient_and_persist_redials(tmp_path):
    tree = source_tree(tmp_path / "src", broken=True)
    args = ("--source", f"file://{tree}", "--source-build", "cc -o train main.c", "--source-bin", "train",
            "--devices", "cpu:1")
    code, _, err = finish(spawn_join("127.0.0.1:1", *args, home=tmp_path / "one"), timeout=120)
    assert code == 1, err
    assert "the source did not compile" in err and "transient on purpose" in err
    assert "error" in err  # the compiler's own output reaches the user

    persist = spawn_join("127.0.0.1:1", "--persist", *args, home=tmp_path / "persist")
    lines = Lines(persist)
    try:
        wait_for(lambda: lines.count("re-dialing in") >= 2, timeout=120, what="two re-dials")
        assert lines.count("the source did not compile") >= 2
        (tree / "main.c").write_text("int main(void) { return 0; }\n")  # the fix, pushed at the source
        wait_for(lambda: lines.count("no run listening"), timeout=120, what="a dial after a good build")
    finally:
        code = terminate(persist, lines)
    assert code == -signal.SIGTERM  # after a clean stop, it dies of the signal it got


def test_a_missing_toolchain_is_permanent(tmp_path):
    tree = source_tree(tmp_path / "src")
    proc = spawn_join("127.0.0.1:1", "--source", f"file://{tree}", "--source-build", "fdlj7-no-such-compiler x",
                      "--source-bin", "train", "--devices", "cpu:1", home=tmp_path / "h")
    code, _, err = finish(proc, timeout=120)
    assert code == 2 and "toolchain is missing" in err


@pytest.mark.parametrize("spec", ["file:///fdlj7/no/such/tree", "rsync://127.0.0.1:1:/srv/tree"])
def test_a_fetch_failure_is_transient(tmp_path, spec):
    proc = spawn_join("127.0.0.1:1", "--source", spec, "--source-bin", "train", "--devices", "cpu:1",
                      home=tmp_path / "h")
    code, _, err = finish(proc, timeout=120)
    assert code == 1, err
    assert "fetching" in err and "failed" in err


def test_nothing_published_yet_is_transient(tmp_path):
    tree = source_tree(tmp_path / "src")
    proc = spawn_join("127.0.0.1:1", "--source", f"file://{tree}", "--devices", "cpu:1", home=tmp_path / "h")
    code, _, err = finish(proc, timeout=120)
    assert code == 1 and "no run is published" in err


@pytest.fixture
def mirror(tmp_path):
    """A libtorch mirror (python -m http.server on loopback) serving fake cu128 and rocm7.1 archives."""
    from tests.fakes.libtorch_server import fake_archive
    from tests.join_util import free_port

    root = tmp_path / "mirror"
    root.mkdir()
    for variant in ("cu128", "rocm7.1"):
        archive = root / f"libtorch-{variant}.zip"
        archive.write_bytes(fake_archive(variant))
        (root / f"libtorch-{variant}.zip.sha256").write_text(hashlib.sha256(archive.read_bytes()).hexdigest() + "\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                               str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _answers(port), what="the mirror")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


@pytest.mark.parametrize("variant, vendor", [("rocm7.1", "amd"), ("cu128", "nvidia")])
def test_a_compile_failure_is_transient_and_names_missing_vendor_headers(tmp_path, mirror, variant, vendor):
    """regression: a compile failure on a box without the vendor's headers was permanent (exit 2). Whether a build
    needs them is the fetched tree's to say (the next publish may need none), so it is transient: the message names
    the install line, and the next dial builds again."""
    from fdl.publish.gate import headers_present

    missing = not headers_present(vendor)
    tree = source_tree(tmp_path / "src", broken=True)
    proc = spawn_join("127.0.0.1:1", "--libtorch", variant, "--source", f"file://{tree}", "--source-build",
                      "cc -o train main.c", "--source-bin", "train", "--devices", "cpu:1", home=tmp_path / "h",
                      env={"FDL_LIBTORCH_MIRROR": mirror})
    code, _, err = finish(proc, timeout=120)
    label = {"rocm7.1": "rocm71", "cu128": "cu128"}[variant]
    assert (tmp_path / "h" / ".flodl" / "libtorch" / "precompiled" / label / "lib").is_dir()
    assert code == 1, err
    if missing:
        header = "hip/hip_runtime.h" if vendor == "amd" else "cuda_runtime.h"
        assert f"development headers ({header})" in err and "install: " in err
    else:
        assert "the source did not compile" in err


def _answers(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


def test_a_published_run_brings_its_args_and_run_id(tmp_path):
    src = source_tree(tmp_path / "src")
    served = tmp_path / "served"
    published = run_fdl("publish", f"file://{src}", "--bin", "out/train", "--build", COPY_BUILD, "--to",
                        str(served), "--", "--epochs", "3", cwd=tmp_path, env={"HOME": str(tmp_path / "op")})
    assert published.returncode == 0, published.stderr
    import yaml

    run_id = yaml.safe_load((served / "tree" / ".fdl-run.yml").read_text())["run"]
    with controller(policy(max_hosts=2, window_s=60)) as server:
        a = spawn_join(server.address, "--source", f"file://{served}/tree", "--host", "a", "--devices", "cpu:1",
                       home=tmp_path / "a")
        b = spawn_join(server.address, "--source", f"file://{served}/tree", "--host", "b", "--devices", "cpu:1",
                       home=tmp_path / "b")
        (code_a, out_a, err_a), (code_b, out_b, _) = finish(a), finish(b)
        state = server.state()
    assert (code_a, code_b) == (0, 0), err_a
    assert {m["run_id"] for m in state["roster"]} == {run_id} and state["run_id"] == run_id
    assert {r["args"] for r in results(out_a) + results(out_b)} == {"--epochs,3"}
    assert f"run {run_id[:12]}" in err_a


def test_a_box_holding_another_publish_is_refused(tmp_path):
    src = source_tree(tmp_path / "src")
    served = tmp_path / "served"

    def publish() -> None:
        done = run_fdl("publish", f"file://{src}", "--bin", "out/train", "--build", COPY_BUILD, "--to", str(served),
                       cwd=tmp_path, env={"HOME": str(tmp_path / "op")})
        assert done.returncode == 0, done.stderr

    publish()
    with controller(policy(start="manual", window_s=60)) as server:
        first = spawn_join(server.address, "--source", f"file://{served}/tree", "--host", "a", "--devices", "cpu:1",
                           home=tmp_path / "a")
        try:
            wait_for(lambda: server.state()["roster"], timeout=120, what="the first box's admission")
            publish()  # a new run: the next box fetches a different publish than the cohort's
            late = spawn_join(server.address, "--source", f"file://{served}/tree", "--host", "b", "--devices",
                              "cpu:1", home=tmp_path / "b")
            code, _, err = finish(late)
        finally:
            os.killpg(first.pid, signal.SIGTERM)
            finish(first)
    assert code == 1 and "refused this box (run_id_differs)" in err


def test_a_plain_tree_is_fetched_without_links_that_leave_it(tmp_path):
    """regression: an unpublished tree (--source-bin) was copied with its links as they were, so a link
    pointing out of the source reached the worker's build tree; with --safe-links it stays behind."""
    from fdl.agent.source import fetch

    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id").write_text("PRIVATE-KEY-MATERIAL\n")
    tree = source_tree(tmp_path / "src")
    (tree / "keys").symlink_to(secret)
    (tree / "up").symlink_to("../secret/id")
    (tree / "inside").symlink_to("train.py")
    notes: list[str] = []
    got = tmp_path / "worker"
    assert fetch(f"file://{tree}", got, identity=None, source_bin="out/train", note=notes.append) is None
    assert any("plain tree" in n for n in notes)
    assert (got / "train.py").exists() and os.readlink(got / "inside") == "train.py"
    assert not os.path.lexists(got / "keys") and not os.path.lexists(got / "up")


def _publish(src: Path, served: Path, tmp_path: Path, *args: str, env: dict | None = None) -> None:
    done = run_fdl("publish", f"file://{src}", "--to", str(served), *args, cwd=tmp_path,
                   env={"HOME": str(tmp_path / "op"), **(env or {})})
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("typo, says", [
    (("--bin", "out/trian", "--build", COPY_BUILD), "the binary 'out/trian' is not there"),
    (("--bin", "out/train", "--build", "fdlj-no-such-tool --release"), "exit 127: not found"),
])
def test_a_published_trees_typo_is_transient_and_the_next_publish_mends_it(tmp_path, typo, says):
    """regression: a published tree whose bin names nothing the build makes (a renamed or mistyped bin), or whose
    recipe's command is not found (127), exited 2: one publisher's typo powered the fleet off. A --no-build publish
    is never gated, and neither is a git source. Now each box says so and re-dials; the next publish mends it."""
    src = source_tree(tmp_path / "src")
    served = tmp_path / "served"
    _publish(src, served, tmp_path, "--no-build", *typo)
    code, _, err = finish(spawn_join("127.0.0.1:1", "--source", f"file://{served}/tree", "--devices", "cpu:1",
                                     home=tmp_path / "one"), timeout=120)
    assert code == 1 and says in err and "next dial" in err, err
    with controller(policy(max_hosts=1, window_s=120)) as server:
        persist = spawn_join(server.address, "--persist", "--source", f"file://{served}/tree", "--host", "p",
                             "--devices", "cpu:1", home=tmp_path / "persist")
        lines = Lines(persist)
        try:
            wait_for(lambda: lines.count(says) >= 2, timeout=120, what="two dials that found the typo")
            assert persist.poll() is None
            _publish(src, served, tmp_path, "--bin", "out/train", "--build", COPY_BUILD)  # the fix
            wait_for(lambda: lines.count("the agent exited 0; re-dialing"), timeout=180, what="a run after the fix")
            state = server.state()
        finally:
            code = terminate(persist, lines)
    assert code == -signal.SIGTERM, lines.text()
    assert state["roster"][0]["host"] == "p" and state["roster"][0]["exit_code"] == 0


def test_a_project_directory_the_fetched_tree_lacks_is_transient(tmp_path):
    # regression: a cwd missing from the fetched tree exited 2; whether it is there is the tree's to say
    src = source_tree(tmp_path / "src")
    served = tmp_path / "served"
    _publish(src, served, tmp_path, "--bin", "out/train", "--build", COPY_BUILD)
    code, _, err = finish(spawn_join("127.0.0.1:1", "--source", f"file://{served}/tree", "--source-cwd", "nothere",
                                     "--devices", "cpu:1", home=tmp_path / "h"), timeout=120)
    assert code == 1 and "the project directory 'nothere' is not in the fetched tree" in err, err


def test_a_read_only_directory_in_a_published_tree_does_not_stop_a_worker(tmp_path):
    """regression: `rsync -a` carried the published tree's modes into the worker's stage: a read-only project
    directory made the stage unwritable (exit 2, poweroff), and a read-only tree root made the next fetch fail with
    a PermissionError nobody classed ("internal error"). The worker's copy is its own: directories land writable.
    The worker is another real account (root is not refused by modes)."""
    import tempfile

    from tests.integration.launch.helpers import fdl_python
    from tests.join_util import local_account

    base = Path(tempfile.mkdtemp(prefix="fdlj-ro-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        python = fdl_python(base / "py")
        src = base / "src"
        (src / "proj" / "data").mkdir(parents=True)
        (src / "proj" / "train.py").write_text(f"#!{python}\n{TRAIN}")
        (src / "proj" / "data" / "shard-0").write_text("tokens")
        for directory in (src / "proj" / "data", src / "proj", src):
            directory.chmod(0o555)
        served = base / "served"
        _publish(src, served, tmp_path, "--cwd", "proj", "--bin", "out/train", "--build", COPY_BUILD)
        subprocess.run(["chmod", "-R", "a+rX", str(served)], check=True)
        with local_account("ro") as worker:
            home = base / "home"
            home.mkdir()
            os.chown(home, worker.pw_uid, worker.pw_gid)
            for attempt in ("first", "again"):  # the second fetches over the first copy
                with controller(policy(max_hosts=1, window_s=120)) as server:
                    argv = ["setpriv", f"--reuid={worker.pw_uid}", f"--regid={worker.pw_gid}", "--init-groups",
                            "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", f"FDL_JOIN_TOKEN={JOIN_TOKEN}",
                            "GLOO_SOCKET_IFNAME=lo", str(python), "-m", "fdl", "join", server.address, "--source",
                            f"file://{served}/tree", "--host", "ro", "--devices", "cpu:1"]
                    done = subprocess.run(argv, cwd=home, capture_output=True, text=True, timeout=240)
                assert done.returncode == 0, f"{attempt}: {done.stderr}"
                assert results(done.stdout)[0]["size"] == "1"
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(base)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_rustc_mismatch_is_reported_and_never_enforced(tmp_path):
    """issue 38: the manifest's rustc (`rustc -V` on the publisher) was written but no worker compared it; a worker
    says when its own differs (or is missing), and trains all the same."""
    def fake_rustc(where: Path, says: str) -> str:
        write_program(where / "rustc", f"print({says!r})\n")
        return f"{where}:{os.environ['PATH']}"

    src = source_tree(tmp_path / "src")
    served = tmp_path / "served"
    _publish(src, served, tmp_path, "--bin", "out/train", "--build", COPY_BUILD,
             env={"PATH": fake_rustc(tmp_path / "pub", "rustc 1.80.0 (fake publisher)")})
    import yaml

    assert yaml.safe_load((served / "tree" / ".fdl-run.yml").read_text())["rustc"] == "rustc 1.80.0 (fake publisher)"
    outcomes = {}
    for name, says in (("differs", "rustc 1.79.0 (fake worker)"), ("same", "rustc 1.80.0 (fake publisher)")):
        with controller(policy(max_hosts=1, window_s=60)) as server:
            outcomes[name] = finish(spawn_join(server.address, "--source", f"file://{served}/tree", "--devices",
                                               "cpu:1", home=tmp_path / name,
                                               env={"PATH": fake_rustc(tmp_path / name / "bin", says)}))
    code, _, err = outcomes["differs"]
    assert code == 0, err
    assert ("rustc: the run was published with `rustc 1.80.0 (fake publisher)`, this box builds with "
            "`rustc 1.79.0 (fake worker)` (advisory: reported, never enforced)") in err
    assert outcomes["same"][0] == 0 and "rustc:" not in outcomes["same"][2]
