"""Tokens stay out of files people commit (issue 37, item 5): token_file: beside token:, a token file's owner
and mode, tokens under 128 bits refused, and a warning for a literal token in a tracked or readable file."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from fdl.config.project import EnvSelection, load_config
from fdl.config.tokens import MIN_BITS, estimated_bits, strength_problem
from fdl.errors import ConfigError
from tests.conftest import need_root_or_skip

TOKEN = "5f0c1e8a9b2d4c6e8f0a1b3c5d7e9f1a"  # 32 hex digits: 128 bits


def project(root: Path, overlay: str, base: str = "commands: {t: {run: 'true'}}\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "fdl.yml").write_text(base)
    (root / "fdl.farm.yml").write_text(textwrap.dedent(overlay).lstrip("\n"))
    os.chmod(root / "fdl.farm.yml", 0o600)
    return root


def token_file(path: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def load(cwd: Path):
    return load_config(cwd, EnvSelection("farm", "--env"))


OVERLAY = """
    cluster:
      controller:
        host: 10.0.0.1
        join: {discovery: true, token_file: .fdl/farm/token}
    join: {token_file: .fdl/farm/token, bin: /x}
    """


def test_token_file_is_read_relative_to_the_file_that_names_it(tmp_path):
    root = project(tmp_path / "proj", OVERLAY)
    secret = token_file(root / ".fdl" / "farm" / "token")
    (root / "sub" / "deeper").mkdir(parents=True)
    cfg = load(root / "sub" / "deeper")  # from below the project: not relative to the working directory
    join = cfg.cluster.controller.join
    assert (join.token, join.token_file) == (TOKEN, str(secret))
    assert (cfg.join.token, cfg.join.token_file) == (TOKEN, str(secret))
    assert not cfg.warnings


def test_token_and_token_file_together_are_refused_naming_both(tmp_path):
    root = project(tmp_path / "proj", """
        cluster:
          controller:
            join: {token_file: secret}
        """, base=f"cluster:\n  controller:\n    join:\n      token: {TOKEN}\n")
    os.chmod(root / "fdl.yml", 0o600)
    token_file(root / "secret")
    with pytest.raises(ConfigError, match="are both set") as caught:
        load(root)
    assert "fdl.yml:4" in caught.value.message and "fdl.farm.yml" in caught.value.message
    assert "token: null" in caught.value.message and TOKEN not in caught.value.message


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_token_file_group_or_others_may_read_or_change_is_refused(tmp_path, mode):
    root = project(tmp_path / "proj", OVERLAY)
    token_file(root / ".fdl" / "farm" / "token", mode=mode)
    with pytest.raises(ConfigError, match=r"group or others may read or change it \(chmod 600 ") as caught:
        load(root)
    assert "fdl.farm.yml:4" in caught.value.message and TOKEN not in caught.value.message


def test_a_token_file_of_another_account_is_refused(tmp_path):
    need_root_or_skip("gives the token file to another account")
    root = project(tmp_path / "proj", OVERLAY)
    secret = token_file(root / ".fdl" / "farm" / "token")
    os.chown(secret, 65534, 65534)  # nobody: neither this user nor root
    with pytest.raises(ConfigError, match="belongs to uid 65534, not to you"):
        load(root)


@pytest.mark.parametrize("text, says", [("", "does not hold one token"), ("a b\n", "does not hold one token"),
                                         ("hunter2\n", "too weak"), (None, "cannot be opened")])
def test_a_token_file_that_is_missing_empty_or_weak_is_refused(tmp_path, text, says):
    root = project(tmp_path / "proj", OVERLAY)
    if text is not None:
        token_file(root / ".fdl" / "farm" / "token", text)
    with pytest.raises(ConfigError, match=says) as caught:
        load(root)
    assert "hunter2" not in caught.value.message


def test_a_weak_literal_token_is_refused_with_the_command_that_mints_a_good_one(tmp_path):
    """regression: `token: hunter2` was accepted silently."""
    root = project(tmp_path / "proj", "cluster:\n  controller:\n    join: {token: hunter2}\n")
    with pytest.raises(ConfigError, match="too weak") as caught:
        load(root)
    message = caught.value.message
    assert "hunter2" not in message and "secrets.token_hex(32)" in message and f"at least {MIN_BITS}" in message


def test_strength_is_an_upper_bound_on_entropy():
    assert estimated_bits("ab" * 16) == 8 and strength_problem("ab" * 16) is not None  # a 2-digit pattern
    assert estimated_bits("5f0c" * 8) == 16 and estimated_bits(TOKEN) == 128
    assert strength_problem(TOKEN) is None and strength_problem(os.urandom(32).hex()) is None
    assert strength_problem("correct-horse-battery-staple-xyzzy") is None  # 34 characters of 4 classes
    assert strength_problem("hunter2") is not None and strength_problem("0123456789abcdef") is not None


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t",
                        "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


LITERAL = f"cluster:\n  controller:\n    join: {{token: {TOKEN}}}\n"


def test_a_literal_token_in_a_file_git_tracks_warns(tmp_path):
    """regression (issue 37, item 5): an overlay holding the token, committed, drew no warning."""
    root = project(tmp_path / "proj", LITERAL)
    _git(root, "init", "-q")
    assert not load(root).warnings  # untracked and 0600: nothing to say
    _git(root, "add", "fdl.farm.yml")
    (warning,) = load(root).warnings
    assert "fdl.farm.yml holds a literal join token and git tracks it" in warning and "token_file:" in warning
    assert TOKEN not in warning


def test_a_literal_token_in_a_file_others_can_read_warns(tmp_path):
    root = project(tmp_path / "proj", LITERAL)
    os.chmod(root / "fdl.farm.yml", 0o644)
    (warning,) = load(root).warnings
    assert "it is 0644, so other accounts on this box can read the token" in warning


def test_a_token_file_in_a_tracked_overlay_draws_no_warning(tmp_path):
    root = project(tmp_path / "proj", OVERLAY)
    token_file(root / ".fdl" / "farm" / "token")
    os.chmod(root / "fdl.farm.yml", 0o644)
    _git(root, "init", "-q")
    _git(root, "add", "fdl.farm.yml")
    assert not load(root).warnings
