"""authorized_keys editing: identity by key material, foreign lines byte for byte, atomic rewrite."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fdl.hostside.farm import authorized_keys as ak
from fdl.hostside.farm.authorized_keys import (
    AuthorizedKeysError,
    KeyIdentity,
    check_permissions,
    install_line,
    line_identity,
    parse_public_key,
    plan_install,
    plan_remove,
    remove_keys,
    split_lines,
)
from tests.conftest import need_root_or_skip

REPO = Path(__file__).resolve().parents[4]
OURS = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOursOursOursOursOursOursOursOursOursOurs01"
NEWER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINewNewNewNewNewNewNewNewNewNewNewNewNew0002"
KEY = parse_public_key(OURS)
NEW_KEY = parse_public_key(NEWER)
LINE = f'restrict,port-forwarding,permitopen="127.0.0.1:1337" {OURS} fdl-farm-lab'
NEW_LINE = f'restrict,port-forwarding,permitopen="127.0.0.1:1337" {NEWER} fdl-farm-lab'


def foreign_lines(data: bytes) -> list[tuple[bytes, bytes]]:
    """(content, ending) of every line not carrying one of our keys."""
    return [(ln.content, ln.eol) for ln in split_lines(data) if line_identity(ln.content) not in (KEY, NEW_KEY)]


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize("line, expected", [
    (OURS, KEY),
    (f"{OURS} some comment", KEY),
    (f'command="echo a b",restrict {OURS} c', KEY),
    (f'  \tno-pty,command="say \\"hi there\\"" {OURS}', KEY),
    (f'environment="A=b c",from="10.0.0.0/8" {OURS}', KEY),
    (f"# {OURS}", None),
    ("", None),
    ("   ", None),
    ("garbage that is not a key", None),
    ("ssh-ed25519 not*base64", None),
])
def test_line_identity_is_the_key_material(line, expected):
    assert line_identity(line.encode()) == expected


def test_identity_ignores_options_and_comments_but_not_the_blob():
    other = parse_public_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOther03")
    assert line_identity(f'no-pty {OURS} x'.encode()) == line_identity(f"{OURS} y".encode())
    assert other != KEY


# --------------------------------------------------------------------------- planning


def test_append_to_file_without_trailing_newline_keeps_the_foreign_bytes_as_a_prefix():
    data = b"# hello\r\nssh-rsa AAAAB3NzaC1yc2E= x\r\nlast-line-no-newline"
    edit = plan_install(data, LINE, KEY)
    assert edit.action == "added"
    assert edit.data.startswith(data)
    assert edit.data == data + b"\r\n" + LINE.encode() + b"\r\n"  # the file's own CRLF style


def test_replace_in_place_keeps_position_and_line_ending():
    data = f"# a\n{OURS} old-comment\r\n# b\n".encode()
    edit = plan_install(data, LINE, KEY)
    assert edit.action == "replaced"
    assert edit.data == f"# a\n{LINE}\r\n# b\n".encode()


def test_rerun_is_byte_identical():
    once = plan_install(b"# x\n", LINE, KEY).data
    again = plan_install(once, LINE, KEY)
    assert again.action == "unchanged" and again.data == once


def test_duplicates_of_our_key_collapse_to_one():
    data = f"{OURS} a\n# keep\n{OURS} b\n".encode()
    edit = plan_install(data, LINE, KEY)
    assert edit.data == f"{LINE}\n# keep\n".encode() and edit.removed == 1


def test_rotation_replaces_the_retired_key_where_it_stood():
    data = f"# top\n{LINE}\n# bottom".encode()
    edit = plan_install(data, NEW_LINE, NEW_KEY, retire=(KEY,))
    assert edit.data == f"# top\n{NEW_LINE}\n# bottom".encode()


def test_a_line_not_carrying_the_key_is_refused():
    with pytest.raises(AuthorizedKeysError):
        plan_install(b"", NEW_LINE, KEY)
    with pytest.raises(AuthorizedKeysError):
        plan_install(b"", LINE + "\nssh-rsa AAAA", KEY)


def test_remove_takes_out_only_our_lines():
    data = f"# a\r\n{OURS}\r\n\r\nx".encode()
    edit = plan_remove(data, (KEY,))
    assert edit.data == b"# a\r\n\r\nx" and edit.action == "removed"


# --------------------------------------------------------------------------- property


KEY_TYPES = ["ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "sk-ssh-ed25519@openssh.com"]
b64 = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", min_size=16, max_size=60)
quoted = st.text(alphabet=st.characters(blacklist_characters='"\\\n\r', blacklist_categories=("Cs",)),
                 max_size=20).map(lambda s: f'"{s}"')
option = st.one_of(st.sampled_from(["restrict", "no-pty", "no-agent-forwarding", "cert-authority"]),
                   st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["command", "from", "environment",
                                                                       "permitopen"]), quoted))
key_line = st.builds(
    lambda opts, typ, blob, comment, lead: lead + (",".join(opts) + " " if opts else "") + f"{typ} AAAA{blob}"
    + (f" {comment}" if comment else ""),
    st.lists(option, max_size=3), st.sampled_from(KEY_TYPES), b64,
    st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=20),
    st.sampled_from(["", " ", "\t", "  "]))
comment = st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)),
                  max_size=40).map(lambda s: "#" + s)
blank = st.sampled_from(["", " ", "\t", "   \t"])
noise = st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=40)
ours_variant = st.builds(lambda opts, c: (opts + " " if opts else "") + OURS + c,
                         st.sampled_from(["", "restrict", 'command="x"']), st.sampled_from(["", " old"]))


@st.composite
def key_files(draw, with_ours: bool) -> bytes:
    kinds = [key_line, comment, blank, noise] + ([ours_variant] if with_ours else [])
    lines = draw(st.lists(st.one_of(*kinds), max_size=12))
    out = b""
    for i, text in enumerate(lines):
        eol = draw(st.sampled_from([b"\n", b"\r\n"]))
        if i == len(lines) - 1 and draw(st.booleans()):
            eol = b""  # no trailing newline
        out += text.encode("utf-8") + eol
    return out


def _check_preserved(before: bytes, after: bytes) -> None:
    old, new = foreign_lines(before), foreign_lines(after)
    assert [c for c, _ in old] == [c for c, _ in new]
    for i, ((_, e_old), (_, e_new)) in enumerate(zip(old, new, strict=True)):
        # a last line that had no ending may gain the file's own ending (our line follows it); nothing else moves
        if not (e_old == b"" and i == len(old) - 1):
            assert e_old == e_new


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=key_files(with_ours=True))
def test_foreign_lines_survive_install_rerun_and_rotation(data):
    first = plan_install(data, LINE, KEY)
    _check_preserved(data, first.data)
    assert sum(1 for ln in split_lines(first.data) if line_identity(ln.content) == KEY) == 1
    assert LINE.encode() in [ln.content for ln in split_lines(first.data)]

    again = plan_install(first.data, LINE, KEY)
    assert again.data == first.data and again.action == "unchanged"

    rotated = plan_install(first.data, NEW_LINE, NEW_KEY, retire=(KEY,))
    _check_preserved(data, rotated.data)
    idents = [line_identity(ln.content) for ln in split_lines(rotated.data)]
    assert KEY not in idents and idents.count(NEW_KEY) == 1


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=key_files(with_ours=False))
def test_foreign_only_file_gets_our_line_appended_and_nothing_else(tmp_path, data):
    path = tmp_path / "authorized_keys"
    path.write_bytes(data)
    install_line(str(path), LINE, KEY)
    after = path.read_bytes()
    assert after.startswith(data)  # every original byte, in place
    install_line(str(path), NEW_LINE, NEW_KEY, retire=(KEY,))
    _check_preserved(data, path.read_bytes())
    remove_keys(str(path), (NEW_KEY,))
    rest = path.read_bytes()
    assert rest == data or (rest == data + rest[len(data):] and rest[len(data):] in (b"\n", b"\r\n"))


# --------------------------------------------------------------------------- files, modes, refusals


def test_install_creates_parent_0700_and_file_0600(tmp_path):
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    result = install_line(str(path), LINE, KEY)
    assert result.created_parent and result.action == "added"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == LINE + "\n"


def test_explicit_layout_parent_is_left_exactly_as_found(tmp_path):
    parent = tmp_path / "keys"
    parent.mkdir(mode=0o755)
    os.chmod(parent, 0o751)
    (parent / "authorized_keys").write_bytes(b"# theirs\n")
    os.chmod(parent / "authorized_keys", 0o644)
    before = {p.name for p in parent.iterdir()}, stat.S_IMODE(parent.stat().st_mode), parent.stat().st_uid
    install_line(str(parent / "authorized_keys"), LINE, KEY, mode=None, create_parent=False)
    after = {p.name for p in parent.iterdir()}, stat.S_IMODE(parent.stat().st_mode), parent.stat().st_uid
    assert before == after
    assert stat.S_IMODE((parent / "authorized_keys").stat().st_mode) == 0o644  # mode=None keeps it
    with pytest.raises(AuthorizedKeysError, match="does not exist"):
        install_line(str(tmp_path / "missing" / "authorized_keys"), LINE, KEY, create_parent=False)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("path", ["/etc/ssh/authorized_keys.d/op", "/etc/ssh/../ssh/x", "/etc/ssh"])
def test_paths_under_etc_ssh_are_refused_by_name(path):
    with pytest.raises(AuthorizedKeysError, match="/etc/ssh"):
        install_line(path, LINE, KEY)


def test_a_symlink_into_etc_ssh_is_refused_too(tmp_path):
    link = tmp_path / "sneaky"
    link.symlink_to("/etc/ssh/authorized_keys")
    with pytest.raises(AuthorizedKeysError, match="/etc/ssh"):
        install_line(str(link), LINE, KEY)


def test_permissions_are_reported_with_the_exact_chmod(tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    os.chmod(ssh, 0o775)
    keys = ssh / "authorized_keys"
    keys.write_text("")
    os.chmod(keys, 0o664)
    issues = {i.path: i for i in check_permissions(str(keys), uid=os.getuid(), manage_parent=True,
                                                   home=str(tmp_path))}
    assert issues[str(keys)].command == f"chmod 600 {keys}" and issues[str(keys)].blocking
    assert issues[str(ssh)].command == f"chmod 700 {ssh}" and issues[str(ssh)].blocking
    os.chmod(keys, 0o644)
    os.chmod(ssh, 0o755)
    soft = {i.path: i for i in check_permissions(str(keys), uid=os.getuid(), manage_parent=True)}
    assert not soft[str(keys)].blocking and soft[str(keys)].want == 0o600
    ak.fix_permissions(list(soft.values()))
    assert stat.S_IMODE(ssh.stat().st_mode) == 0o700


def test_a_file_owned_by_someone_else_is_unfixable(tmp_path):
    need_root_or_skip("gives a file to another uid")
    keys = tmp_path / "authorized_keys"
    keys.write_text("")
    os.chown(keys, 4242, 4242)
    issues = check_permissions(str(keys), uid=4343, manage_parent=False)
    assert issues and not issues[0].fixable and issues[0].blocking
    assert "owned by uid" in issues[0].problem


def test_a_symlinked_key_file_is_edited_through_the_link(tmp_path):
    real = tmp_path / "dotfiles" / "authorized_keys"
    real.parent.mkdir()
    real.write_bytes(b"# mine\n")
    link = tmp_path / "authorized_keys"
    link.symlink_to(real)
    install_line(str(link), LINE, KEY)
    assert link.is_symlink() and real.read_bytes() == b"# mine\n" + LINE.encode() + b"\n"


def test_not_a_regular_file_is_refused(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(AuthorizedKeysError, match="not a regular file"):
        install_line(str(tmp_path / "dir"), LINE, KEY)


# --------------------------------------------------------------------------- crashes


CHILD = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from fdl.hostside.farm import authorized_keys as ak
path, when, line = sys.argv[2], sys.argv[3], sys.argv[4]
key = ak.parse_public_key(line.split(" ", 1)[1])
if when == "mid-write":
    real = os.write
    def half(fd, data):
        real(fd, bytes(data[: len(data) // 2]))
        os.kill(os.getpid(), signal.SIGKILL)
    os.write = half
elif when == "enospc":
    def full(fd, data):
        raise OSError(28, "No space left on device")
    os.write = full
else:
    import functools
    from fdl.hostside import fsio
    def step(name):
        if name == when:
            os.kill(os.getpid(), signal.SIGKILL)
    # the rewrite goes through fdl.hostside.fsio.atomic_write; its step parameter is the seam that kills us mid-way
    ak.atomic_write = functools.partial(fsio.atomic_write, step=step)
ak.install_line(path, line, key)
"""


@pytest.mark.parametrize("when, expect", [
    ("created", "old"), ("mid-write", "old"), ("written", "old"), ("mode-set", "old"), ("synced", "old"),
    ("renamed", "new"), ("enospc", "old"),
])
def test_a_crash_during_the_rewrite_leaves_old_or_new_never_a_mix(tmp_path, when, expect):
    path = tmp_path / "authorized_keys"
    old = b"# operator's file\r\nssh-rsa AAAAB3NzaC1yc2E= mine\r\n" + b"# padding\n" * 2000
    path.write_bytes(old)
    line = 'restrict ' + OURS + " fdl-farm-lab"
    done = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(path), when, line], capture_output=True,
                          text=True, timeout=60)
    if when == "enospc":
        assert done.returncode == 1 and "No space left" in done.stderr
    else:
        assert done.returncode == -signal.SIGKILL
    new = plan_install(old, line, KEY).data
    assert path.read_bytes() == (old if expect == "old" else new)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "authorized_keys"]
    if when == "enospc":
        assert leftovers == []  # a failure that is not a crash cleans up its temp file
    else:
        assert all(name.endswith(".fdl-tmp") for name in leftovers)


def test_identity_str_hides_nothing_secret_and_is_short():
    assert isinstance(KeyIdentity("ssh-ed25519", "A" * 68).__str__(), str)
