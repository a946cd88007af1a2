"""`fdl join --source`: fetched and built on the worker, classed failures, and runs published by `fdl publish`."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_fdl
from tests.integration.join.helpers import (
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
def test_a_compile_failure_is_permanent_only_when_the_vendor_headers_are_missing(tmp_path, mirror, variant, vendor):
    from fdl.publish.gate import headers_present

    missing = not headers_present(vendor)
    tree = source_tree(tmp_path / "src", broken=True)
    proc = spawn_join("127.0.0.1:1", "--libtorch", variant, "--source", f"file://{tree}", "--source-build",
                      "cc -o train main.c", "--source-bin", "train", "--devices", "cpu:1", home=tmp_path / "h",
                      env={"FDL_LIBTORCH_MIRROR": mirror})
    code, _, err = finish(proc, timeout=120)
    label = {"rocm7.1": "rocm71", "cu128": "cu128"}[variant]
    assert (tmp_path / "h" / ".flodl" / "libtorch" / "precompiled" / label / "lib").is_dir()
    if missing:
        assert code == 2, err
        header = "hip/hip_runtime.h" if vendor == "amd" else "cuda_runtime.h"
        assert f"development headers ({header})" in err and "install: " in err
    else:
        assert code == 1, err
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
