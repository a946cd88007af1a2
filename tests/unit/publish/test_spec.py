"""Source specs: every documented spelling parses into its typed form; broken ones say why."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fdl.errors import ExitCode
from fdl.publish.spec import (
    FileSource,
    GitSource,
    RsyncSource,
    SourceSpecError,
    anonymize_url,
    parse_source_spec,
)


@pytest.mark.parametrize("spec, expected", [
    ("file:///home/op/my-train", FileSource(path="/home/op/my-train", spec="file:///home/op/my-train")),
    ("file:///srv/train/", FileSource(path="/srv/train", spec="file:///srv/train/")),
    ("rsync://ctrl:/tree", RsyncSource(host="ctrl", path="/tree", user=None, port=None, spec="rsync://ctrl:/tree")),
    ("rsync://op@10.0.0.1:2222:/home/op/run/tree",
     RsyncSource(host="10.0.0.1", path="/home/op/run/tree", user="op", port=2222,
                 spec="rsync://op@10.0.0.1:2222:/home/op/run/tree")),
    ("rsync://op@[fd00::1]:22:/tree",
     RsyncSource(host="fd00::1", path="/tree", user="op", port=22, spec="rsync://op@[fd00::1]:22:/tree")),
    ("git+https://github.com/me/train#v3",
     GitSource(url="https://github.com/me/train", ref="v3", spec="git+https://github.com/me/train#v3")),
    ("git+ssh://git@github.com/me/train#feature/wip",
     GitSource(url="ssh://git@github.com/me/train", ref="feature/wip",
               spec="git+ssh://github.com/me/train#feature/wip")),  # shown without userinfo, as git does
    ("git+file:///srv/mirror/train.git#0123abcd",
     GitSource(url="file:///srv/mirror/train.git", ref="0123abcd", spec="git+file:///srv/mirror/train.git#0123abcd")),
])
def test_every_documented_spelling_parses(spec: str, expected) -> None:
    assert parse_source_spec(spec) == expected


def test_rsync_remote_is_what_rsync_is_given() -> None:
    assert parse_source_spec("rsync://op@h:2222:/a/b").remote == "op@h:/a/b"
    assert parse_source_spec("rsync://[fd00::1]:/a").remote == "[fd00::1]:/a"


@pytest.mark.parametrize("spec, says", [
    ("", "empty"),
    ("/srv/train", "file:///srv/train"),
    ("srv/train", "names no transport"),
    ("file://srv/train", "three slashes"),
    ("file:///srv/../etc", "'..'"),
    ("smb://server/share", "unknown scheme"),
    ("https://github.com/me/train#v1", "git+https://"),
    ("rsync://ctrl", "':' before the path"),
    ("rsync://ctrl:tree", "absolute"),
    ("rsync://ctrl:2222/tree", "rsync://ctrl:2222:/tree"),
    ("rsync://ctrl:70000:/tree", "from 1 to 65535"),
    ("rsync://bad host:/tree", "not a host name"),
    ("rsync://-oProxyCommand=x:/tree", "not a host name"),
    ("rsync://9bad@ctrl:/tree", "not a login name"),
    ("git+https://github.com/me/train", "names no ref"),
    ("git+https://github.com/me/train#", "no ref"),
    ("git+https://github.com/me/train#--upload-pack=x", "not a git tag"),
    ("git+https://github.com/me/train#a..b", "not a git tag"),
    ("git+https://github.com#v1", "no repository path"),
    ("git+ftp://host/x#v1", "not a git transport"),
    ("git+file://relative/repo#v1", "absolute"),
    ("file:///srv/\x1b[31m", "control characters"),
])
def test_broken_specs_name_the_problem_and_the_forms(spec: str, says: str) -> None:
    with pytest.raises(SourceSpecError) as info:
        parse_source_spec(spec)
    err = info.value
    assert says in err.message
    assert "file:///abs/path" in (err.hint or "")
    assert err.exit_code == ExitCode.FAILURE


@given(st.text(max_size=200))
def test_any_text_parses_or_raises_a_spec_error(text: str) -> None:
    try:
        parsed = parse_source_spec(text)
    except SourceSpecError as exc:
        assert exc.message
        return
    assert parsed.kind in ("file", "rsync", "git")
    if parsed.kind in ("file", "rsync"):
        assert parsed.path.startswith("/") and ".." not in parsed.path.split("/")


# --------------------------------------------------------------------------- credentials in a URL


@pytest.mark.parametrize("spec, url, shown, username, password", [
    ("git+https://oauth2:s3cr%40t@git.example/o/r#main", "https://git.example/o/r", "git+https://git.example/o/r#main",
     "oauth2", "s3cr@t"),
    ("git+https://ghp_tokentoken@git.example:8443/o/r.git#v1", "https://git.example:8443/o/r.git",
     "git+https://git.example:8443/o/r.git#v1", "ghp_tokentoken", None),
    ("git+http://bob:p@ss@10.0.0.1/o/r#v1", "http://10.0.0.1/o/r", "git+http://10.0.0.1/o/r#v1", "bob", "p@ss"),
])
def test_a_git_urls_userinfo_is_taken_out_of_the_url_and_the_spec(spec, url, shown, username, password) -> None:
    """regression: the spec kept its userinfo, and the manifest's origin and the report carried it."""
    parsed = parse_source_spec(spec)
    assert isinstance(parsed, GitSource)
    assert (parsed.url, parsed.spec) == (url, shown)
    assert parsed.credentials is not None
    assert (parsed.credentials.username, parsed.credentials.password) == (username, password)
    assert username not in repr(parsed) and (password is None or password not in repr(parsed))


@pytest.mark.parametrize("spec, says", [
    ("git+https://oauth2:SECRETVALUE@git.example/o/r", "names no ref"),
    ("git+ssh://git:SECRETVALUE@git.example/o/r#v1", "never a password"),
    ("git+file://u:SECRETVALUE@/srv/r#v1", "takes no user or password"),
    ("git+https://u:SECRETVALUE%0a@git.example/o/r#v1", "control characters"),
    ("rsync://op:SECRETVALUE@ctrl:/tree", "never a password"),
    ("file://op:SECRETVALUE@ctrl/tree", "three slashes"),
    ("git+https://u:SECRETVALUE@git.example#v1", "no repository path"),
])
def test_errors_never_show_what_a_urls_userinfo_held(spec: str, says: str) -> None:
    with pytest.raises(SourceSpecError) as info:
        parse_source_spec(spec)
    assert says in info.value.message
    assert "SECRETVALUE" not in info.value.message + (info.value.hint or "")


@pytest.mark.parametrize("text, shown", [
    ("https://u:p@host/x", "https://host/x"),
    ("ssh://git@host/x", "ssh://host/x"),
    ("https://host/x@y", "https://host/x@y"),  # an '@' past the first '/' is no userinfo
    ("https://host?q=a@b", "https://host?q=a@b"),
    ("not a url", "not a url"),
])
def test_anonymize_url_drops_userinfo_as_git_does(text: str, shown: str) -> None:
    assert anonymize_url(text) == shown


@given(st.text(max_size=60), st.text(alphabet="abcdefghij:%@", min_size=1, max_size=20))
def test_no_parse_error_ever_echoes_a_password(location: str, password: str) -> None:
    secret = "PW" + password
    for scheme in ("git+https", "git+ssh", "git+file", "rsync", "file"):
        try:
            parse_source_spec(f"{scheme}://user:{secret}@{location}")
        except SourceSpecError as exc:
            assert secret not in exc.message + (exc.hint or "")
