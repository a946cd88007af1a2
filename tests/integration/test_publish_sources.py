"""Publishing from real sources: a Rust crate through cargo, a local git repository, rsync over a real sshd,
and a worker pulling the served tree through an `rrsync -ro` key."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from fdl.hostside.farm.doors import rrsync_command
from fdl.publish.fetch import pull_run
from fdl.publish.manifest import MANIFEST_NAME, ManifestMissing, read_manifest
from fdl.publish.spec import parse_source_spec
from tests.conftest import run_fdl
from tests.integration.debian_rsync import unpack_rrsync
from tests.integration.git_http import GitHttpServer
from tests.integration.publish_support import LoopbackSshd, git, make_crate, need_cargo_or_skip, publish_env


def publish(home: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return run_fdl("publish", *args, cwd=cwd, env=publish_env(home, **env), timeout=600)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


# --------------------------------------------------------------------------- a real crate, the default recipe


@pytest.mark.slow
def test_rust_crate_gate_with_the_default_recipe(tmp_path: Path) -> None:
    need_cargo_or_skip()
    home, crate = tmp_path / "home", make_crate(tmp_path / "crate", "tiny", "v1")
    home.mkdir()
    result = ok(publish(home, f"file://{crate}", "--bin", "target/release/tiny", "--json", cwd=tmp_path))
    data = json.loads(result.stdout)
    tree = Path(data["tree"])
    binary = tree / "target" / "release" / "tiny"
    assert subprocess.run([binary], capture_output=True, text=True).stdout == "v1\n"
    manifest = read_manifest(tree)
    assert manifest.build == "cargo build --release" and manifest.built is True
    assert manifest.rustc and manifest.rustc.startswith("rustc ")
    # Republish unchanged: the warm target/ survives the refetch, so cargo has nothing to rebuild.
    stamp = binary.stat().st_mtime_ns
    ok(publish(home, f"file://{crate}", "--bin", "target/release/tiny", cwd=tmp_path))
    assert binary.stat().st_mtime_ns == stamp
    # A crate that does not compile publishes nothing, and the previous run stays served.
    before = read_manifest(tree)
    (crate / "src" / "main.rs").write_text("fn main() { this is not rust }\n")
    result = publish(home, f"file://{crate}", "--bin", "target/release/tiny", cwd=tmp_path)
    assert result.returncode == 1
    assert "error" in result.stderr and "the build gate failed: `cargo build --release` exited" in result.stderr
    assert read_manifest(tree) == before and "this is not rust" not in (tree / "src" / "main.rs").read_text()


# --------------------------------------------------------------------------- git


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("v1\n")
    (repo / "old.txt").write_text("only in v1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "tag", "v1")
    (repo / "a.txt").write_text("v2\n")
    git(repo, "rm", "-q", "old.txt")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "tag", "v2")
    git(repo, "checkout", "-q", "-b", "feature/next")
    (repo / "a.txt").write_text("next\n")
    git(repo, "commit", "-q", "-am", "three")
    git(repo, "checkout", "-q", "main")
    return repo


GIT_BUILD = "mkdir -p out && cat a.txt > out/app"


def test_git_source_pins_tags_branches_and_commits(tmp_path: Path, repo: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    tree = home / ".flodl" / "run" / "tree"

    def at(ref: str) -> dict:
        result = ok(publish(home, f"git+file://{repo}#{ref}", "--bin", "out/app", "--build", GIT_BUILD, "--json",
                            cwd=tmp_path))
        return json.loads(result.stdout)

    first = at("v1")
    assert (tree / "out" / "app").read_text() == "v1\n" and (tree / "old.txt").exists()
    assert first["source"]["commit"] == git(repo, "rev-parse", "v1")
    assert first["manifest"]["origin"] == f"git+file://{repo}#v1"
    (tree / "target").mkdir()
    (tree / "target" / "cache").write_text("warm")
    (tree / "stray.txt").write_text("not in the repository")
    at("v2")
    assert (tree / "out" / "app").read_text() == "v2\n"
    assert not (tree / "old.txt").exists() and not (tree / "stray.txt").exists()
    assert (tree / "target" / "cache").read_text() == "warm"  # untracked build output is kept
    at("feature/next")
    assert (tree / "out" / "app").read_text() == "next\n"
    sha = git(repo, "rev-parse", "v1")
    assert at(sha)["source"]["commit"] == sha
    assert at(sha[:10])["source"]["commit"] == sha  # an abbreviated commit is found among the branches
    assert (tree / "a.txt").read_text() == "v1\n"


def test_unknown_git_ref_publishes_nothing(tmp_path: Path, repo: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ok(publish(home, f"git+file://{repo}#v1", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))
    result = publish(home, f"git+file://{repo}#v9", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path)
    assert result.returncode == 1
    assert f"fetching git+file://{repo}#v9 failed" in result.stderr and "Nothing was published" in result.stderr
    assert read_manifest(home / ".flodl" / "run" / "tree").origin == f"git+file://{repo}#v1"


def test_file_and_git_sources_can_take_turns_in_the_same_served_dir(tmp_path: Path, repo: Path) -> None:
    home, src = tmp_path / "home", tmp_path / "src"
    home.mkdir()
    src.mkdir()
    (src / "a.txt").write_text("from a directory\n")
    (src / "only-in-dir.txt").write_text("x\n")
    tree = home / ".flodl" / "run" / "tree"
    ok(publish(home, f"file://{src}", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))
    ok(publish(home, f"git+file://{repo}#v1", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))
    assert (tree / "out" / "app").read_text() == "v1\n"
    assert not (tree / "only-in-dir.txt").exists()
    ok(publish(home, f"file://{src}", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))
    assert (tree / "out" / "app").read_text() == "from a directory\n"
    assert not (tree / "old.txt").exists()


@pytest.fixture
def git_http(tmp_path: Path, repo: Path):
    """The test repository served over smart HTTP on loopback, behind basic authentication."""
    served = tmp_path / "git-http"
    served.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(served / "repo.git")], check=True)
    server = GitHttpServer(served, "oauth2", "tok-" + os.urandom(12).hex()).start()
    yield server
    server.stop()


def _git_shim(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose git records its command line before it runs the real one."""
    shim_dir, log = tmp_path / "shim", tmp_path / "git-argv.log"
    shim_dir.mkdir()
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    (shim_dir / "git").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n')
    (shim_dir / "git").chmod(0o755)
    return os.pathsep.join([str(shim_dir), publish_env(tmp_path)["PATH"]]), log


def test_credentials_in_a_git_url_leave_no_trace_in_the_tree_the_report_or_the_json(tmp_path: Path,
                                                                                   git_http: GitHttpServer) -> None:
    """regression: `fdl publish 'git+https://oauth2:TOKEN@host/o/r#main'` wrote the URL with its userinfo into
    .fdl-run.yml (0644, served to every worker through door b) and printed it twice in the report."""
    home = tmp_path / "home"
    home.mkdir()
    # the user's own git configuration stores credentials: fdl's fetch must not hand it the URL's
    (home / ".gitconfig").write_text("[credential]\n\thelper = store\n")
    token = git_http.password
    spec = f"git+http://oauth2:{token}@127.0.0.1:{git_http.port}/repo.git"
    shown = f"git+http://127.0.0.1:{git_http.port}/repo.git"
    path, argv_log = _git_shim(tmp_path)
    human = ok(publish(home, f"{spec}#v1", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path, PATH=path))
    data = json.loads(ok(publish(home, f"{spec}#v2", "--bin", "out/app", "--build", GIT_BUILD, "--json",
                                 cwd=tmp_path, PATH=path)).stdout)
    assert f"oauth2:{token}" in git_http.seen  # the credentials were used, through git's own protocol
    assert data["manifest"]["origin"] == f"{shown}#v2" and data["source"]["spec"] == f"{shown}#v2"
    assert "published run" in human.stdout and f"from {shown}#v1" in human.stdout
    assert "carried a user or password" in human.stderr
    tree = home / ".flodl" / "run" / "tree"
    assert (tree / "out" / "app").read_text() == "v2\n"
    failed = publish(home, f"{spec}#no-such-ref", "--bin", "out/app", "--build", GIT_BUILD, "--json", cwd=tmp_path,
                     PATH=path)
    assert failed.returncode == 1 and json.loads(failed.stdout)["ok"] is False
    assert f"fetching {shown}#no-such-ref failed" in failed.stderr
    unparsed = publish(home, spec, "--bin", "out/app", "--json", cwd=tmp_path, PATH=path)  # no #ref
    assert unparsed.returncode == 1 and f"'{shown}' does not parse" in unparsed.stderr
    for result in (human, failed, unparsed):
        assert token not in result.stdout + result.stderr and "oauth2" not in result.stdout + result.stderr
    assert token not in json.dumps(data)
    leaks = [str(p) for p in (home / ".flodl").rglob("*") if p.is_file() and not p.is_symlink()
             and (token.encode() in p.read_bytes() or b"oauth2" in p.read_bytes())]
    assert leaks == []  # the manifest, .git/config, FETCH_HEAD, the reflogs: nowhere in the served directory
    assert not (home / ".git-credentials").exists()  # the user's store helper never saw them
    assert argv_log.read_text() and token not in argv_log.read_text()  # never on git's command line
    # Without the credentials the server refuses: they were needed, and used only through the helper.
    refused = publish(home, f"{shown}#v1", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path, PATH=path)
    assert refused.returncode == 1 and "Nothing was published" in refused.stderr


@pytest.mark.parametrize("place, text, why", [
    ("target/leak", "SECRET", "absolute"),
    ("sub/target/leak", "../../../secret/id", "climbs above the tree root as written"),
    ("libtorch/home", "HOME", "absolute"),
    ("sub/target/deep/home", "../../../../../home", "climbs above the tree root as written"),
])
def test_git_source_with_a_committed_link_out_of_the_tree_under_build_output_is_refused(tmp_path: Path, place: str,
                                                                                         text: str, why: str) -> None:
    """regression: the link check skipped every real directory named target/ and the top-level libtorch/ as build
    output, but a git source checks tracked files out there: `target/leak -> ~/.ssh/secret_key` and
    `libtorch/home -> ~` were published with rc 0 and served through door b."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "secret_key").write_text("PRIVATE\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("v1\n")
    link = repo / place
    link.parent.mkdir(parents=True, exist_ok=True)
    target = {"SECRET": str(home / ".ssh" / "secret_key"), "HOME": str(home)}.get(text, text)
    link.symlink_to(target)
    git(repo, "add", "-f", ".")
    git(repo, "commit", "-q", "-m", "one")
    result = publish(home, f"git+file://{repo}#main", "--bin", "out/app", "--build", GIT_BUILD, "--json",
                     cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert json.loads(result.stdout)["ok"] is False
    assert f"{place} -> {target}  ({why}" in result.stderr, result.stderr
    assert "Nothing was published: nothing is served yet" in result.stderr
    assert not (home / ".flodl" / "run" / "tree").exists()


def _slot(path: Path) -> dict[str, str]:
    """What a release slot holds, entry by entry (a link's text, a file's bytes, a directory), its git repository
    aside (a fetch's objects are a cache): the picture a refused publish must leave as it found it."""
    out = {}
    for entry in sorted(path.rglob("*")):
        rel = entry.relative_to(path).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        out[rel] = (f"-> {os.readlink(entry)}" if entry.is_symlink() else "dir" if entry.is_dir()
                    else entry.read_bytes().hex())
    return out


@pytest.mark.parametrize("clean", ["file", "git"])
def test_a_refused_git_source_leaves_the_staging_slot_as_it_found_it(tmp_path: Path, repo: Path, clean: str) -> None:
    """regression (issue 38 item 16): a git source whose committed target/ and libtorch/ link out of the tree was
    refused after its checkout, and the kept target/ and libtorch/ of the staging slot carried its links on: the
    next publish of a clean file:// source to the same --to failed listing them, every time."""
    home, src, served = tmp_path / "home", tmp_path / "src", tmp_path / "served"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id").write_text("PRIVATE\n")
    src.mkdir()
    (src / "a.txt").write_text("from a directory\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    git(bad, "init", "-q", "-b", "main")
    (bad / "a.txt").write_text("bad\n")
    (bad / "target").mkdir()
    (bad / "target" / "leak").symlink_to(home / ".ssh" / "id")
    (bad / "libtorch").symlink_to(home)
    git(bad, "add", "-f", ".")
    git(bad, "commit", "-q", "-m", "links out")
    spec = f"file://{src}" if clean == "file" else f"git+file://{repo}#v1"
    args = ("--bin", "out/app", "--build", GIT_BUILD, "--to", str(served))
    ok(publish(home, spec, *args, cwd=tmp_path))
    ok(publish(home, spec, *args, cwd=tmp_path))  # both slots hold a run; the next publish stages into a
    stage = served / "releases" / "a"
    (stage / "target").mkdir(exist_ok=True)
    (stage / "target" / "cache").write_text("warm")  # a failed build's output, kept in the slot for the next
    before, had_repo = _slot(stage), (stage / ".git").is_dir()
    assert read_manifest(stage) is not None

    refused = publish(home, f"git+file://{bad}#main", *args, "--json", cwd=tmp_path)
    assert refused.returncode == 1 and json.loads(refused.stdout)["ok"] is False
    assert f"target/leak -> {home / '.ssh' / 'id'}  (absolute" in refused.stderr, refused.stderr
    assert f"libtorch -> {home}  (absolute" in refused.stderr
    assert "Nothing was published: the previous run stays served" in refused.stderr
    assert _slot(stage) == before  # its files, its build output and its manifest, as they were
    assert (stage / ".git").is_dir() == had_repo  # no repository of the refused source's own

    again = ok(publish(home, spec, *args, "--json", cwd=tmp_path))
    assert json.loads(again.stdout)["manifest"]["run"] and "reach outside the tree" not in again.stderr
    assert (served / "tree" / "out" / "app").read_text() == ("from a directory\n" if clean == "file" else "v1\n")
    assert not [p for p in (served / "releases").rglob("*") if p.is_symlink() and not p.resolve().is_relative_to(
        served)]


def test_links_taken_out_by_a_refusal_after_the_build_do_not_stay_in_the_slot(tmp_path: Path, repo: Path) -> None:
    """A build that links out of the tree is refused, and the link goes with the refusal: the next publish, whose
    build makes none, is not refused for it (the slot keeps a failed build's target/ for a warm rebuild)."""
    home = tmp_path / "home"
    home.mkdir()
    args = ("--bin", "out/app", "--to", str(tmp_path / "served"))
    ok(publish(home, f"git+file://{repo}#v1", *args, "--build", GIT_BUILD, cwd=tmp_path))
    refused = publish(home, f"git+file://{repo}#v2", *args, "--build",
                      f"{GIT_BUILD} && mkdir -p target/release && echo warm > target/release/cache && "
                      f"ln -s {home} target/release/home", cwd=tmp_path)
    assert refused.returncode == 1 and f"target/release/home -> {home}  (absolute" in refused.stderr
    stage = tmp_path / "served" / "releases" / "b"
    assert not (stage / "target" / "release" / "home").is_symlink()
    assert (stage / "target" / "release" / "cache").read_text() == "warm\n"
    ok(publish(home, f"git+file://{repo}#v2", *args, "--build", GIT_BUILD, cwd=tmp_path))


def test_a_link_out_of_the_tree_made_by_the_build_is_refused(tmp_path: Path, repo: Path) -> None:
    """regression: build output was never checked, so a recipe (or a build script) that links target/ to a place
    outside the tree published it."""
    home = tmp_path / "home"
    home.mkdir()
    ok(publish(home, f"git+file://{repo}#v1", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))
    before = read_manifest(home / ".flodl" / "run" / "tree")
    result = publish(home, f"git+file://{repo}#v2", "--bin", "out/app", "--build",
                     f"{GIT_BUILD} && mkdir -p target/release && ln -s {home} target/release/home", cwd=tmp_path)
    assert result.returncode == 1
    assert "after the build, the tree holds 1 symbolic link(s) that reach outside the tree" in result.stderr
    assert f"target/release/home -> {home}  (absolute" in result.stderr
    assert read_manifest(home / ".flodl" / "run" / "tree") == before  # the previous run stays served


# --------------------------------------------------------------------------- rsync over a real sshd


@pytest.fixture
def sshd(tmp_path: Path):
    server = LoopbackSshd(tmp_path / "sshd").start()
    yield server
    server.stop()


def test_rsync_source_is_pulled_over_ssh_with_the_identity(tmp_path: Path, sshd: LoopbackSshd) -> None:
    home, src = tmp_path / "home", tmp_path / "remote-src"
    home.mkdir()
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("remote\n")
    sshd.authorize()
    spec = f"rsync://{sshd.user}@127.0.0.1:{sshd.port}:{src}"
    result = ok(publish(home, spec, "--identity", str(sshd.client_key), "--cwd", "sub", "--bin", "out/app",
                        "--build", GIT_BUILD, cwd=tmp_path, RSYNC_RSH=sshd.rsync_rsh))
    tree = home / ".flodl" / "run" / "tree"
    assert (tree / "sub" / "out" / "app").read_text() == "remote\n"
    assert yaml.safe_load((tree / MANIFEST_NAME).read_text())["origin"] == spec
    assert "pulled" in result.stderr
    # A key the host does not accept is refused, and nothing is published.
    sshd.authorized_keys.write_text("")
    result = publish(home, spec, "--identity", str(sshd.client_key), "--cwd", "sub", "--bin", "out/app",
                     "--build", GIT_BUILD, cwd=tmp_path, RSYNC_RSH=sshd.rsync_rsh)
    assert result.returncode == 1 and "ssh could not connect or log in" in result.stderr, result.stderr
    assert yaml.safe_load((tree / MANIFEST_NAME).read_text())["origin"] == spec  # the previous run stays


def test_worker_pulls_through_an_rrsync_ro_key(tmp_path: Path, sshd: LoopbackSshd) -> None:
    home, src = tmp_path / "home", tmp_path / "src"
    home.mkdir()
    src.mkdir()
    (src / "a.txt").write_text("served\n")
    served = home / ".flodl" / "run"
    sshd.authorize(f'command="{rrsync_command(str(served))}",restrict')
    spec = parse_source_spec(f"rsync://{sshd.user}@127.0.0.1:{sshd.port}:/tree")
    worker = tmp_path / "worker" / "tree"
    env = dict(os.environ, RSYNC_RSH=sshd.rsync_rsh)

    # Before any publish the served tree does not exist: no run, a transient state.
    with pytest.raises(ManifestMissing):
        pull_run(spec, worker, identity=str(sshd.client_key), env=env)

    data = json.loads(ok(publish(home, f"file://{src}", "--bin", "out/app", "--build", GIT_BUILD, "--json",
                                 cwd=tmp_path)).stdout)
    rrsync_spelling = next(w for w in data["worker_sources"] if w["key"] == "rrsync")
    assert rrsync_spelling["authorized_keys_options"] == f'command="{rrsync_command(str(served))}",restrict'

    manifest = pull_run(spec, worker, identity=str(sshd.client_key), env=env)
    assert manifest.run == data["run"]
    assert (worker / "out" / "app").read_text() == "served\n"
    assert read_manifest(worker) == manifest

    # The plain spelling (the absolute path) is rooted twice behind rrsync and fails.
    absolute = parse_source_spec(f"rsync://{sshd.user}@127.0.0.1:{sshd.port}:{served}/tree")
    with pytest.raises(ManifestMissing, match=f"the tree is rsync://{sshd.user}@127.0.0.1:{sshd.port}:/tree"):
        pull_run(absolute, tmp_path / "worker2", identity=str(sshd.client_key), env=env)

    # The key can read the served directory and nothing else: no writes, no escape, no shell.
    (tmp_path / "upload.txt").write_text("x")
    pushed = sshd.rsync(str(tmp_path / "upload.txt"), f"{sshd.user}@127.0.0.1:/tree/upload.txt")
    assert pushed.returncode != 0 and "read-only server is not allowed" in pushed.stderr
    assert not (served / "tree" / "upload.txt").exists()
    escaped = sshd.rsync(f"{sshd.user}@127.0.0.1:/../../../etc/hostname", str(tmp_path / "escaped"))
    assert escaped.returncode != 0 and "do not use .." in escaped.stderr
    rerooted = sshd.rsync(f"{sshd.user}@127.0.0.1:/etc/hostname", str(tmp_path / "escaped"))
    assert rerooted.returncode != 0  # /etc/hostname means <served>/etc/hostname here
    assert not (tmp_path / "escaped").exists()
    shell = sshd.ssh("cat", "/etc/hostname")
    assert shell.returncode != 0 and "does not run rsync" in shell.stderr


def test_a_pull_refuses_a_tree_copied_across_a_publish(tmp_path: Path) -> None:
    """The worker's consistency check, on a file:// source: the manifest changed during the copy."""
    home, src = tmp_path / "home", tmp_path / "src"
    home.mkdir()
    src.mkdir()
    (src / "a.txt").write_text("one\n")
    ok(publish(home, f"file://{src}", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))
    served_tree = home / ".flodl" / "run" / "tree"
    spec = parse_source_spec(f"file://{served_tree}")
    notes: list[str] = []

    def republish_midway(text: str) -> None:
        notes.append(text)
        if len(notes) == 1:  # called once the tree has been copied, before the manifest is read again
            ok(publish(home, f"file://{src}", "--bin", "out/app", "--build", GIT_BUILD, cwd=tmp_path))

    with pytest.raises(ManifestMissing, match="while its tree was being copied"):
        pull_run(spec, tmp_path / "worker", note=republish_midway)
    assert not (tmp_path / "worker" / MANIFEST_NAME).exists()
    manifest = pull_run(spec, tmp_path / "worker")
    assert manifest == read_manifest(served_tree)


# --------------------------------------------------------------------------- Debian 12's own rrsync doors

BOOKWORM_RSYNC = "3.2.7"  # the rsync bookworm released with; its point releases since ship 3.5.0


@pytest.fixture(scope="session")
def bookworm_rrsync(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian 12's release rrsync (3.2.7) with its own rsync, unpacked from the Debian package itself."""
    return unpack_rrsync(BOOKWORM_RSYNC, tmp_path_factory.mktemp("bookworm-rsync"))


@pytest.mark.parametrize("door", ["installed", "bookworm-release"])
def test_rrsync_door_of_debian_12(door: str, tmp_path: Path, sshd: LoopbackSshd, request) -> None:
    """Regression: behind Debian 12's release rrsync (3.2.7), an absolute path exits 23 with no
    "rrsync error" text; the worker must still name the re-rooted spelling, and the installed
    rrsync (3.5.0 on an updated Debian 12, exit 12) must read the same."""
    rrsync = "/usr/bin/rrsync" if door == "installed" else request.getfixturevalue("bookworm_rrsync")
    assert os.path.exists(rrsync), "rsync's rrsync is missing (scripts/apt-test.txt lists rsync)"
    home, src = tmp_path / "home", tmp_path / "src"
    home.mkdir()
    src.mkdir()
    (src / "a.txt").write_text("served\n")
    served = home / ".flodl" / "run"
    sshd.authorize(f'command="{rrsync} -ro {served}",restrict')
    env = dict(os.environ, RSYNC_RSH=sshd.rsync_rsh)
    at = f"rsync://{sshd.user}@127.0.0.1:{sshd.port}:"
    rerooted, absolute = parse_source_spec(f"{at}/tree"), parse_source_spec(f"{at}{served}/tree")

    # Nothing served yet (the directory does not exist): transient, for either spelling.
    for spec in (rerooted, absolute):
        with pytest.raises(ManifestMissing, match="no run is published"):
            pull_run(spec, tmp_path / "w0", identity=str(sshd.client_key), env=env)

    data = json.loads(ok(publish(home, f"file://{src}", "--bin", "out/app", "--build", GIT_BUILD, "--json",
                                 cwd=tmp_path)).stdout)
    manifest = pull_run(rerooted, tmp_path / "w1", identity=str(sshd.client_key), env=env)
    assert manifest.run == data["run"] and (tmp_path / "w1" / "out" / "app").read_text() == "served\n"

    with pytest.raises(ManifestMissing, match=f"the tree is {at}/tree there") as caught:
        pull_run(absolute, tmp_path / "w2", identity=str(sshd.client_key), env=env)
    assert caught.value.hint.endswith(f"{at}/tree")
    # A path that is not there under either spelling: nothing published there, not a spelling problem.
    with pytest.raises(ManifestMissing, match="no run is published"):
        pull_run(parse_source_spec(f"{at}/elsewhere/served"), tmp_path / "w3", identity=str(sshd.client_key),
                 env=env)
