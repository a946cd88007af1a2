"""Whose files fdl believes (fdl.hostside.trust): git's safe.directory rule, with real other accounts.

regression (issue 37, finding 1): discovery walked up to / and believed any fdl.yml another account left in an
ancestor, and `fdl probe` as root loaded another account's libtorch/lib/libnccl.so.2; (finding 4): publish
served from a directory another account could write.

The other account is `nobody`, a real account of this machine: its files are made by chown as root, which the
tests need (they skip elsewhere, and fail under CI=true).
"""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path

import pytest

from fdl.hostside import trust
from tests.conftest import need_root_or_skip

OTHER = "nobody"


@pytest.fixture
def other() -> int:
    need_root_or_skip("files of another real account are made with chown")
    return pwd.getpwnam(OTHER).pw_uid


def made(path: Path, *, mode: int, uid: int | None = None, text: str | None = None) -> Path:
    if text is None:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), **extra}


def test_your_file_in_your_directory_is_believed(tmp_path):
    project = made(tmp_path / "p", mode=0o755)
    assert trust.entry_refusal(made(project / "fdl.yml", mode=0o644, text="{}"), env(tmp_path)) is None
    assert trust.entry_refusal(project / "missing.yml", env(tmp_path)) is None  # nothing there: nothing to judge


def test_a_directory_another_account_owns_is_refused_naming_the_file_and_the_owner(tmp_path, other):
    project = made(tmp_path / "theirs", mode=0o755, uid=other)
    found = made(project / "fdl.yml", mode=0o644, text="{}")  # root's own file, in their directory
    problem = trust.entry_refusal(found, env(tmp_path))
    assert problem is not None and str(found) in problem and f"{OTHER} (uid {other})" in problem


def test_in_a_sticky_world_writable_directory_your_file_counts_and_theirs_does_not(tmp_path, other):
    scratch = made(tmp_path / "scratch", mode=0o1777)  # like /tmp
    mine = made(scratch / "fdl.yml", mode=0o644, text="{}")
    theirs = made(scratch / "fdl.evil.yml", mode=0o644, uid=other, text="{}")
    assert trust.entry_refusal(mine, env(tmp_path)) is None
    problem = trust.entry_refusal(theirs, env(tmp_path))
    assert problem is not None and f"is owned by {OTHER} (uid {other})" in problem


def test_a_directory_or_file_others_can_write_is_refused(tmp_path, other):
    open_dir = made(tmp_path / "open", mode=0o777)  # not sticky: anyone may replace what is in it
    problem = trust.entry_refusal(made(open_dir / "fdl.yml", mode=0o644, text="{}"), env(tmp_path))
    assert problem is not None and "others can write (mode 0777)" in problem
    group = made(tmp_path / "group", mode=0o775)
    os.chown(group, -1, grp.getgrnam("users").gr_gid)  # a group other accounts are in
    assert "group can write" in (trust.entry_refusal(made(group / "fdl.yml", mode=0o644, text="{}"),
                                                      env(tmp_path)) or "")
    os.chown(group, -1, pwd.getpwuid(os.geteuid()).pw_gid)  # the owner's own private group (umask 002): closed
    assert trust.entry_refusal(group / "fdl.yml", env(tmp_path)) is None
    loose = made(made(tmp_path / "ok", mode=0o755) / "fdl.yml", mode=0o666, text="{}")
    assert "can be written by others (mode 0666)" in (trust.entry_refusal(loose, env(tmp_path)) or "")


def test_a_link_is_judged_by_what_it_points_at_too(tmp_path, other):
    theirs = made(made(tmp_path / "theirs", mode=0o755, uid=other) / "fdl.yml", mode=0o644, uid=other, text="{}")
    project = made(tmp_path / "p", mode=0o755)
    (project / "fdl.yml").symlink_to(theirs)
    problem = trust.entry_refusal(project / "fdl.yml", env(tmp_path))
    assert problem is not None and problem.startswith(f"{project / 'fdl.yml'} links to {theirs}")


def test_the_safe_list_in_your_config_and_the_variable_lift_the_refusal(tmp_path, other):
    project = made(tmp_path / "shared", mode=0o755, uid=other)
    found = made(project / "fdl.yml", mode=0o644, uid=other, text="{}")
    environ = env(tmp_path)
    assert trust.entry_refusal(found, environ) is not None
    assert trust.entry_refusal(found, {**environ, "FDL_SAFE_DIRECTORIES": f"/elsewhere:{project}"}) is None
    assert trust.entry_refusal(found, {**environ, "FDL_SAFE_DIRECTORIES": f"{tmp_path}/*"}) is None  # DIR/* below
    safe = trust.safe_file(environ)
    made(safe.parent, mode=0o700)
    safe.write_text(f"# shared checkouts\n{project}\n")
    assert trust.entry_refusal(found, environ) is None
    hint = trust.override_hint(project, {**environ, "XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert str(project) in hint and "FDL_SAFE_DIRECTORIES" in hint and "safe-directories" in hint


def test_a_safe_list_another_account_could_edit_is_ignored_and_the_hint_says_so(tmp_path, other):
    project = made(tmp_path / "shared", mode=0o755, uid=other)
    found = made(project / "fdl.yml", mode=0o644, uid=other, text="{}")
    environ = env(tmp_path)
    safe = trust.safe_file(environ)
    made(safe.parent, mode=0o700)
    made(safe, mode=0o666, text=f"{project}\n")  # others could have added the line
    assert trust.entry_refusal(found, environ) is not None
    assert "fdl ignores it" in trust.override_hint(project, environ)
    os.chmod(safe, 0o644)
    os.chown(safe, other, -1)  # theirs, in your directory
    assert trust.entry_refusal(found, environ) is not None
    os.chown(safe, 0, -1)
    assert trust.entry_refusal(found, environ) is None


def test_under_a_project_libtorch_every_directory_down_to_lib_is_judged(tmp_path, other):
    project = made(tmp_path / "p", mode=0o755)
    root = made(project / "libtorch", mode=0o755)
    lib = made(root / "precompiled" / "cu128" / "lib", mode=0o755)
    assert trust.tree_refusal(root, lib, env(tmp_path)) is None
    os.chown(lib.parent, other, -1)
    problem = trust.tree_refusal(root, lib, env(tmp_path))
    assert problem is not None and str(lib.parent) in problem and OTHER in problem
    os.chown(lib.parent, 0, -1)
    os.chmod(lib, 0o1777)  # sticky is no excuse below libtorch/: a library anyone could add
    assert "can be written by others (mode 1777)" in (trust.tree_refusal(root, lib, env(tmp_path)) or "")
    os.chmod(lib, 0o755)
    outside = made(tmp_path / "elsewhere" / "lib", mode=0o755)
    (root / "builds").mkdir()
    (root / "builds" / "x").symlink_to(outside.parent)
    assert "outside" in (trust.tree_refusal(root, root / "builds" / "x" / "lib", env(tmp_path)) or "")


def test_a_served_directory_others_can_write_or_own_is_refused_up_to_home(tmp_path, other):
    home = made(tmp_path / "home", mode=0o755)
    served = made(home / ".flodl" / "run", mode=0o755)
    assert trust.served_refusal(served, home) is None
    assert trust.served_refusal(home / "not" / "yet", home) is None  # made later, closed
    os.chmod(served, 0o777)
    assert "the served directory" in (trust.served_refusal(served, home) or "")
    os.chmod(served, 0o1777)  # sticky does not help the served directory itself
    assert trust.served_refusal(served, home) is not None
    os.chmod(served, 0o755)
    os.chown(served.parent, other, -1)
    problem = trust.served_refusal(served, home)
    assert problem is not None and f"{served.parent}, a parent of the served directory" in problem
    assert OTHER in problem
    os.chown(served.parent, 0, -1)
    os.chmod(home, 0o775)  # the home is the last directory judged
    os.chown(home, -1, grp.getgrnam("users").gr_gid)
    assert f"{home}, a parent of the served directory" in (trust.served_refusal(served, home) or "")
    os.chmod(tmp_path, 0o777)  # above the home: not judged
    os.chmod(home, 0o755)
    assert trust.served_refusal(served, home) is None
    os.chmod(tmp_path, 0o700)


def test_a_served_directory_in_a_sticky_scratch_of_yours_is_fine_and_theirs_is_not(tmp_path, other):
    scratch = made(tmp_path / "scratch", mode=0o1777)  # root-owned and sticky, like /tmp: where the walk stops
    mine = made(scratch / "run", mode=0o755)
    assert trust.served_refusal(mine, None) is None
    theirs = made(scratch / "their-run", mode=0o755, uid=other)
    assert OTHER in (trust.served_refusal(theirs, None) or "")
    unsticky = made(tmp_path / "open", mode=0o777)
    assert "a parent of the served directory" in (trust.served_refusal(made(unsticky / "run", mode=0o755), None)
                                                  or "")


def test_as_root_under_sudo_the_account_that_ran_sudo_counts_as_you(tmp_path, other):
    # git's rule: root running for an account through sudo believes that account's files, and nobody else's
    project = made(tmp_path / "theirs", mode=0o755, uid=other)
    found = made(project / "fdl.yml", mode=0o644, uid=other, text="{}")
    assert trust.entry_refusal(found, env(tmp_path)) is not None
    assert trust.entry_refusal(found, env(tmp_path, SUDO_UID=str(other))) is None
    assert trust.entry_refusal(found, env(tmp_path, SUDO_UID="1")) is not None
