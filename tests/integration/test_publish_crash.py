"""Crash injection: SIGKILL a publish at spread-out points, 50 times; the served tree always holds one whole, built
run (the previous one until the new one is complete), or nothing when there never was one. And a worker pulling
while publishes flip the served tree gets one whole run or a refusal, never a mix."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fdl.publish.fetch import pull_run
from fdl.publish.manifest import MANIFEST_NAME, TEMP_PATTERNS, ManifestMissing, read_manifest
from fdl.publish.spec import parse_source_spec
from tests.conftest import fdl_env
from tests.integration.publish_support import publish_env

RUNS = 50
# The build hashes exactly the tree it sees; the check recomputes that hash.
RECIPE = "sleep 0.2; mkdir -p out && cat data/*.txt | sha256sum | cut -d' ' -f1 > out/app.tmp && mv out/app.tmp out/app"


def write_version(src: Path, version: int) -> list[str]:
    """Source tree of one version: a version-dependent set of files, each naming its version."""
    data = src / "data"
    data.mkdir(parents=True, exist_ok=True)
    names = [f"f{n:02d}.txt" for n in range(10 + version % 7)]
    for stale in data.iterdir():
        if stale.name not in names:
            stale.unlink()
    for name in names:
        (data / name).write_text(f"v{version} {name}\n" * 200)
    return names


def check_invariant(tree: Path) -> int | None:
    """If a manifest is present, the tree is one whole version and was built from exactly that tree."""
    manifest = read_manifest(tree)
    if manifest is None:
        return None
    assert manifest.built is True
    assert manifest.args[0] == "--version"
    version = int(manifest.args[1])
    names = sorted(p.name for p in (tree / "data").iterdir())
    assert names == sorted(f"f{n:02d}.txt" for n in range(10 + version % 7)), "file set of another version"
    blob = b""
    for name in names:
        text = (tree / "data" / name).read_text()
        assert text == f"v{version} {name}\n" * 200, f"{name} is not from version {version}"
        blob += text.encode()
    assert (tree / "out" / "app").read_text().strip() == hashlib.sha256(blob).hexdigest(), "built from another tree"
    return version


def start_publish(tmp_path: Path, src: Path, env: dict, version: int, recipe: str = RECIPE) -> subprocess.Popen:
    argv = [sys.executable, "-m", "fdl", "publish", f"file://{src}", "--bin", "out/app", "--build", recipe,
            "--no-wait", "--", "--version", str(version)]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: the kill takes the build too


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)
    process.stderr.close()


@pytest.mark.slow
def test_sigkill_at_random_points_always_leaves_one_whole_run_served(tmp_path: Path) -> None:
    home, src = tmp_path / "home", tmp_path / "src"
    home.mkdir()
    served = home / ".flodl" / "run"
    tree = served / "tree"
    env = fdl_env(publish_env(home))
    seed = int(os.environ.get("FDL_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)

    def start(version: int) -> subprocess.Popen:
        return start_publish(tmp_path, src, env, version)

    # The very first publish killed: nothing is served, or the whole first run.
    first_kills = {"nothing": 0, "complete": 0}
    for _attempt in range(5):
        write_version(src, 0)
        process = start(0)
        time.sleep(rng.random() * 0.6)
        kill_group(process)
        seen = check_invariant(tree)
        first_kills["nothing" if seen is None else "complete"] += 1
        if seen is not None:
            break
    # Undisturbed publishes first, each of a new version like the killed ones, to learn how long a whole
    # one takes on this (shared, noisy) box.
    durations = []
    for warmup in (101, 102, 103):
        write_version(src, warmup)
        began = time.monotonic()
        first = start(warmup)
        assert first.wait(timeout=120) == 0, first.stderr.read()
        first.stderr.close()
        durations.append(time.monotonic() - began)
    whole = sorted(durations)[1]
    assert check_invariant(tree) == 103

    # One kill certain to land inside a publish: its build says it started, then waits to be killed.
    building = tmp_path / "building"
    write_version(src, 104)
    process = start_publish(tmp_path, src, env, 104, recipe=f"touch {building} && sleep 300 && {RECIPE}")
    guard = time.monotonic() + 120  # only against a hung test
    while not building.exists() and process.poll() is None and time.monotonic() < guard:
        time.sleep(0.05)
    assert building.exists(), "the build of the publish to kill never started"
    kill_group(process)
    assert check_invariant(tree) == 103, "a publish killed in its build took the served run away"

    outcomes = {"complete": 0, "no manifest": 0, "previous run": 0}
    previous = 103
    for version in range(1, RUNS + 1):
        write_version(src, version)
        # Spread the kills over the whole publish, and past it so some complete.
        delay = whole * 1.4 * (version - 1 + rng.random()) / RUNS
        process = start(version)
        time.sleep(delay)
        kill_group(process)
        try:
            seen = check_invariant(tree)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, publish {version} killed after {delay:.3f}s: {exc}") from None
        if seen == version:
            outcomes["complete"] += 1
            previous = version
        elif seen is None:
            outcomes["no manifest"] += 1
        else:
            assert seen == previous, f"seed {seed}: manifest of run {seen}, expected {previous} or {version}"
            outcomes["previous run"] += 1
    print(f"crash injection (seed {seed}, one publish {whole:.2f}s): first publish killed {first_kills}, "
          f"then {outcomes}")
    # Once a run was published, no kill ever leaves the fleet without one. (How many kills landed inside a
    # publish depends on this box's speed; the kill above is the one certain to.)
    assert outcomes["no manifest"] == 0, f"seed {seed}: {outcomes}"

    # No stale lock and no half-written state stops the next publish.
    write_version(src, RUNS + 1)
    final = start(RUNS + 1)
    assert final.wait(timeout=120) == 0, final.stderr.read()
    final.stderr.close()
    assert check_invariant(tree) == RUNS + 1
    assert [p.name for p in tree.iterdir() if p.name.startswith(MANIFEST_NAME)] == [MANIFEST_NAME]
    assert [p.name for p in tree.iterdir() if any(fnmatch.fnmatchcase(p.name, t) for t in TEMP_PATTERNS)] == []
    assert tree.is_symlink() and sorted(p.name for p in (served / "releases").iterdir()) == ["a", "b"]
    assert [p.name for p in served.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.slow
def test_a_worker_pulling_while_publishes_flip_the_tree_gets_one_whole_run_or_a_refusal(tmp_path: Path) -> None:
    """Publishes run back to back while a worker pulls the served tree again and again: every pull it keeps
    is one whole, built version (file set, contents and build all of one version); the rest it refuses."""
    home, src = tmp_path / "home", tmp_path / "src"
    home.mkdir()
    tree = home / ".flodl" / "run" / "tree"
    env = fdl_env(publish_env(home))
    write_version(src, 0)
    first = start_publish(tmp_path, src, env, 0)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    first.stderr.close()
    spec = parse_source_spec(f"file://{tree}")
    stop = threading.Event()
    pulls = {"whole": 0, "refused": 0, "versions": set()}
    failures: list[str] = []

    def worker() -> None:
        dest = tmp_path / "worker"
        while not stop.is_set():
            try:
                manifest = pull_run(spec, dest)
            except ManifestMissing:
                pulls["refused"] += 1
                continue
            try:
                version = check_invariant(dest)
            except AssertionError as exc:
                failures.append(f"pull of run {manifest.run[:12]}: {exc}")
                return
            pulls["whole"] += 1
            pulls["versions"].add(version)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        for version in range(1, 13):
            write_version(src, version)
            process = start_publish(tmp_path, src, env, version)
            assert process.wait(timeout=120) == 0, process.stderr.read()
            process.stderr.close()
    finally:
        stop.set()
        thread.join(timeout=120)
    print(f"pulls during 12 publishes: {pulls['whole']} whole ({len(pulls['versions'])} versions), "
          f"{pulls['refused']} refused")
    assert failures == []
    assert pulls["whole"] > 0 and len(pulls["versions"]) > 1, pulls
