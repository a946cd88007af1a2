"""Files another account planted configure nobody: fdl believes what it finds by walking up (fdl.yml, env overlays,
`.fdl/`) and the project's `libtorch/` only when no other account can have written them (git's safe.directory).

regression (issue 37, finding 1): an fdl.yml another account left in an ancestor directory became the victim's
configuration (its commands ran as the victim), and `fdl probe` run as root below it loaded that directory's
libtorch/lib/libnccl.so.2. The other account is `nobody`, a real account of this machine; its files are made as
root (chown), and it runs fdl itself with `su`.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need_root_or_skip, run_fdl

OTHER = "nobody"
MARKER_LIB = r'''
#include <stdio.h>
__attribute__((constructor)) static void loaded(void) {
    FILE *f = fopen(MARK, "w");
    if (f) { fputs("another account's code ran here\n", f); fclose(f); }
}
int ncclGetVersion(int *v) { if (v) *v = 22705; return 0; }
'''


@pytest.fixture
def other() -> int:
    need_root_or_skip("files of another real account are made with chown, and that account runs fdl with su")
    return pwd.getpwnam(OTHER).pw_uid


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every account can reach (pytest's own temporary directories are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fdl-trust-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def theirs(path: Path, uid: int, text: str | None = None, mode: int = 0o755) -> Path:
    """A directory (or, with text, a file) of the other account."""
    if text is None:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.write_text(text)
        mode = 0o644
    os.chmod(path, mode)
    os.chown(path, uid, -1)
    return path


def planted(root: Path, uid: int, marker: Path) -> Path:
    """Another account's directory with an fdl.yml whose command would leave `marker`; returns a directory below
    it (root's own) to work in."""
    theirs(root, uid)
    theirs(root / "fdl.yml", uid, f"commands:\n  hello:\n    run: touch {marker}\n")
    below = root / "mine"
    below.mkdir()
    return below


def test_a_planted_fdl_yml_above_you_is_refused_naming_the_file_its_owner_and_the_override(tmp_path, other):
    marker = tmp_path / "ran"
    work = planted(tmp_path / "scratch", other, marker)
    shown = run_fdl("config", "show", cwd=work)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    message = shown.stderr
    assert f"{tmp_path / 'scratch' / 'fdl.yml'}" in message and f"{OTHER} (uid {other})" in message
    assert "safe-directories" in message and "FDL_SAFE_DIRECTORIES" in message and "Traceback" not in message
    assert "commands" not in shown.stdout  # nothing from it was read
    ran = run_fdl("hello", cwd=work)
    assert ran.returncode != 0 and not marker.exists()  # its command did not run as us
    twin = run_fdl("config", "show", "--json", cwd=work)
    document = json.loads(twin.stdout)
    assert twin.returncode == 1 and document["ok"] is False and OTHER in document["message"]
    assert "safe-directories" in document["hint"]


def test_the_override_is_a_safe_list_of_your_own_or_the_variable(tmp_path, other):
    work = planted(tmp_path / "scratch", other, tmp_path / "ran")
    shared_dir = str(tmp_path / "scratch")
    by_variable = run_fdl("config", "show", cwd=work, env={"FDL_SAFE_DIRECTORIES": shared_dir})
    assert by_variable.returncode == 0 and "hello" in by_variable.stdout, by_variable.stderr
    config_home = tmp_path / "config"
    (config_home / "fdl").mkdir(parents=True, mode=0o700)
    (config_home / "fdl" / "safe-directories").write_text(f"# a shared checkout I trust\n{shared_dir}\n")
    by_file = run_fdl("config", "show", cwd=work, env={"XDG_CONFIG_HOME": str(config_home)})
    assert by_file.returncode == 0 and "hello" in by_file.stdout, by_file.stderr


def test_in_a_sticky_scratch_your_fdl_yml_counts_and_an_overlay_another_account_left_does_not(tmp_path, other):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o1777)
    os.chmod(scratch, 0o1777)  # like /tmp: anyone may add a file, nobody may replace yours
    (scratch / "fdl.yml").write_text("commands:\n  hello:\n    run: echo mine\n")
    theirs(scratch / "fdl.evil.yml", other, "commands:\n  hello:\n    run: echo theirs\n")
    assert run_fdl("config", "show", cwd=scratch).returncode == 0
    refused = run_fdl("@evil", "config", "show", cwd=scratch)
    assert refused.returncode == 1 and f"{scratch / 'fdl.evil.yml'} is owned by {OTHER}" in refused.stderr
    assert "theirs" not in refused.stdout


def test_a_farm_directory_another_account_owns_or_can_write_is_refused(tmp_path, other):
    project = tmp_path / "project"
    project.mkdir()
    (project / "fdl.yml").write_text("commands: {}\n")
    farm = project / ".fdl"
    farm.mkdir(mode=0o700)
    theirs(farm / "b300", other, mode=0o700)
    refused = run_fdl("config", "show", cwd=project)
    assert refused.returncode == 1 and f"{farm / 'b300'} is owned by {OTHER}" in refused.stderr
    os.chown(farm / "b300", 0, -1)
    os.chmod(farm, 0o777)
    refused = run_fdl("config", "show", cwd=project)
    assert refused.returncode == 1 and f"{farm} can be written by others (mode 0777)" in refused.stderr
    os.chmod(farm, 0o700)
    assert run_fdl("config", "show", cwd=project).returncode == 0


def marker_library(lib_dir: Path, marker: Path) -> Path:
    """A loadable libnccl.so.2 that leaves `marker` the moment anything loads it."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    source = lib_dir.parent / "marker.c"
    source.write_text(MARKER_LIB)
    output = lib_dir / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-DMARK=\"{marker}\"", "-o", str(output), str(source)], check=True)
    source.unlink()
    return output


def test_probe_as_root_loads_no_library_another_account_put_in_the_projects_libtorch(tmp_path, other):
    marker = tmp_path / "loaded"
    project = theirs(tmp_path / "theirs", other)
    marker_library(project / "libtorch" / "lib", marker)
    (project / "libtorch" / "build-version").write_text("2.13.0+cu128\n")
    subprocess.run(["chown", "-R", OTHER, str(project / "libtorch")], check=True)
    done = run_fdl("probe", "--json", "--skip-mount", cwd=project)
    assert not marker.exists(), "fdl probe (root) loaded another account's libnccl.so.2"
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["libtorch"]["status"] == "error", checks["libtorch"]
    assert f"{OTHER} (uid {other})" in checks["libtorch"]["message"]
    assert "safe-directories" in (checks["libtorch"].get("hint") or "")
    # the same tree, made root's own: loaded (the test's library does load when fdl means to load it)
    subprocess.run(["chown", "-R", "root", str(project)], check=True)
    run_fdl("probe", "--json", "--skip-mount", cwd=project)
    assert marker.exists()


def test_probe_below_a_planted_fdl_yml_loads_nothing_from_it(tmp_path, other):
    marker = tmp_path / "loaded"
    work = planted(tmp_path / "theirs", other, tmp_path / "ran")
    marker_library(tmp_path / "theirs" / "libtorch" / "lib", marker)
    subprocess.run(["chown", "-R", OTHER, str(tmp_path / "theirs" / "libtorch")], check=True)
    done = run_fdl("probe", "--skip-mount", cwd=work)
    assert done.returncode == 1 and not marker.exists()
    assert f"{tmp_path / 'theirs' / 'fdl.yml'}" in done.stderr and OTHER in done.stderr


def test_a_worker_below_a_planted_config_does_not_stop_for_good(tmp_path, other):
    # another party's doing: exit 1 (re-dial, and the unit restarts), never 2 (which powers the box off)
    work = planted(tmp_path / "theirs", other, tmp_path / "ran")
    done = run_fdl("join", "127.0.0.1:9", "--bin", "/bin/true", cwd=work, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"{tmp_path / 'theirs' / 'fdl.yml'}" in done.stderr


def test_another_account_runs_fdl_in_a_project_root_owns(shared, other):
    # root is trusted: the tests (and CI) write projects as root that testbed accounts then use
    project = shared / "project"
    project.mkdir()
    (project / "fdl.yml").write_text("commands:\n  hello:\n    run: echo hello from the project\n")
    from tests.integration.launch.helpers import fdl_python

    python = fdl_python(shared / "py")  # this suite's interpreter may sit where nobody cannot enter (/root)
    home = theirs(shared / "home", other)
    line = f"HOME={home} {python} -m fdl config show"
    done = subprocess.run(["su", OTHER, "-s", "/bin/sh", "-c", f"cd {project} && {line}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "hello from the project" in done.stdout, done.stderr
    # and the same account is refused a project directory root cannot vouch for: one a third account owns
    os.chown(project, 1, -1)  # daemon
    done = subprocess.run(["su", OTHER, "-s", "/bin/sh", "-c", f"cd {project} && {line}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "is in" in done.stderr and "which is neither you" in done.stderr
